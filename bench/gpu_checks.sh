#!/usr/bin/env bash
# Every GPU check of the CUDA backend, run on the GPU machine from a bundle of build/gcmoe and
# build/tests/kernels/* (kernels_gpu_test; kernels_device_lost_test joins the ctest stage when
# bundled) with the shared libraries they need (BUNDLE/bin, BUNDLE/lib; the serve stage's
# checkpoint families also want the Python stubs in BUNDLE/stubs):
#
#   bench/gpu_checks.sh [STAGE...]     stages: sass ctest sanitizer bench peer serve ablate ab
#                                      ncu source roles servebench multi ep race trace
#                                      (default: the first six)
#
# ab times this bundle's gcmoe against another build of it in the same call (AB_BASELINE: its
# path, e.g. a second binary bundled as gcmoe-base), both slices, the two alternating AB_ROUNDS
# times (default 2; at sustained clocks rounds spread more, up to 7 %), and
# prints each T's medians and their ratio: how a change is measured (DESIGN.md §7). With
# SETTLE_MS > 0 and NVML on the machine it also prints each build's energy per step, which bounds
# the time at sustained clocks. AB_BASE_FLAGS and AB_THIS_FLAGS add `bench layer` flags to one
# side (e.g. AB_THIS_FLAGS="--no-merge-tails", or the same binary on both sides with different
# flags); AB_MORE lists more builds' paths to alternate with the two (each against the baseline).
#
# multi, ep, race and trace need two or more GPUs: multi runs the multi-GPU test and the
# multi-rank serve check, ep `gcmoe bench ep` on every GPU (EP_CONFIG, default the GLM-5.2
# layer), race the stress that once found two-rank wrong outputs (docs/DESIGN-NOTES.md): roles
# overlapped or in sequence (engine.cuda.overlap_roles), every step repeated RACE_REPEAT times
# (default 150) and every output compared with the step's first and, at small T, with the CPU
# backend; trace logs role2's task timeline (engine.cuda.trace_role2) at T = 1 and 16.
#
# Environment: BUNDLE (default .device), OUT (logs; default /tmp/gcmoe-gpu-checks), TOKENS
# (bench), SETTLE_MS (untimed replays before each row's, in every timing stage and the peer;
# default 500, so that both harnesses are timed at the clocks the GPU sustains under load: the H200
# caps its power after about 40 ms of our replays and its SM clock drops from 1980 to 1600-1900
# MHz; 0 times from a cool start).
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
TOKENS=${TOKENS:-1,2,4,8,16,32,64,128,256}
SETTLE_MS=${SETTLE_MS:-500}
EP_CONFIG=${EP_CONFIG:-config/examples/glm-5.2-ep8.json}  # the whole layer, for ep race trace
SUMMARY=()
note() { SUMMARY+=("$(printf '%-10s %-6s %s' "$1" "$2" "$3")"); }
has() { [[ " $STAGES " == *" $1 "* ]]; }
# The awk pattern of a `bench layer` time row (11 fields, T first). The board power table that
# follows it can hold an 11-field note, so parsing stops at its header.
TIME_ROW='/^board power/ {exit} $1 ~ /^[0-9]+$/ && NF == 11'

{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.mem --format=csv; } \
  > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

