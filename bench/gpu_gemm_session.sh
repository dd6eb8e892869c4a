#!/usr/bin/env bash
# One device call for the role2 work (docs/PERFORMANCE.md, "GPU layer"): correctness first
# (SASS facts, every GPU test with the default role2; the wgmma variant on the tests it misses),
# then the tables, the variants, the peers, the ablations, ncu and compute-sanitizer.
# Logs under $LOGS, packed into $OUT/logs.tgz at the end.
#   bench/gpu_gemm_session.sh [STAGES after ctest]   (default: bench variants peer ablate)
set -u
LOGS=${LOGS:-/tmp/gcmoe-logs}
mkdir -p "$LOGS"
export GCMOE_CUDA_WAIT_TIMEOUT_MS=${GCMOE_CUDA_WAIT_TIMEOUT_MS:-3000}
LATER=${*:-"bench variants peer ablate ncu sanitizer"}
OUT="$LOGS" timeout 200 bash bench/gpu_checks.sh sass ctest > "$LOGS/correctness.txt" 2>&1
# The wgmma variant of the same pipeline: its accuracy where it misses (and the slices).
GCMOE_CUDA_GEMM=wgmma LD_LIBRARY_PATH=".device/lib:${LD_LIBRARY_PATH:-}" timeout 120 \
  .device/bin/kernels_gpu_test \
  --gtest_filter='CudaBackendReplay.*:CudaBackendSlices.*:CudaBackendTest.RoutingPatternsMatchCpu' \
  > "$LOGS/ctest-wgmma.txt" 2>&1
echo "wgmma variant: rc $? $(grep -E 'PASSED|FAILED|actual' "$LOGS/ctest-wgmma.txt" | tr '\n' ' ')"
GEMM=${GCMOE_CUDA_GEMM:-stream}
grep -q "100% tests passed" "$LOGS/ctest.log" ||
  grep -E "Failed|\*\*\*|timed out" "$LOGS/ctest.log" | head -30
echo "==== role2 for the tables: $GEMM"
GCMOE_CUDA_GEMM=$GEMM OUT="$LOGS" timeout "${LATER_TIMEOUT:-330}" bash bench/gpu_checks.sh $LATER \
  > "$LOGS/tables.txt" 2>&1
[[ -n "${OUT:-}" ]] && tar czf "$OUT/logs.tgz" -C "$LOGS" .
grep -E "GMMA|tests passed|Total Test|calc_diff|worst" "$LOGS/correctness.txt" | head -60
cat "$LOGS"/*.rows 2>/dev/null
grep -v "^T = \|^device\|^loading\|^loaded\|^\$ gcmoe\|^GPU split" "$LOGS/tables.txt" | tail -170
