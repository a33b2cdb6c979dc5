"""The resources files of the heterogeneous benches (docs/resources.md): two
device types, a normal one and one emulated SLOWDOWN times slower, with
COUNT devices of each on this host."""


def write_two_types(path, slowdown, counts=(1, 1), memory_mib=(8192, 8192), names=("normal", "slow")):
    """Writes the file: types names[0] (slowdown 1) and names[1] (`slowdown`),
    `memory_mib` each, counts[0] and counts[1] local devices of them."""
    (fast, slow), (nf, ns), (mf, ms) = names, counts, memory_mib
    with open(path, "w") as f:
        f.write(f"[types.{fast}]\nmemory_mib = {mf}\n[types.{slow}]\nmemory_mib = {ms}\nslowdown = {slowdown}\n"
                f"[[devices]]\ntype = \"{fast}\"\ncount = {nf}\n[[devices]]\ntype = \"{slow}\"\ncount = {ns}\n")
    return path
