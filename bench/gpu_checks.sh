#!/usr/bin/env bash
# Every GPU check of the CUDA backend, run on the GPU machine from a bundle that
# /work/shared/tools/device-bundle made of build-cuda/gcmoe and build-cuda/tests/kernels/*:
#
#   bench/gpu_checks.sh [STAGE...]     stages: sass ctest sanitizer bench peer serve (default all)
#
# Environment: BUNDLE (default .device), OUT (logs; default /tmp/gcmoe-gpu-checks).
# Logs go to $OUT; a summary table is printed last.
set -u
BUNDLE=${BUNDLE:-.device}
OUT=${OUT:-/tmp/gcmoe-gpu-checks}
mkdir -p "$OUT"
BUNDLE=$(cd "$BUNDLE" && pwd)
REPO=$(pwd)
export LD_LIBRARY_PATH="$BUNDLE/lib:${LD_LIBRARY_PATH:-}"
export CUDA_MODULE_LOADING=EAGER
export NCCL_NVLS_ENABLE=0
GPU_TEST="$BUNDLE/bin/kernels_gpu_test"
GCMOE="$BUNDLE/bin/gcmoe"
STAGES=${*:-"sass ctest sanitizer bench peer serve"}
SUMMARY=()
note() { SUMMARY+=("$(printf '%-10s %-6s %s' "$1" "$2" "$3")"); }
has() { [[ " $STAGES " == *" $1 "* ]]; }

{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.mem --format=csv; } \
  > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

if has sass; then
  cuobjdump --dump-sass "$GPU_TEST" > /tmp/gcmoe-sass.txt 2>&1
  mma=$(grep -oE '\b(HMMA|QMMA|HGMMA|QGMMA|IMMA)[A-Z0-9._]*' /tmp/gcmoe-sass.txt | sort | uniq -c | tr '\n' ' ')
  note sass ok "${mma:-no MMA instructions found}"
fi

if has ctest; then
  # A ctest tree over the bundled binary: one test per gtest case, label gpu.
  CT=/tmp/gcmoe-ctest; rm -rf "$CT"; mkdir -p "$CT"; : > "$CT/CTestTestfile.cmake"
  # Quick diagnostics first (partitions, small cases), the full-size slices last.
  "$GPU_TEST" --gtest_list_tests | awk '/^[^ ]/{suite=$1} /^  /{print suite $1}' |
  awk '{k = /^GreenContext/ ? 0 : /^CudaBackendTest/ ? 1 : /^CudaBackendReplay/ ? 2 : 3; print k, $0}' |
  sort -s -k1,1n | cut -d' ' -f2 |
  while read -r name; do
    printf 'add_test([=[%s]=] "%s" "--gtest_filter=%s")\n' "$name" "$GPU_TEST" "$name"
    printf 'set_tests_properties([=[%s]=] PROPERTIES LABELS "gpu" TIMEOUT 600)\n' "$name"
  done >> "$CT/CTestTestfile.cmake"
  (cd "$CT" && timeout 540 ctest -L gpu --output-on-failure -V) > "$OUT/ctest.log" 2>&1
  rc=$?
  grep -E "tests passed|Total Test time|\*\*\*|Failed|calc_diff|request|role1 on|1000 steps" "$OUT/ctest.log" | tail -60
  note ctest "$rc" "$(grep -E 'tests passed' "$OUT/ctest.log" | tail -1)"
fi

if has sanitizer; then
  : > "$OUT/sanitizer.log"
  for tool in memcheck racecheck; do
    GCMOE_CUDA_SEQUENTIAL=1 GCMOE_CUDA_WAIT_TIMEOUT_MS=120000 timeout 240 compute-sanitizer \
      --tool "$tool" --error-exitcode 9 "$GPU_TEST" --gtest_filter=CudaBackendTest.SanitizerCase \
      > /tmp/gcmoe-sanitizer-$tool.log 2>&1
    rc=$?
    cat /tmp/gcmoe-sanitizer-$tool.log >> "$OUT/sanitizer.log"
    tail -4 /tmp/gcmoe-sanitizer-$tool.log
    note "$tool" "$rc" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/gcmoe-sanitizer-$tool.log | tail -1)"
  done
fi

# Our harness: both slices routed-only (the example configs), then with a shared expert
# (I_s = I). JSON for the peers' ratio tables goes to /tmp/gcmoe-bench-*.json.
if has bench; then
  : > "$OUT/bench.txt"
  for run in "glm-5.2-ep8-rank -1" "deepseek-v4.1-flash-ep8-rank -1" \
             "glm-5.2-ep8-rank 2048" "deepseek-v4.1-flash-ep8-rank 2304"; do
    set -- $run
    tag=$1; [[ $2 != -1 ]] && tag="$1-shared"
    echo "\$ gcmoe bench layer --config config/examples/$1.json --shared-intermediate $2" >> "$OUT/bench.txt"
    timeout 240 "$GCMOE" bench layer --config "config/examples/$1.json" --shared-intermediate "$2" \
      --tokens-per-rank 1,2,4,8,16,32,64,128,256 --json "/tmp/gcmoe-bench-$tag.json" \
      >> "$OUT/bench.txt" 2>> "$OUT/bench.txt"
    note bench $? "$tag"
  done
  cat "$OUT/bench.txt" | grep -v "^T = "
fi

if has peer; then
  : > "$OUT/peer.txt"
  python3 bench/torch_peer.py --hidden 6144 --intermediate 2048 --experts 32 --top-k 8 \
    --label glm-5.2 --ours /tmp/gcmoe-bench-glm-5.2-ep8-rank.json >> "$OUT/peer.txt" 2>&1
  note peer-glm $? ""
  python3 bench/torch_peer.py --hidden 5120 --intermediate 2304 --experts 48 --top-k 6 \
    --label deepseek-v4.1-flash --ours /tmp/gcmoe-bench-deepseek-v4.1-flash-ep8-rank.json \
    >> "$OUT/peer.txt" 2>&1
  note peer-ds $? ""
  grep -v "^T=" "$OUT/peer.txt"
fi

if has serve; then
  GCMOE="$GCMOE" OUT="$OUT" timeout 240 bash bench/gpu_serve_check.sh > "$OUT/serve.log" 2>&1
  rc=$?
  tail -6 "$OUT/serve.log"
  note serve "$rc" "$(tail -1 "$OUT/serve.log")"
fi

echo "==== summary ($(date -u +%F))"
printf '%s\n' "${SUMMARY[@]}"