if has sass; then
  cuobjdump --dump-sass "$GPU_TEST" > /tmp/gcmoe-sass.txt 2>&1
  mma=$(grep -oE '\b(HMMA|QMMA|HGMMA|QGMMA|IMMA)[A-Z0-9._]*' /tmp/gcmoe-sass.txt | sort | uniq -c | tr '\n' ' ')
  note sass ok "${mma:-no MMA instructions found}"
  # Per role2 kernel: matrix instructions and local-memory traffic (spills, stack arrays).
  awk '/Function : /{f=$3} f ~ /GroupedGemm/ {
         if ($0 ~ /QGMMA|HGMMA/) g[f]++; if ($0 ~ /HMMA/) h[f]++;
         if ($0 ~ /LDL|STL/) l[f]++; seen[f]=1 }
       END { for (f in seen) printf "%-110s GMMA %4d HMMA %4d LDL/STL %3d\n", f, g[f], h[f], l[f] }' \
    /tmp/gcmoe-sass.txt | sort > "$OUT/sass-role2.txt"
  cat "$OUT/sass-role2.txt"
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
  # The broken-context test, in its own process (when bundled).
  if [ -x "$BUNDLE/bin/kernels_device_lost_test" ]; then
    printf 'add_test(CudaDeviceLost "%s")\n' "$BUNDLE/bin/kernels_device_lost_test"
    printf 'set_tests_properties(CudaDeviceLost PROPERTIES LABELS "gpu" TIMEOUT 120)\n'
  fi >> "$CT/CTestTestfile.cmake"
  (cd "$CT" && timeout 540 ctest -L gpu --output-on-failure -V) > "$OUT/ctest.log" 2>&1
  rc=$?
  grep -E "tests passed|Total Test time|\*\*\*|Failed|calc_diff|request|role1 on|1000 steps" "$OUT/ctest.log" | tail -60
  note ctest "$rc" "$(grep -E 'tests passed' "$OUT/ctest.log" | tail -1)"
fi

if has sanitizer; then
  : > "$OUT/sanitizer.log"
  for tool in memcheck racecheck; do
    timeout 240 compute-sanitizer \
      --tool "$tool" --error-exitcode 9 "$GPU_TEST" --gtest_filter=CudaBackendTest.SanitizerCase \
      > /tmp/gcmoe-sanitizer-$tool.log 2>&1
    rc=$?
    cat /tmp/gcmoe-sanitizer-$tool.log >> "$OUT/sanitizer.log"
    tail -4 /tmp/gcmoe-sanitizer-$tool.log
    note "$tool" "$rc" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/gcmoe-sanitizer-$tool.log | tail -1)"
  done
fi

# Our harness: both slices routed-only (the example configs), then with a shared expert
# (I_s = I), then a whole gpt-oss-120b layer (H = I = 2880, run zero-padded to 2944).
# JSON for the peers' ratio tables goes to /tmp/gcmoe-bench-*.json.
if has bench; then
  : > "$OUT/bench.txt"
  for run in "glm-5.2-ep8-rank -1" "deepseek-v4.1-flash-ep8-rank -1" \
             "glm-5.2-ep8-rank 2048" "deepseek-v4.1-flash-ep8-rank 2304" "gpt-oss-120b-layer -1"; do
    set -- $run
    tag=$1; [[ $2 != -1 ]] && tag="$1-shared"
    echo "\$ gcmoe bench layer --config config/examples/$1.json --shared-intermediate $2" >> "$OUT/bench.txt"
    timeout 240 "$GCMOE" bench layer --config "config/examples/$1.json" --shared-intermediate "$2" \
      --tokens-per-rank "$TOKENS" --settle-ms "$SETTLE_MS" --json "/tmp/gcmoe-bench-$tag.json" \
      >> "$OUT/bench.txt" 2>> "$OUT/bench.txt"
    note bench $? "$tag"
  done
  cat "$OUT/bench.txt" | grep -v "^T = "
fi

if has peer; then
  : > "$OUT/peer.txt"
  python3 bench/torch_peer.py --hidden 6144 --intermediate 2048 --experts 32 --top-k 8 \
    --tokens-per-rank "$TOKENS" --settle-ms "$SETTLE_MS" --label glm-5.2 \
    --ours /tmp/gcmoe-bench-glm-5.2-ep8-rank.json >> "$OUT/peer.txt" 2>&1
  note peer-glm $? ""
  python3 bench/torch_peer.py --hidden 5120 --intermediate 2304 --experts 48 --top-k 6 \
    --tokens-per-rank "$TOKENS" --settle-ms "$SETTLE_MS" --label deepseek-v4.1-flash \
    --ours /tmp/gcmoe-bench-deepseek-v4.1-flash-ep8-rank.json \
    >> "$OUT/peer.txt" 2>&1
  note peer-ds $? ""
  grep -v "^T=" "$OUT/peer.txt"
