#!/usr/bin/env bash
# Installs the Debian 12 packages gcmoe builds and tests with. Idempotent: does nothing when
# every package is already there. CUDA and NCCL come from the toolkit in /usr/local/cuda.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  # gRPC's CMake config needs these four together.
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libspdlog-dev nlohmann-json3-dev libglpk-dev
  # HMAC-SHA256 for the rank attach proof.
  libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # The Python client and its tests run on Debian's interpreter, /usr/bin/python3.
  python3 python3-grpcio python3-protobuf python3-numpy
)

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root (or: sudo $0)" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
