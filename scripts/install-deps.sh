#!/usr/bin/env bash
# Installs what Morph needs to build, test and run its demo on Debian 12 (as root).
set -euo pipefail
packages=(
  build-essential cmake pkg-config ccache
  libtorch-dev libgloo-dev libopenblas0-openmp
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libxxhash-dev zlib1g-dev libssl-dev
  libgtest-dev libcpp-httplib-dev
  dataset-fashion-mnist fortunes
  iproute2 procps
  python3 python3-torch python3-torchvision curl chromium
  clang libclang-rt-14-dev
  slurmctld slurmd slurm-client munge
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