fi

# One `bench layer` run of the GLM slice per label, its time rows appended as "label T us floor%".
bench_rows() {  # label, then gcmoe bench layer flags; appends "label T us floor%" rows
  local label=$1; shift
  timeout 120 "$GCMOE" bench layer --config config/examples/glm-5.2-ep8-rank.json \
    --settle-ms "$SETTLE_MS" --warmup 10 --replays 100 "$@" > /tmp/gcmoe-row.txt 2>&1
  local rc=$?
  cat /tmp/gcmoe-row.txt >> "$OUT/$STAGE_LOG"
  awk -v l="$label" -v rc=$rc "$TIME_ROW"' {printf "%-28s T %4d BM %2d %9.1f us %6s\n", l, $1, $2, $5, $9}
       END { if (rc != 0) printf "%-28s FAILED rc %d\n", l, rc }' /tmp/gcmoe-row.txt | tee -a "$OUT/$STAGE_LOG.rows"
}
# Ablations (GLM slice, default role2): overlap off (one context, dispatch then GEMM) against on;
# the dispatch partition's SM request; the block size BM; merged tails at BM 64.
if has ablate; then
  STAGE_LOG=ablate.txt; : > "$OUT/$STAGE_LOG"; : > "$OUT/$STAGE_LOG.rows"
  for d in 0 4 8 16 24; do
    bench_rows "dispatch-sms=$d" --dispatch-sms "$d" --tokens-per-rank 1,8,64,256
  done
  for bm in 8 16 32 64; do
    bench_rows "bm=$bm" --bm "$bm" --tokens-per-rank 8,64,256
  done
  # The BM 64 kernel's merged tails (an expert's short last block with the block before it)
  # on and off, from the T where experts start to exceed 64 rows; then the other ablations.
  bench_rows "merge-tails" --bm 64 --tokens-per-rank 192,224,256
  bench_rows "no-merge-tails" --bm 64 --tokens-per-rank 192,224,256 --no-merge-tails
  bench_rows "no-heaviest-first" --tokens-per-rank 8,64,256 --no-heaviest-first
  bench_rows "no-direct-rows" --tokens-per-rank 8,64,256 --no-direct-rows
  note ablate ok "$(wc -l < "$OUT/$STAGE_LOG.rows") rows"
fi

# ab_table FILE UNIT WHAT: rows "slice round side T value" -> per slice and T each build's mean of
# the rounds' values and base's over it (WHAT: speedup for times, saving for energy).
ab_table() {
  awk -v sides="$SIDES" -v unit="$2" -v what="$3" '{v[$1" "$4" "$3] += $5; c[$1" "$4" "$3] += 1; seen[$1" "$4] = 1}
       END { n = split(sides, side, " ")
             for (k in seen) {
               line = sprintf("%-30s T %4d", substr(k, 1, index(k, " ") - 1), substr(k, index(k, " ") + 1))
               for (i = 1; i <= n; ++i) {
                 m[i] = c[k" "side[i]] ? v[k" "side[i]] / c[k" "side[i]] : 0
                 line = line sprintf("  %s %9.1f %s", side[i], m[i], unit)
                 if (i > 1 && m[i] > 0) line = line sprintf(" %s %.3f", what, m[1] / m[i])
               }
               print line } }' "$1" | sort -k1,1 -k3,3n
}

