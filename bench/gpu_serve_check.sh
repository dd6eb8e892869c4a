#!/usr/bin/env bash
# `gcmoe serve` with a CUDA config answers Forward calls, with outputs equal to the CPU
# backend's: the same request (seeded) against CUDA services and a CPU service. Run on the GPU
# machine:
#
#   GCMOE=path/to/gcmoe [RANKS=P] bash bench/gpu_serve_check.sh
#
# RANKS=1 (default): one CUDA rank against the CPU backend, calc_diff < 1e-4 and no NaN.
# RANKS=P > 1 (P GPUs): also P CUDA ranks, one process per GPU, with the fused exchange and
# with the NCCL baseline, each with the balancer off and on: every one bit-identical to the
# single-GPU service, and so within calc_diff of the CPU backend.
#
# Every service's /metrics is saved: CUDA ranks must export gcmoe_gpu_memory_used_bytes (within
# gcmoe_gpu_memory_total_bytes), a CPU service must not.
#
# Model: the embedded tiny model (H 256, I 128, 16 experts, top-4, shared expert).
set -u
GCMOE=${GCMOE:-build-cuda/gcmoe}
OUT=${OUT:-/tmp/gcmoe-serve-check}
RANKS=${RANKS:-1}
mkdir -p "$OUT"
PORT=${PORT:-50171}
export NCCL_NVLS_ENABLE=0

serve_and_ask() {  # name, output file, --set overrides...
  local name=$1 save=$2 addr_file="$OUT/addr-$1"
  shift 2
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  rm -f "$addr_file"
  "$GCMOE" serve "${sets[@]}" --set server.metrics_listen=127.0.0.1:0 \
    --listen "127.0.0.1:$PORT" --address-file "$addr_file" \
    > "$OUT/serve-$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 120); do [[ -s $addr_file ]] && break; sleep 0.5; done
  if [[ ! -s $addr_file ]]; then
    echo "serve ($name) did not come up"; tail -20 "$OUT/serve-$name.log"; kill "$pid"; return 1
  fi
  "$GCMOE" client health --addr "127.0.0.1:$PORT"
  "$GCMOE" client forward --addr "127.0.0.1:$PORT" --tokens 64 --seed 7 --requests 4 \
    --warmup 1 --save "$save"
  local rc=$?
  "$GCMOE" client stats --addr "127.0.0.1:$PORT" > "$OUT/stats-$name.txt" 2>&1
  python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(
      "http://" + sys.argv[1] + "/metrics", timeout=10).read().decode())' \
    "$(sed -n 2p "$addr_file")" > "$OUT/metrics-$name.txt" 2>&1 || rc=1
  kill -TERM "$pid"; wait "$pid"
  PORT=$((PORT + 1))
  return $rc
}

names=(cuda1 cpu)
serve_and_ask cuda1 "$OUT/forward-cuda1.npy" engine.backend=cuda parallel.ranks=1 ||
  { echo "FAIL: cuda service"; exit 1; }
serve_and_ask cpu "$OUT/forward-cpu.npy" engine.backend=cpu parallel.ranks=1 ||
  { echo "FAIL: cpu service"; exit 1; }
if (( RANKS > 1 )); then
  for exchange in gcmoe nccl; do
    for balancer in false true; do
      name="cuda$RANKS-$exchange$([[ $balancer == true ]] && echo +relief)"
      serve_and_ask "$name" "$OUT/forward-$name.npy" engine.backend=cuda parallel.ranks="$RANKS" \
        engine.exchange="$exchange" balancer.enabled="$balancer" balancer.replicas_per_rank=2 ||
        { echo "FAIL: $name service"; tail -30 "$OUT/serve-$name.log"; exit 1; }
      names+=("$name")
    done
  done
fi
python3 - "$OUT" "${names[@]}" <<'PY'
import sys
import numpy as np
out, names = sys.argv[1], sys.argv[2:]
load = lambda n: np.load(f"{out}/forward-{n}.npy")
one, cpu = load("cuda1"), load("cpu")
g, c = one.astype(np.float64), cpu.astype(np.float64)
assert g.shape == c.shape, (g.shape, c.shape)
diff = 1 - 2 * (g * c).sum() / (g * g + c * c).sum()
ok = diff < 1e-4 and np.isfinite(g).all() and (c * c).sum() > 0
print(f"serve cuda (1 GPU) vs cpu: shape {g.shape}, calc_diff {diff:.3e}, finite {np.isfinite(g).all()}")
for n in names[2:]:
    same = load(n).tobytes() == one.tobytes()
    ok = ok and same
    print(f"serve {n} vs cuda (1 GPU): {'bit-identical' if same else 'DIFFERENT'}")
def memory(name):  # {series labels: value} of the GPU memory gauges
    rows = {}
    for line in open(f"{out}/metrics-{name}.txt"):
        if line.startswith("gcmoe_gpu_memory_"):
            series, value = line.rsplit(" ", 1)
            rows[series] = float(value)
    return rows
for n in names:
    rows = memory(n)
    used = {k: v for k, v in rows.items() if k.startswith("gcmoe_gpu_memory_used_bytes")}
    total = {k: v for k, v in rows.items() if k.startswith("gcmoe_gpu_memory_total_bytes")}
    if n == "cpu":
        good = not rows
    else:
        pair = lambda k: k.replace("_used_bytes", "_total_bytes")
        good = len(used) == len(total) >= 1 and all(
            pair(k) in total and 0 < u <= total[pair(k)] for k, u in used.items())
    ok = ok and good
    print(f"metrics {n}: {'ok' if good else 'WRONG'} {rows if rows else 'no GPU memory series'}")
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
