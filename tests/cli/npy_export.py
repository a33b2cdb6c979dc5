"""Writes Fashion-MNIST's IDX files as NumPy .npy files, without numpy.

Usage: npy_export.py IDX_DIR OUT_DIR. Writes {train,test}_{x,y}.npy: images
uint8 (N, 28, 28), labels int64 (N,). The header is the one numpy.save
writes (format 1.0, dict padded with spaces to a 64-byte boundary, '\n').
"""
import gzip
import os
import struct
import sys


def write_npy(path, descr, shape, payload):
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    head = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    pad = 64 - (10 + len(head) + 1) % 64
    head = head + " " * (pad % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode("latin1"))
        f.write(payload)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return shape, data[4 + 4 * ndim:]


def main():
    src, out = sys.argv[1], sys.argv[2]
    for split, prefix in (("train", "train"), ("test", "t10k")):
        shape, pixels = read_idx(os.path.join(src, prefix + "-images-idx3-ubyte.gz"))
        write_npy(os.path.join(out, split + "_x.npy"), "|u1", shape, pixels)
        shape, labels = read_idx(os.path.join(src, prefix + "-labels-idx1-ubyte.gz"))
        write_npy(os.path.join(out, split + "_y.npy"), "<i8", shape,
                  struct.pack("<%dq" % len(labels), *labels))


if __name__ == "__main__":
    main()