if has ab; then
  : > "$OUT/ab.txt"; : > "$OUT/ab-energy.txt"
  BASE=${AB_BASELINE:-$BUNDLE/bin/gcmoe-base}
  # base, this, then AB_MORE's builds (named by their file names), alternating in each round.
  declare -A AB_BIN=([base]=$BASE [this]=$GCMOE)
  SIDES="base this"
  for more in ${AB_MORE:-}; do
    SIDES="$SIDES $(basename "$more")"
    AB_BIN[$(basename "$more")]=$more
  done
  for slice in glm-5.2-ep8-rank deepseek-v4.1-flash-ep8-rank; do
    for round in $(seq "${AB_ROUNDS:-2}"); do
      for side in $SIDES; do
        bin=${AB_BIN[$side]}; flags=${AB_THIS_FLAGS:-}
        [[ $side == base ]] && flags=${AB_BASE_FLAGS:-}
        timeout 150 "$bin" bench layer --config "config/examples/$slice.json" --tokens-per-rank "$TOKENS" \
          --settle-ms "$SETTLE_MS" --warmup 10 --replays 100 $flags > /tmp/gcmoe-ab.txt 2>&1
        note ab-$side $? "$slice round $round"
        awk -v s="$slice" -v side=$side -v r=$round "$TIME_ROW"' {print s, r, side, $1, $5}' \
          /tmp/gcmoe-ab.txt >> "$OUT/ab.txt"
        # The energy per step, where the build printed its board power table (NVML, settling).
        awk -v s="$slice" -v side=$side -v r=$round '/mJ\/step/ {p = 1; next}
             p && $1 ~ /^[0-9]+$/ && NF == 4 {print s, r, side, $1, $4}' /tmp/gcmoe-ab.txt >> "$OUT/ab-energy.txt"
      done
    done
  done
  ab_table "$OUT/ab.txt" us speedup
  if [[ -s $OUT/ab-energy.txt ]]; then
    echo "energy per step (mJ; saving = base's / the build's):"
    ab_table "$OUT/ab-energy.txt" mJ saving
  fi
fi

# What bounds role2 (ncu, clocks left alone): one role2 launch of the GLM slice at T = 8 and 64
# (NCU_TOKENS),
# one context with the roles in sequence (ncu serializes kernels; nothing may spin on a kernel
# that is not running). The first role2 launches are the graphs' empty warm-up replays, one per
# captured graph: 5 with the default kernel and no shared expert (4 block sizes, and BM 64
# without merged tails), else 4 (NCU_SKIP).
if has ncu; then
  : > "$OUT/ncu.txt"
  for T in ${NCU_TOKENS:-8 64}; do
    timeout 180 ncu --clock-control none --kernel-name regex:GroupedGemm --launch-skip "${NCU_SKIP:-5}" \
      --launch-count 1 --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section Occupancy \
      "$GCMOE" bench layer --config config/examples/glm-5.2-ep8-rank.json --dispatch-sms 0 \
      --tokens-per-rank "$T" --warmup 0 --replays 1 > /tmp/gcmoe-ncu.txt 2>&1
    note ncu $? "T $T"
    { echo "==== ncu T = $T"; cat /tmp/gcmoe-ncu.txt; } >> "$OUT/ncu.txt"
    grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|stalled|L2 Hit|Achieved Occupancy|Theoretical Occupancy|Mem Busy|Max Bandwidth" \
      /tmp/gcmoe-ncu.txt | cut -c1-220 | sed "s/^/T=$T /"
  done
fi

# Where role2's instructions go: one role2 launch of
# the GLM slice per T in SOURCE_TOKENS (default 64 256), ncu's executed count and stall samples of
# every SASS instruction (source-T.csv), and bench/ncu_source_runs.py's runs of them
# (source-T.txt). The launch to profile is chosen as in the ncu stage (NCU_SKIP).
if has source; then
  for T in ${SOURCE_TOKENS:-64 256}; do
    timeout 240 ncu --clock-control none --kernel-name regex:GroupedGemm --launch-skip "${NCU_SKIP:-5}" \
      --launch-count 1 --section SourceCounters --section InstructionStats -f -o /tmp/gcmoe-source \
      "$GCMOE" bench layer --config config/examples/glm-5.2-ep8-rank.json --dispatch-sms 0 \
      --tokens-per-rank "$T" --warmup 0 --replays 1 > "$OUT/source-$T.log" 2>&1
    rc=$?
    ncu -i /tmp/gcmoe-source.ncu-rep --page source --csv --print-source sass > "$OUT/source-$T.csv" 2>&1
    /usr/bin/python3 bench/ncu_source_runs.py "$OUT/source-$T.csv" > "$OUT/source-$T.txt" 2>&1
    note source $rc "T $T: $(head -1 "$OUT/source-$T.txt" | cut -c1-90)"
    sed "s/^/T=$T /" "$OUT/source-$T.txt" | head -12
  done
