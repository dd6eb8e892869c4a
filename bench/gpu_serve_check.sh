#!/usr/bin/env bash
# `gcmoe serve` with a CUDA config answers Forward calls, with outputs equal to the CPU
# backend's: the same request (seeded) against a CUDA service and a CPU service, compared with
# calc_diff < 1e-4 and no NaN. Run on the GPU machine:
#
#   GCMOE=path/to/gcmoe bash bench/gpu_serve_check.sh
#
# Model: the embedded tiny model (H 256, I 128, 16 experts, top-4, shared expert), one rank.
set -u
GCMOE=${GCMOE:-build-cuda/gcmoe}
OUT=${OUT:-/tmp/gcmoe-serve-check}
mkdir -p "$OUT"
PORT=${PORT:-50171}

serve_and_ask() {  # backend, output file
  local backend=$1 save=$2 addr_file="$OUT/addr-$1"
  rm -f "$addr_file"
  "$GCMOE" serve --set engine.backend="$backend" --set parallel.ranks=1 \
    --listen "127.0.0.1:$PORT" --address-file "$addr_file" > "$OUT/serve-$backend.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 120); do [[ -s $addr_file ]] && break; sleep 0.5; done
  if [[ ! -s $addr_file ]]; then
    echo "serve ($backend) did not come up"; tail -20 "$OUT/serve-$backend.log"; kill "$pid"; return 1
  fi
  "$GCMOE" client health --addr "127.0.0.1:$PORT"
  "$GCMOE" client forward --addr "127.0.0.1:$PORT" --tokens 64 --seed 7 --requests 4 \
    --warmup 1 --save "$save"
  local rc=$?
  kill -TERM "$pid"; wait "$pid"
  return $rc
}

serve_and_ask cuda "$OUT/forward-cuda.npy" || { echo "FAIL: cuda service"; exit 1; }
PORT=$((PORT + 1)) serve_and_ask cpu "$OUT/forward-cpu.npy" || { echo "FAIL: cpu service"; exit 1; }
python3 - "$OUT/forward-cuda.npy" "$OUT/forward-cpu.npy" <<'PY'
import sys
import numpy as np
gpu, cpu = (np.load(p).astype(np.float64) for p in sys.argv[1:3])
assert gpu.shape == cpu.shape, (gpu.shape, cpu.shape)
diff = 1 - 2 * (gpu * cpu).sum() / (gpu * gpu + cpu * cpu).sum()
finite = np.isfinite(gpu).all()
print(f"serve cuda vs cpu: shape {gpu.shape}, calc_diff {diff:.3e}, finite {finite}")
print("PASS" if diff < 1e-4 and finite and (cpu * cpu).sum() > 0 else "FAIL")
sys.exit(0 if diff < 1e-4 and finite else 1)
PY
