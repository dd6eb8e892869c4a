#!/usr/bin/env bash
# Seconds from SIGTERM to exit for an idle `gcmoe serve` and each of its rank processes, and
# whether any rank was restarted or refused on the way out.
#   bench/shutdown_time.sh build/gcmoe [RUNS] [serve flags...]
set -euo pipefail
gcmoe=${1:?usage: bench/shutdown_time.sh GCMOE [RUNS] [serve flags...]}
runs=${2:-3}
shift $(( $# >= 2 ? 2 : 1 ))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }
for run in $(seq 1 "$runs"); do
  rm -f "$work/address"
  "$gcmoe" serve --listen 127.0.0.1:0 --address-file "$work/address" "$@" > "$work/serve.log" 2>&1 &
  serve=$!
  for _ in $(seq 1 600); do [ -s "$work/address" ] && break; sleep 0.1; done
  [ -s "$work/address" ] || { echo "serve did not start:"; cat "$work/serve.log"; exit 1; }
  sleep 0.5
  ranks=$(pgrep -P "$serve" | tr '\n' ' ')
  declare -A gone=()
  t0=$(now)
  kill -TERM "$serve"
  while kill -0 "$serve" 2>/dev/null; do
    for r in $ranks; do
      if [ -z "${gone[$r]:-}" ] && ! kill -0 "$r" 2>/dev/null; then
        gone[$r]=$(echo "$(now) - $t0" | bc)
      fi
    done
    sleep 0.005
  done
  code=0
  wait "$serve" || code=$?
  total=$(echo "$(now) - $t0" | bc)
  restarts=$(grep -c "again (restart" "$work/serve.log" || true)
  refusals=$(grep -c "refusing rank" "$work/serve.log" || true)
  printf 'run %d: serve exit %d after %.3f s; ranks gone after' "$run" "$code" "$total"
  for r in $ranks; do printf ' %.3f' "${gone[$r]:-$total}"; done
  printf ' s; restarts %s, refusals %s\n' "$restarts" "$refusals"
  unset gone
done
