#!/usr/bin/env bash
# Peak RSS at V = 1, 4, 16, 64 virtual nodes of a fixed VN size (16 samples):
# the global batch grows with V, the gradient buffer must not. CNN on
# Fashion-MNIST, 3 steps, one process each.
#   bash bench/memory.sh [build/morph]
set -euo pipefail
MORPH=${1:-$(dirname "$0")/../build/morph}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf "%4s %8s %14s\n" V global peak_rss_MiB
for v in 1 4 16 64; do
  "$MORPH" run "$(dirname "$0")/../examples/fmnist-cnn.toml" --quiet --steps 3 --out "$work/m$v" \
    --set batch.global=$((16 * v)) --set batch.virtual_nodes=$v --set eval.batch=100 > /dev/null
  rss=$(sed -n 's/.*"peak_rss_bytes": \([0-9]*\).*/\1/p' "$work/m$v/summary.json")
  awk -v v="$v" -v g=$((16 * v)) -v r="$rss" 'BEGIN { printf "%4d %8d %14.1f\n", v, g, r / 1048576 }'
done
