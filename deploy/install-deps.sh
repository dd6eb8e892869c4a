#!/usr/bin/env bash
# Installs the Debian 12 packages gcmoe builds and tests with. Idempotent: does nothing when
# every package is already there. CUDA and NCCL come from the toolkit in /usr/local/cuda.
#   deploy/install-deps.sh [--build-only]   (--build-only: what the build needs, not the tests;
#                                            the container images' build stages)
set -euo pipefail

build_only=0
case "${1:-}" in
  --build-only) build_only=1 ;;
  "") ;;
  *) echo "install-deps: unknown argument $1 (expected --build-only)" >&2; exit 2 ;;
esac

packages=(
  build-essential cmake ninja-build pkg-config
  # gRPC's CMake config needs these four together.
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libspdlog-dev nlohmann-json3-dev libglpk-dev
  # The /metrics endpoint (server/metrics.cc) serves through prometheus-cpp's pull exposer.
  prometheus-cpp-dev
  # Certificate checks before TLS (server/tls_credentials.cc); HMAC-SHA256 of the rank attach
  # proof (server/attach_secret.cc).
  libssl-dev
)
test_packages=(
  libgtest-dev libgmock-dev libbenchmark-dev
  # The fuzz targets (.ci/fuzz): clang with libFuzzer and its sanitizer runtimes.
  clang libclang-rt-14-dev
  # The Python client and its tests run on Debian's interpreter, /usr/bin/python3.
  python3 python3-grpcio python3-protobuf python3-numpy python3-venv python3-pip
  # The Go client builds offline against Debian's packaged Go sources (/usr/share/gocode).
  # grpc-go's codec goes through github.com/golang/protobuf: 1.5 (1.3 predates the generated
  # APIv2 messages of protoc-gen-go).
  golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev
  protoc-gen-go protoc-gen-go-grpc
  # Operations tests: a real Prometheus scrapes `gcmoe serve`, openssl makes a test CA,
  # systemd-analyze verifies the units, python3-yaml parses the Kubernetes manifests.
  prometheus openssl systemd python3-yaml
)
[ "$build_only" -eq 1 ] || packages+=("${test_packages[@]}")

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
