#!/usr/bin/env bash
# Prints the packages that hold the shared libraries a binary links directly (its ELF NEEDED
# entries), one per line, for a runtime image to install:
#   deploy/runtime-packages.sh build/gcmoe
# Package names differ between releases (Debian 12's libgrpc++1.51 is Ubuntu 24.04's
# libgrpc++1.51t64), so the CUDA image reads them from its build stage's own package database.
# A library no package holds (CUDA's and NCCL's from /usr/local/cuda, or the base image's) is
# named on stderr and skipped.
set -euo pipefail
binary=${1:?usage: runtime-packages.sh BINARY}
declare -A path_of
while read -r name _ path _; do
  [ -n "${path:-}" ] && path_of[$name]=$path
done < <(ldd "$binary" | grep '=> /')
needed_libs=$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
# With merged /usr, the loader's path and the package's may differ by /usr: ask for each form,
# in one dpkg query (each query reads the whole file database).
candidates=()
# The dynamic loader (named NEEDED when a library asks for it, e.g. CUDA's runtime) is glibc's,
# in every base image: ldd shows it without a path.
needed_libs=$(printf '%s\n' $needed_libs | grep -v '^ld-linux')
for needed in $needed_libs; do
  path=${path_of[$needed]:-}
  if [ -z "$path" ]; then
    echo "runtime-packages: $needed: not found by ldd" >&2
    exit 1
  fi
  real=$(readlink -f "$path")
  candidates+=("$path" "/usr$path" "$real" "/usr$real")
done
declare -A owner_of
while IFS= read -r line; do
  owner_of[${line#*: }]=${line%%:*}
done < <(dpkg -S "${candidates[@]}" 2>/dev/null || true)
packages=()
for needed in $needed_libs; do
  path=${path_of[$needed]}
  real=$(readlink -f "$path")
  owner=""
  for candidate in "$path" "/usr$path" "$real" "/usr$real"; do
    owner=${owner_of[$candidate]:-}
    [ -n "$owner" ] && break
  done
  if [ -z "$owner" ]; then
    echo "runtime-packages: $needed ($path) belongs to no package; skipped" >&2
    continue
  fi
  packages+=("$owner")
done
printf '%s\n' "${packages[@]}" | sort -u