fi

# Each role kernel's own time (ncu serializes them; no cache flush, clocks left alone), GLM
# slice at T = 64, 128 and 256 (ROLES_TOKENS): every launch's duration, role by role. The first of
# each role (one per captured graph) are the empty warm-up replays; then the step and its
# replays.
if has roles; then
  : > "$OUT/roles.txt"
  for T in ${ROLES_TOKENS:-64 128 256}; do
    timeout 180 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum \
      "$GCMOE" bench layer --config config/examples/glm-5.2-ep8-rank.json --dispatch-sms 0 \
      --tokens-per-rank "$T" --warmup 1 --replays 2 > /tmp/gcmoe-roles.txt 2>&1
    note roles $? "T $T"
    awk -v T="$T" '/DispatchRole1Kernel/ {k = "role1"} /GroupedGemm/ {k = "role2"}
         /FinalizeRole3Kernel/ {k = "role3"}
         /gpu__time_duration/ {us[k] = us[k] " " $NF}
         END { for (r in us) printf "T=%s %s us:%s\n", T, r, us[r] }' /tmp/gcmoe-roles.txt |
      sort | tee -a "$OUT/roles.txt"
  done
fi

if has serve; then
  GCMOE="$GCMOE" OUT="$OUT" timeout 240 bash bench/gpu_serve_check.sh > "$OUT/serve.log" 2>&1
  rc=$?
  tail -6 "$OUT/serve.log"
  note serve "$rc" "$(tail -1 "$OUT/serve.log")"
  # The checkpoint families (gpt-oss, Qwen3-MoE, Mixtral, DeepSeek-V3) served on the GPU against
  # their float64 references: needs the Python stubs in BUNDLE/stubs (copied from
  # build/proto/python) and a python3 with grpc and numpy.
  if [[ -d $BUNDLE/stubs ]]; then
    timeout 300 python3 tests/server/hf_checkpoint_test.py --gcmoe "$GCMOE" \
      --stubs "$BUNDLE/stubs" --backend cuda ServeFamiliesTest > "$OUT/families.log" 2>&1
    rc=$?
    tail -3 "$OUT/families.log"
    note families "$rc" "$(grep -E '^(OK|FAILED)' "$OUT/families.log" | tail -1)"
  else
    note families skip "no $BUNDLE/stubs: copy build/proto/python there"
  fi
fi

# The service against its engine, both GPU slices: `bench layer` and `bench serve` in one call
# (one call in flight at every T, unary and streamed; then 8 callers at T = 16 and 32 at T = 4).
# The JSON goes to $OUT/serve-<slice>*.json.
if has servebench; then
  for slice in glm-5.2-ep8-rank deepseek-v4.1-flash-ep8-rank; do
    cfg=config/examples/$slice.json
    timeout 300 "$GCMOE" bench layer --config "$cfg" --tokens-per-rank 1,4,16,64,256 \
      --settle-ms "$SETTLE_MS" > "$OUT/servebench-$slice-layer.log" 2>&1
    note "layer-$slice" $? "$(grep -c . "$OUT/servebench-$slice-layer.log") lines"
    timeout 400 "$GCMOE" bench serve --config "$cfg" --tokens-per-rank 1,4,16,64,256 \
      --modes unary,stream,registered --requests 300 --warmup 30 --json "$OUT/serve-$slice.json" \
      > "$OUT/servebench-$slice.log" 2> "$OUT/servebench-$slice.err"
    note "serve-$slice" $? "T 1..256, one call in flight"
    # Concurrent callers over one connection and over eight (a connection's calls share one
    # HTTP/2 transport on each side).
    for conns in 1 8; do
      timeout 300 "$GCMOE" bench serve --config "$cfg" --tokens-per-rank 16 --concurrency 1,8 \
        --connections $conns --requests 400 --warmup 40 \
        --json "$OUT/serve-$slice-c8-n$conns.json" \
        >> "$OUT/servebench-$slice.log" 2>> "$OUT/servebench-$slice.err"
      note "serve-$slice-c8-n$conns" $? "T 16, 8 callers, $conns connection(s)"
      timeout 300 "$GCMOE" bench serve --config "$cfg" --tokens-per-rank 4 --concurrency 1,32 \
        --connections $conns --requests 800 --warmup 64 \
        --json "$OUT/serve-$slice-c32-n$conns.json" \
        >> "$OUT/servebench-$slice.log" 2>> "$OUT/servebench-$slice.err"
      note "serve-$slice-c32-n$conns" $? "T 4, 32 callers, $conns connection(s)"
    done
    cat "$OUT/servebench-$slice-layer.log" "$OUT/servebench-$slice.log"
  done
