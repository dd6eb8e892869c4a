#!/usr/bin/env bash
# Developer entry point: installs the Debian packages, builds, then serves or tests.
#   ./run.sh serve [gcmoe serve flags...]   build and start the service on the embedded default
#   ./run.sh test  [ctest flags...]         build and run the whole test suite
#   ./run.sh build                          build only
# BUILD_DIR (default build) and JOBS (default: all cores) change where and how wide it builds.
set -euo pipefail
cd "$(dirname "$0")"

cmd=${1:-}
[ -n "$cmd" ] && shift
build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}

build() {
  ./deploy/install-deps.sh
  if [ ! -f "$build_dir/CMakeCache.txt" ]; then
    cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
  fi
  cmake --build "$build_dir" -j "$jobs"
}

case "$cmd" in
  serve)
    build
    exec "$build_dir/gcmoe" serve "$@"
    ;;
  test)
    build
    exec ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" "$@"
    ;;
  build)
    build
    ;;
  *)
    echo "usage: ./run.sh serve|test|build [args...]" >&2
    exit 2
    ;;
esac
