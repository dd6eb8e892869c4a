#!/usr/bin/env bash
# Installs a built gcmoe on this host: the binary, a config, the rank attach secret, the systemd
# units, a system user, the API's .proto files (/usr/local/share/gcmoe/proto) and the Python
# client package (for Debian's /usr/bin/python3, under /usr/local/lib/python3.X/dist-packages).
#   deploy/install.sh [--build-dir build] [--config config/examples/tiny-cpu.json] [--prefix /]
# Run ./run.sh build first. With --prefix DIR it installs under DIR (for packaging or a dry run)
# and touches neither users nor systemd.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
config=config/examples/tiny-cpu.json
prefix=/
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

binary="$build_dir/gcmoe"
[ -x "$binary" ] || { echo "install.sh: $binary not found; run ./run.sh build first" >&2; exit 1; }
"$binary" config validate "$config"

install -D -m 0755 "$binary" "$prefix/usr/local/bin/gcmoe"
install -d -m 0755 "$prefix/etc/gcmoe"
if [ -e "$prefix/etc/gcmoe/gcmoe.json" ]; then
  echo "install.sh: keeping the existing $prefix/etc/gcmoe/gcmoe.json"
else
  # The split units (gcmoe-coordinator + gcmoe-rank@N) start ranks apart from the coordinator,
  # and they have only the config: a fixed rank port to dial and the attach secret to prove.
  # `gcmoe serve` works with either.
  sets=()
  effective=$("$binary" config show --config "$config")
  if grep -q '"rank_listen": ".*:0"' <<<"$effective"; then
    sets+=(--set server.rank_listen=127.0.0.1:50052)
  fi
  if grep -q '"rank_secret_file": ""' <<<"$effective"; then
    sets+=(--set server.rank_secret_file=/etc/gcmoe/rank.secret)
  fi
  "$binary" config show --config "$config" "${sets[@]}" > "$prefix/etc/gcmoe/gcmoe.json"
  chmod 0644 "$prefix/etc/gcmoe/gcmoe.json"
  [ ${#sets[@]} -eq 0 ] ||
    echo "install.sh: $prefix/etc/gcmoe/gcmoe.json: ${sets[*]}"
fi
# The rank attach secret: 32 random bytes, readable by the service's user alone. One per host
# installed (a package built with --prefix should make it at install time instead).
if [ ! -e "$prefix/etc/gcmoe/rank.secret" ]; then
  (umask 077 && head -c 32 /dev/urandom | base64 > "$prefix/etc/gcmoe/rank.secret")
  echo "install.sh: $prefix/etc/gcmoe/rank.secret: a new rank attach secret"
fi
"$binary" config validate --split "$prefix/etc/gcmoe/gcmoe.json" >/dev/null ||
  echo "install.sh: gcmoe.service can run this config; the split units cannot (above)" >&2
for unit in deploy/systemd/*.service; do
  install -D -m 0644 "$unit" "$prefix/etc/systemd/system/$(basename "$unit")"
done
install -D -m 0644 README.md "$prefix/usr/local/share/doc/gcmoe/README.md"
# The public protos, for clients generated in any language.
for proto in gcmoe/v1/moe.proto inference/grpc_predict_v2.proto; do
  install -D -m 0644 "proto/$proto" "$prefix/usr/local/share/gcmoe/proto/$proto"
done
# The Python package, built offline from clients/python (its stubs come from proto/). Debian's
# pip asks for --break-system-packages for any install outside a virtual environment; with
# --root it writes only under /usr/local, which Debian's python3 reads and apt never touches.
/usr/bin/python3 -m pip install --quiet --no-deps --no-index --no-cache-dir \
  --break-system-packages --root-user-action=ignore --root "$prefix" ./clients/python

if [ "$prefix" = "/" ]; then
  if ! id gcmoe >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin gcmoe
  fi
  chown gcmoe:gcmoe /etc/gcmoe/rank.secret
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    echo "install.sh: installed. Start with: systemctl enable --now gcmoe"
  else
    echo "install.sh: installed (no running systemd here: start with gcmoe serve --config /etc/gcmoe/gcmoe.json)"
  fi
else
  echo "install.sh: installed under $prefix"
fi