fi

GPUS=$(nvidia-smi -L | wc -l)
if has multi; then
  timeout 400 "$BUNDLE/bin/kernels_multi_gpu_test" > "$OUT/multi-gpu-test.log" 2>&1
  rc=$?
  grep -E "^\[  |Failure|Expected|differs|calc_diff|error" "$OUT/multi-gpu-test.log" | tail -30
  note multi-test "$rc" "$(grep -E 'PASSED|FAILED' "$OUT/multi-gpu-test.log" | tail -1)"
  GCMOE="$GCMOE" OUT="$OUT" RANKS="$GPUS" timeout 300 bash bench/gpu_serve_check.sh \
    > "$OUT/serve-multi.log" 2>&1
  rc=$?
  tail -8 "$OUT/serve-multi.log"
  note serve-$GPUS "$rc" "$(tail -1 "$OUT/serve-multi.log")"
fi

if has ep; then
  timeout 540 "$GCMOE" bench ep --config "$EP_CONFIG" --ranks "$GPUS" --tokens-per-rank "$TOKENS" \
    ${EP_FLAGS:-} > "$OUT/ep.txt" 2> "$OUT/ep.log"
  rc=$?
  cat "$OUT/ep.txt"; tail -5 "$OUT/ep.log"
  note ep "$rc" "$(tail -1 "$OUT/ep.txt")"
fi

if has race; then
  : > "$OUT/race.txt"
  for overlap in on off; do
    name="overlap-$overlap"
    timeout 170 "$GCMOE" bench ep --config "$EP_CONFIG" --set "engine.cuda.overlap_roles=$overlap" \
      --ranks "$GPUS" --tokens-per-rank 1,2,4,16 --replays 2 --warmup 0 \
      --repeat "${RACE_REPEAT:-150}" --check-cpu 2 > "$OUT/race-$name.txt" 2> "$OUT/race-$name.log"
    rc=$?
    printf '%-18s rc %d  wrong-vs-cpu %3d  repeat-differs %3d\n' "$name" "$rc" \
      "$(grep -c 'CPU backend: .*max |diff| \(0\.0[3-9]\|0\.[1-9]\|[1-9]\)' "$OUT/race-$name.log")" \
      "$(grep -c 'same step differs' "$OUT/race-$name.log")" | tee -a "$OUT/race.txt"
  done
  note race 0 "$(tr '\n' ';' < "$OUT/race.txt")"
fi

if has trace; then
  # The summaries are log entries (stderr of the rank processes).
  timeout 120 "$GCMOE" bench ep --config "$EP_CONFIG" --set engine.cuda.trace_role2=true \
    --ranks "$GPUS" --tokens-per-rank 1,16 --exchange gcmoe --balancer off --replays 20 \
    --warmup 2 > "$OUT/trace.txt" 2>&1
  note trace $? "$(grep -c 'role2 trace' "$OUT/trace.txt") summaries"
  grep -E "role2 trace|routed W|run |wait |slowest 1|us \(ranks" "$OUT/trace.txt" | head -80
fi

echo "==== summary ($(date -u +%F))"
printf '%s\n' "${SUMMARY[@]}"
