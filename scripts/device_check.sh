#!/usr/bin/env bash
# Device checks on a CUDA machine, in phases that each fit one 10-minute call.
#
#   bash scripts/device_check.sh [PHASE ...]
#
# Phases (default: kernels ncu):
#   kernels    compile the variants the oracle sweep needs (all cores), then
#              tests/gpu/test_gpu_kernels.py: every shape x L 0..6 x K x stride x
#              fp32/fp16/bf16 against the float64 oracle, the kernel sizes dealt
#              out over the GPUs (on one 16-core GPU machine: one K per call,
#              TEST_KS=5; at 4 K its warmup alone outran a 10-minute call; with
#              carried PTX, see below, the K 5 cases ran in 447 s on 14 workers)
#   bindings   tests/gpu/test_bindings_gpu.py and test_reliability_gpu.py on one
#              worker per core (each compiles the variants its cases meet), plus
#              benchmarks/binding_overhead.py (~7 min on a fresh machine: 53 passed,
#              2 skipped in 399 s on 14 workers, H100; the up-front warmup of every
#              K 3-7 variant it replaced did not finish in 320 s there)
#   ncu        DRAM bytes of one forward + backward at 64x96x56x56, L5, K5, fp32
#   profile    ncu occupancy, warp states and stall reasons at 56x56 and 7x7
#   tune       benchmarks/tune.py $TUNE_ARGS (launch-shape sweep)
#   kernelbench  benchmarks/kernel_bench.py (kernel-level times, host overhead)
#   bench      python -m wtconv_cuda.bench: the user-facing benchmark (~4 min with
#              .ptxcache/ptx-Kbench.tar.xz carried, ~5.5 without); its JSON, plot and
#              Markdown summary (the README's table and the targets) go to $OUT
#   sanitizer  compute-sanitizer memcheck + racecheck (scripts/sanitizer.sh)
#   wtconvnext benchmarks/wtconvnext.py throughput ($E2E_ARGS) and sanity (~7 min)
#   ddp        benchmarks/ddp_check.py: DDP over every GPU vs one process (~1 min)
#   hostprofile  benchmarks/host_profile.py: host cost of the torch training path,
#              piece by piece, and a cProfile of it                 (~1 min)
#   cupyhost   benchmarks/cupy_host_profile.py: the same for the CuPy path's
#              training step (forward with a Tape, Tape.backward)  (~1 min)
#   hoststate  benchmarks/host_state_probe.py: the CuPy training step's host cost as
#              the process changes (PyTorch imported, DLPack views, gc off) and
#              the user benchmark's own host row, three rounds each   (~1 min)
#   pdl        benchmarks/pdl_probe.py: the recorded forward and backward at the ConvNeXt-T
#              stages with plain launches and with programmatic dependent launch (every
#              kernel waits at its first instruction, and triggers its dependents or not),
#              fp32 and bf16; carry ptx-Kbench; $PDL_STORAGE, $PDL_TIMEOUT (seconds,
#              default 480)                                         (~1 min with fp32)
#   fwdhost    benchmarks/forward_host_cost.py: the CuPy forward's kernel, per-call and
#              back-to-back times and a cProfile, fp32 / fp16 / bf16 (~1 min)
#   torchstep  the PyTorch module path in one short call: its GPU tests, its host
#              cost against the functional path, the ConvNeXt-T stage benchmark,
#              WTConvNeXt-T bf16 eager                              (~5 min cold)
#   stepprofile  benchmarks/step_profile.py, bf16 and fp32: where a WTConvNeXt-T
#              step's time goes (host issue, GPU busy, kernels by kind) (~4 min)
#   tiles      the tiled kernels' GPU tests (the forward, and the backward forced
#              on; K of TEST_KS), then benchmarks/tile_bench.py $TILE_ARGS: plane
#              kernel vs tiles on the paper grid; TILE_ARGS="--backward ..."
#              times the backward (~5 min cold)
#   split      split passes (coarse pre-pass, then tiles): tile_bench.py forward and
#              backward on the paper grid (L 3-5) and at two ConvNeXt-T stages (~8 min)
#   registers  the register kernel (one thread per tiny plane): its GPU tests and
#              the planner's own splits (28x28 runs its coarse pass on it), then
#              benchmarks/register_bench.py $REG_ARGS against the plane kernel,
#              forward and backward (~6 min cold)
#   ab         kernel-level A/B: benchmarks/kernel_bench.py (fp32) on the tree in
#              $AB_BASE (e.g. made with `git archive REV | tar -x -C ab_base`)
#              and on the working tree, alternately, twice each      (~6 min cold);
#              $AB_ARGS adds options to both sides (e.g. "--edges 56 28": two stages;
#              the base's benchmarks/ must know them)
#   bwdprofile the plane backward at the ConvNeXt-T stages 56 and 28 (14 runs the lane
#              kernels): its time with phases cut out (backward_breakdown.py), then ncu
#              instruction counts, lane use, occupancy and stalls     (~5 min cold)
#   hotspots   ncu source counters of the weights-only plane backward at 56 and 28 (14:
#              the lane kernels since c99cd67, see lanehotspots):
#              warp samples, instructions and bank conflicts loop by loop of its
#              SASS (benchmarks/sass_hotspots.py); HOT_ARGS="blocked=1" profiles its
#              register-blocked variant                         (~2 min cold)
#   blockedw   the weights-only plane backward on register blocks (PlaneSpec.blocked,
#              off by default): its GPU tests (K of $BLOCKED_KS, default 5), then
#              lanes_ab.py's settings default and blocked at the 56 x 56 and 28 x 28
#              stages, fp32 and bf16 ($BLOCKED_SHAPES); carry its PTX
#              (scripts/build_ptx_cache.sh blocked)                 (~5 min warm)
#   tilehotspots  the same for the split forward's tile kernel (wtconv_tile) at the
#              ConvNeXt-T stages 56 (L5) and 28 (L4), fp32: the inference target's
#              kernel, loop by loop; TILEHOT_SHAPES="BxCxHxWxLxK ..." picks other
#              stages, TILEHOT_ARGS="tile_planes=16" runs the 28 x 28 tile with 16
#              planes a block                                      (~2 min cold)
#   lanes      the lane kernels (weight gradients and forward, a plane to one or two
#              threads): their GPU tests, then benchmarks/lanes_ab.py against the
#              default kernels at the 14 x 14 stage ($LANES_SHAPES; $LANES_SETTINGS
#              picks lanes_ab.py's settings; $LANES_TESTS, a pytest -k expression, narrows
#              the tests, e.g. "lane_kernel_groups"; "-" skips them)   (~6 min warm)
#   lanehotspots  the same for the lane kernels (forward and weight gradients, forced on)
#              at 64x384x14x14, L3, K5, fp32 ($LANEHOT_SHAPE, $LANEHOT_THREADS: "1 2 2,4")
#                                                                   (~2 min warm)
#   streams    the backward's dx part on a side stream (launch.TWO_STREAMS): its GPU tests
#              and the binding tests of streams and graphs, then lanes_ab.py default /
#              onestream at the ConvNeXt-T stages 56, 28 and 14, fp32 and bf16, and
#              benchmarks/streams_bench.py (the recorded programs on one stream and two,
#              dx in one or two batch chunks); carry ptx-Kbench (~6 min)
#   shallowsplit  splits where whole tiles would run (L 2 and 3 on large planes): the GPU
#              tests of the planner's splits (K 5), then whole tiles against the planner's
#              own tiles split at 1 and 2 (tile_bench.py --auto-splits), forward and
#              backward, fp32 and bf16 ($SHALLOW_CONFIGS, $SHALLOW_K)   (~6 min cold)
#   splitchunks  the split backward in batch chunks (launch.split_batch_chunks): its GPU
#              tests ($CHUNK_TESTS, a pytest -k expression; "-" skips them; K of
#              $CHUNK_KS, default 5), then tile_bench.py --backward: the planner's default
#              against the batch whole (auto/b8) and other chunk sizes ($CHUNK_SIZES), on
#              the paper grid's sizes at L 5 and L 3, fp32 and bf16 ($CHUNK_CONFIGS)
#                                                                   (~6 min cold)
#   tiledtypes the paper grid's forward and training step per dtype (fp32 / fp16 / bf16), on
#              $AB_BASE's tree (if set) and the working tree, then ncu of the L3 tile
#              kernel at 8x64x256x256 in fp16 ($TILEDTYPE_SHAPES)     (~4 min cold)
#   tileprofile  ncu occupancy, warp states, stall reasons and instruction counts of
#              the tiled forward and backward at 8x128x512x512, L1 and L3 (~2 min)
#   tileplanes several planes of one channel a block for the 28 x 28 split's tile
#              (Tuning.tile_planes): its GPU tests, then tile_bench.py at 64x192x28x28, L4,
#              split at 2, with 1, 2, 4, 8 and 16 planes a block ($TILEPLANES_VARIANTS:
#              tile_bench variants)                                  (~3 min cold)
#   splitrule  benchmarks/split_threshold.py $SPLITRULE_ARGS: a small-plane split rule
#              against its replacements through the CuPy path (forward and training step,
#              each setting's y and dx checked against the current rule's); default: the
#              28 x 28 rule split at level 3 (4 x 4 coarse planes) and at 3 with the
#              coarse level in the tile, fp32 and bf16                (~2 min warm)
#   capsk9     register caps at K 9 where ptxas spilled: the K 9 oracle cases of the split
#              backward's solo tile (255x257, L 2/3/5) and the register backward
#              ($CAPS_TESTS), then
#              tile_bench.py --auto-caps
#              ($CAPS_TILE) at 8x64x256x256 (L 3, 5) and the 56 / 28 stages
#              ($CAPS_TILE_CONFIGS), register_bench.py ($CAPS_REG) at 64x768x7x7 (L 2),
#              two rounds ($CAPS_ROUNDS, default "1 2"; "-" as $CAPS_TESTS skips the
#              oracle cases), fp32 and bf16                        (~10 min cold)
#   stageprofile the same for the split forward's tile kernel at the ConvNeXt-T stages
#              28 (L4) and 56 (L5), fp32, plus ncu's pipe utilisation: is it bound by
#              issue, by latency or by shared-memory instructions? ($STAGEPROFILE_SHAPES:
#              "B C H W L K" per shape, comma-separated)             (~2 min cold)
#
# Knobs: TEST_KS (kernel sizes of the sweep, default 3,5,7,9), TEST_WORKERS (pytest
# processes per GPU, default 8), TEST_TIMEOUT (seconds, default 420), TEST_FILTER (a pytest
# -k expression narrowing the kernels sweep: "255x257 or tiled" takes the large
# plane's cases, named like 8x64x255x257-L3-K5-s1, and the tiled kernels' tests), TEST_IDS (a
# file of case ids, e.g. from scripts/sweep_left.py: the cases a cut sweep did not reach; their
# kernel sizes must be in TEST_KS, and they all run on GPU 0), WARM_PLANES (plane sizes the kernels
# phase compiles ahead, e.g. "255x257 130x67"), WARMUP_TIMEOUT (seconds the kernels phase's
# compile step may take; default: no limit), PACK_CACHE=1 (the kernels phase packs the kernel
# cache, carried PTX and what it compiled, into $OUT/ptx-cache.tar.xz: on a fresh H100 host
# the 16 cores compiled about 25 K 9 variants a minute, 2 cores here about 3 K 7 ones; a sweep
# of one new kernel size needs about 630 variants, so build it across calls), BENCH_ARGS (extra
# options of the bench, e.g. "--shapes convnext"), TILE_ARGS (options of
# tile_bench.py), REPORT=1 (load
# every compiled variant and record registers and local memory: ~1 s a kernel).
# Logs and JSON land in $OUT (the device tool's output folder) or ./device_out.
# A cold kernel cache costs most of a call: scripts/build_ptx_cache.sh K ... builds
# the kernels phase's PTX on a CPU machine into .ptxcache/ (carry it); it is
# unpacked into $WTCONV_CUDA_CACHE here before the phases run.
# Wheels the image lacks can be carried in .whl/ (see the device README); the
# package needs none: it restores numpy.row_stack for numba-cuda 0.30 on
# NumPy >= 2.5 (wtconv_cuda/kernels/_numba_compat.py).
set -uo pipefail
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export WTCONV_CUDA_CACHE=${WTCONV_CUDA_CACHE:-/tmp/wtconv_cache}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# PTX compiled ahead on a CPU machine (scripts/build_ptx_cache.sh), if carried.
if compgen -G ".ptxcache/*.tar.xz" >/dev/null; then
  mkdir -p "$WTCONV_CUDA_CACHE"
  for archive in .ptxcache/*.tar.xz; do tar -C "$WTCONV_CUDA_CACHE" -xJf "$archive"; done
  echo "kernel cache: $(find "$WTCONV_CUDA_CACHE" -name '*.ptx' | wc -l) PTX files unpacked from .ptxcache"
fi
TEST_KS=${TEST_KS:-3,5,7,9}
status=0
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(kernels ncu)

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
  python3 -c "import numpy, numba, cupy, torch; from importlib.metadata import version as v; print('numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', v('numba-cuda'), 'cupy', cupy.__version__, 'torch', torch.__version__)"
  # The device may copy the working tree beside an older .git: name the HEAD and what
  # the tree changes against it (a tree later than the HEAD shows as changed paths).
  if git rev-parse HEAD 2>/dev/null; then
    changed=$(git status --porcelain --untracked-files=no)
    echo "tracked paths that differ from it: $(grep -c . <<<"$changed")"
    [ -n "$changed" ] && head -n 20 <<<"$changed"
  fi
} 2>&1 | tee "$OUT/env.log"

run_kernels() {
  local report=() jobs
  if [ -z "${TEST_IDS:-}" ]; then  # a few listed cases compile their own variants
    echo "== compile kernel variants (K = $TEST_KS)"
    jobs=$(nproc); [ "$jobs" -gt 32 ] && jobs=32
    [ "${REPORT:-0}" = 1 ] && report=(--report "$OUT/kernels.json")
    # shellcheck disable=SC2086  # WARM_PLANES is a list of plane sizes
    # A cut warmup (WARMUP_TIMEOUT) keeps what it compiled: the cases then compile the rest.
    timeout "${WARMUP_TIMEOUT:-0}" python3 -m wtconv_cuda.kernels.warmup \
      --kernel-sizes ${TEST_KS//,/ } --strides 1 2 \
      --jobs "$jobs" --planes ${WARM_PLANES:-17x23 56x56 255x257 1x7 28x28 14x14 7x7} \
      "${report[@]}" 2>&1 | tee "$OUT/warmup.log" | tail -n 5
  fi
  # One pytest process per GPU, the kernel sizes dealt out round robin.
  local ngpu ks i pids=() rc=0
  ngpu=$(nvidia-smi -L | grep -c '^GPU')
  [ "$ngpu" -ge 1 ] || ngpu=1
  IFS=, read -ra ks <<<"$TEST_KS"
  local targets=(tests/gpu/test_gpu_kernels.py)
  if [ -n "${TEST_IDS:-}" ]; then  # the listed cases only, all on GPU 0
    mapfile -t targets < <(sed 's|^|tests/gpu/test_gpu_kernels.py::|' "$TEST_IDS")
    ks=("$TEST_KS")
    ngpu=1
  fi
  for ((i = 0; i < ngpu && i < ${#ks[@]}; i++)); do
    local mine=() j
    for ((j = i; j < ${#ks[@]}; j += ngpu)); do mine+=("${ks[j]}"); done
    local list; list=$(IFS=,; echo "${mine[*]}")
    echo "== oracle sweep on GPU $i (K = $list)"
    # -v: each case's result is in the log even when the timeout cuts the run; -rfE
    # names the failures in the summary
    CUDA_VISIBLE_DEVICES=$i WTCONV_TEST_GPU=1 WTCONV_TEST_KS=$list timeout "${TEST_TIMEOUT:-420}" \
      python3 -m pytest -v -rfE -n "${TEST_WORKERS:-8}" -p no:cacheprovider -p no:benchmark \
      ${TEST_FILTER:+-k "$TEST_FILTER"} "${targets[@]}" >"$OUT/gpu_tests_gpu$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || rc=1
    local log="$OUT/gpu_tests_gpu$i.log"
    echo "GPU $i: $(grep -c ' PASSED ' "$log") passed, $(grep -c -E ' (FAILED|ERROR) ' "$log") failed"
    grep -E '^(FAILED|ERROR) ' "$log" | head -n 20
    tail -n 1 "$log"
  done
  if [ "${PACK_CACHE:-0}" = 1 ]; then  # bring the compiled PTX back for the next call to carry
    # fast xz on every core: the default level packing ~1,200 PTX files outran a call's
    # last 45 s; -1 packs 16 MB of PTX 12x faster here, into an archive 1.7x larger
    XZ_OPT="-T0 -1" tar -C "$WTCONV_CUDA_CACHE" -cJf "$OUT/ptx-cache.tar.xz" . &&
      echo "packed $(find "$WTCONV_CUDA_CACHE" -name '*.ptx' | wc -l) PTX files into $OUT/ptx-cache.tar.xz"
  fi
  return $rc
}

run_bindings() {
  echo "== bindings and reliability on the GPU"
  # A fresh machine has an empty kernel cache: pytest workers compile the
  # variants of their own cases side by side (one worker per core, at most 14).
  local workers; workers=$(nproc); [ "$workers" -gt 14 ] && workers=14
  WTCONV_TEST_GPU=1 timeout 480 python3 -m pytest -q -n "$workers" -rfE -p no:cacheprovider \
    -p no:benchmark tests/gpu/test_bindings_gpu.py tests/gpu/test_reliability_gpu.py \
    2>&1 | tee "$OUT/gpu_bindings.log" | tail -n 15
  timeout 120 python3 benchmarks/binding_overhead.py >"$OUT/binding_overhead.json" \
    2>"$OUT/binding_overhead.err" && tail -c 2000 "$OUT/binding_overhead.json"
}

run_ncu() {
  echo "== HBM bytes (ncu, forward + backward at 64x96x56x56, L5, K5, fp32)"
  # launches of one forward + backward, as planned on this GPU (ncu_target.py runs the
  # pair twice: skip the first, profile the second)
  local n
  n=$(python3 -c 'from wtconv_cuda.kernels import launch as l; b = l.CupyBackend()
p = l.Problem(64, 96, 56, 56, 5, 5, 1, "float32", True)
print(sum(len(l.planned_specs(p, bw, b.shared_limit, b.max_slots)) for bw in (False, True)))') || return 1
  ncu --clock-control none --launch-skip "$n" --launch-count "$n" --kernel-name regex:wtconv \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum --csv \
    python3 benchmarks/ncu_target.py 64 96 56 56 5 5 >"$OUT/ncu.csv" 2>"$OUT/ncu.err" || return 1
  python3 - "$OUT/ncu.csv" <<'EOF' | tee "$OUT/ncu_summary.txt"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, body = rows[0], rows[1:]
ix = {n: head.index(n) for n in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value")}
x_bytes = 64 * 96 * 56 * 56 * 4
for r in body:
    name = r[ix["Kernel Name"]][:24]
    value = float(r[ix["Metric Value"]].replace(",", ""))
    unit = r[ix["Metric Unit"]]
    scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit)
    extra = f"  = {value * scale / x_bytes:.3f} x bytes(x)" if scale else ""
    print(f"{name:24s} {r[ix['Metric Name']]:24s} {value:14.1f} {unit}{extra}")
EOF
}

# ncu_sections TAG_PREFIX KERNEL_REGEX TARGET "SHAPE" ... -- EXTRA_NCU_OPTIONS ...: occupancy,
# warp states, stall reasons (and any extra options) of the second pair of launches of
# TARGET (a benchmarks/ script) at each SHAPE, condensed by profile_summary.py.
ncu_sections() {
  local prefix=$1 regex=$2 target=$3 shape tag
  shift 3
  local shapes=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do shapes+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  for shape in "${shapes[@]}"; do
    tag=${shape// /x}
    # shellcheck disable=SC2086  # a shape is a list of arguments
    ncu --launch-skip 2 --launch-count 2 --kernel-name "regex:$regex" \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats "$@" --csv --page details python3 "benchmarks/$target" $shape \
      >"$OUT/${prefix}_$tag.csv" 2>"$OUT/${prefix}_$tag.err"
    python3 benchmarks/profile_summary.py "$OUT/${prefix}_$tag.csv" "$tag"
  done 2>&1 | tee "$OUT/${prefix}_summary.txt"
}

run_profile() {
  echo "== where the time goes (ncu: occupancy, warp states, stall reasons)"
  ncu_sections profile wtconv_plane ncu_target.py "64 96 56 56 5 5" "64 768 7 7 2 5" -- \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active"
}

run_tune() {
  echo "== launch-shape sweep (benchmarks/tune.py ${TUNE_ARGS:-})"
  timeout 420 python3 benchmarks/tune.py --json "$OUT/tune.json" ${TUNE_ARGS:-} 2>&1 \
    | tee "$OUT/tune.log"
}

run_bwdprofile() {
  echo "== the plane backward, phase by phase (fp32, K5)"
  timeout 400 python3 benchmarks/backward_breakdown.py --json "$OUT/backward_breakdown.json" \
    2>&1 | tee "$OUT/backward_breakdown.log"
  local metrics="regex:smsp__average_warps_issue_stalled_.*_per_issue_active"
  metrics+=",smsp__inst_executed.sum,smsp__thread_inst_executed_per_inst_executed.ratio"
  metrics+=",smsp__sass_inst_executed_op_shared_ld.sum,smsp__sass_inst_executed_op_shared_st.sum"
  metrics+=",smsp__inst_executed_op_branch.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
  ncu_sections bwdprofile wtconv_plane ncu_target.py "64 96 56 56 5 5 backward" \
    "64 192 28 28 4 5 backward" -- --section InstructionStats --metrics "$metrics"
  tar czf "$OUT/bwdprofile.tgz" -C "$OUT" $(cd "$OUT" && ls bwdprofile_*.csv bwdprofile_*.err) \
    && rm -f "$OUT"/bwdprofile_*.csv "$OUT"/bwdprofile_*.err
}

# hotspot_run TAG KERNEL_REGEX SKIP MODE B C H W L K [lanes=N]: ncu source counters of one launch of
# KERNEL_REGEX (after SKIP earlier ones) in benchmarks/ncu_target.py's MODE run, and the
# loop-by-loop summary of its SASS, appended to $OUT/hotspots_summary.txt.
hotspot_run() {
  local tag=$1 kernel=$2 skip=$3 mode=$4 rc=0
  shift 4
  ncu --clock-control none --launch-skip "$skip" --launch-count 1 \
    --kernel-name "regex:$kernel" --section SpeedOfLight --section LaunchStats \
    --section Occupancy \
    --section WarpStateStats --section InstructionStats --section SourceCounters \
    -o "$OUT/hotspots_$tag" python3 benchmarks/ncu_target.py "$@" "$mode" \
    >"$OUT/hotspots_$tag.log" 2>&1 || rc=1
  ncu -i "$OUT/hotspots_$tag.ncu-rep" --page details >"$OUT/hotspots_$tag.txt" 2>&1
  ncu -i "$OUT/hotspots_$tag.ncu-rep" --page source --csv --print-source sass \
    | gzip >"$OUT/hotspots_${tag}_sass.csv.gz"
  rm -f "$OUT/hotspots_$tag.ncu-rep"
  { echo "-- $tag"; grep -E "Duration|Registers Per|Achieved Occupancy" "$OUT/hotspots_$tag.txt"
    python3 benchmarks/sass_hotspots.py "$OUT/hotspots_${tag}_sass.csv.gz" --top 14; } \
    2>&1 | tee -a "$OUT/hotspots_summary.txt" || rc=1
  return $rc
}

run_hotspots() {
  echo "== warp samples by loop of the weights-only plane backward (ncu source counters)"
  local shape n rc=0
  : >"$OUT/hotspots_summary.txt"
  for shape in "64 96 56 56 5 5" "64 192 28 28 4 5"; do  # (14 x 14: lanehotspots)
    # shellcheck disable=SC2086  # a shape is a list of arguments
    n=$(python3 benchmarks/ncu_target.py $shape plane-launches) || { rc=1; continue; }
    # the weights-only kernel is the last wtconv_plane launch of the fourth backward
    # ($HOT_ARGS: ncu_target.py options, e.g. blocked=1)
    # shellcheck disable=SC2086
    hotspot_run "${shape// /x}${HOT_ARGS:+_${HOT_ARGS//[= ]/}}" wtconv_plane $((4 * n - 1)) \
      backward $shape ${HOT_ARGS:-} || rc=1
  done
  return $rc
}

run_tilehotspots() {
  echo "== warp samples by loop of the split forward's tile kernel (ncu source counters)"
  local shape rc=0
  : >"$OUT/hotspots_summary.txt"
  local shapes=${TILEHOT_SHAPES:-"64x96x56x56x5x5 64x192x28x28x4x5"}
  for shape in $shapes; do
    shape=${shape//x/ }
    # ncu_target.py's forward mode runs three forwards; the third one's tiles are measured
    # ($TILEHOT_ARGS: ncu_target.py options, e.g. tile_planes=16)
    # shellcheck disable=SC2086  # a shape is a list of arguments
    hotspot_run "tile_${shape// /x}${TILEHOT_ARGS:+_${TILEHOT_ARGS//[= ]/}}" wtconv_tile 2 \
      forward $shape ${TILEHOT_ARGS:-} || rc=1
  done
  return $rc
}

run_lanehotspots() {
  echo "== warp samples by loop of the lane kernels (ncu source counters), 14 x 14, fp32"
  local shape n threads tag rc=0
  : >"$OUT/hotspots_summary.txt"
  shape=${LANEHOT_SHAPE:-"64 384 14 14 3 5"}
  for threads in ${LANEHOT_THREADS:-2}; do  # "W,F": the weights' threads, the forwards'
    tag=${threads//,/-}
    # the forward kernel: the third of ncu_target.py's three forwards
    # shellcheck disable=SC2086  # a shape is a list of arguments
    hotspot_run "lanefwd${tag}_${shape// /x}" wtconv_lanes_forward 2 forward $shape \
      "lanes=$threads" || rc=1
    # the weight gradients: the last wtconv_lanes launch of the fourth backward
    # shellcheck disable=SC2086
    n=$(python3 benchmarks/ncu_target.py $shape lane-launches "lanes=$threads") \
      || { rc=1; continue; }
    # shellcheck disable=SC2086
    hotspot_run "lanes${tag}_${shape// /x}" wtconv_lanes $((4 * n - 1)) backward $shape \
      "lanes=$threads" || rc=1
  done
  # one archive beside the summary: the device tool returns at most 8 files
  (cd "$OUT" && tar czf lanehotspots.tgz hotspots_lane*_* && rm -f hotspots_lane*_*) || rc=1
  return $rc
}

# ncu metrics of the tile profiles: stall reasons, instructions, shared loads, stores and
# bank conflicts
TILE_METRICS="regex:smsp__average_warps_issue_stalled_.*_per_issue_active"
TILE_METRICS+=",smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
TILE_METRICS+=",smsp__sass_inst_executed_op_shared_ld.sum,smsp__sass_inst_executed_op_shared_st.sum"

run_tileprofile() {
  echo "== where the tiles' time goes (ncu, 8x128x512x512, K5, fp32, tiles forced)"
  local metrics="$TILE_METRICS,dram__bytes_read.sum,dram__bytes_write.sum"
  ncu_sections tileprofile wtconv_tile tile_ncu_target.py "8 128 512 512 1 5" "8 128 512 512 3 5" \
    -- --section InstructionStats --metrics "$metrics"
  # one archive: the device tool returns a limited number of files
  tar czf "$OUT/tileprofile.tgz" -C "$OUT" $(cd "$OUT" && ls tileprofile_*.csv tileprofile_*.err) \
    && rm -f "$OUT"/tileprofile_*.csv "$OUT"/tileprofile_*.err
}

run_stageprofile() {
  echo "== where the stage tiles' time goes (ncu: stall reasons, pipes, shared instructions)"
  local shapes=() i
  IFS=, read -ra shapes <<<"${STAGEPROFILE_SHAPES:-64 192 28 28 4 5,64 96 56 56 5 5}"
  # ncu_target.py's forward mode runs three forwards: the third one's tile is measured
  for i in "${!shapes[@]}"; do shapes[i]="${shapes[i]} forward"; done
  ncu_sections stageprofile wtconv_tile ncu_target.py "${shapes[@]}" \
    -- --section InstructionStats --section ComputeWorkloadAnalysis --metrics "$TILE_METRICS"
  tar czf "$OUT/stageprofile.tgz" -C "$OUT" $(cd "$OUT" && ls stageprofile_*.csv stageprofile_*.err) \
    && rm -f "$OUT"/stageprofile_*.csv "$OUT"/stageprofile_*.err
}

run_tileplanes() {
  echo "== planes of one channel a block, 28 x 28 split tile (TileSpec.planes)"
  # one process per case: each compiles its variants (some 4 min in one process)
  WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout 300 python3 -m pytest -q -n 9 -p no:cacheprovider \
    -p no:benchmark tests/gpu/test_gpu_kernels.py -k tile_planes >"$OUT/gpu_tileplanes.log" 2>&1
  local rc=$?
  tail -n 3 "$OUT/gpu_tileplanes.log"
  local variants=${TILEPLANES_VARIANTS:-"32:32:4:120:0:1 32:32:4:120:0:2 32:32:4:120:0:4 \
    32:32:4:120:0:8 32:32:4:120:0:16"}
  # shellcheck disable=SC2086  # a list of variants
  timeout 300 python3 benchmarks/tile_bench.py --configs 64x192x28x28:4 --splits 2 --no-plane \
    --variants $variants --json "$OUT/tileplanes.json" 2>&1 | tee "$OUT/tileplanes.log" || rc=1
  return $rc
}

run_blockedw() {
  # The weights-only plane backward's correlations on register blocks: their GPU oracle
  # cases (K of $BLOCKED_KS, default 5: four of the six; their odd planes compile here),
  # then the step and backward times through the CuPy path with the planner's default and
  # with BLOCKED_WEIGHTS on, fp32 and bf16.
  echo "== register-blocked weight gradients: GPU tests, then lanes_ab.py default / blocked"
  local rc=0
  WTCONV_TEST_GPU=1 WTCONV_TEST_KS=${BLOCKED_KS:-5} timeout 240 python3 -m pytest -q -n 8 \
    -p no:cacheprovider -p no:benchmark -k blocked_weights tests/gpu/test_gpu_kernels.py \
    >"$OUT/blockedw_tests.log" 2>&1 || rc=1
  tail -n 5 "$OUT/blockedw_tests.log"
  # shellcheck disable=SC2086  # BLOCKED_SHAPES is a list of shapes
  (cd benchmarks && timeout 320 python3 lanes_ab.py --dtypes fp32 bf16 --settings default blocked \
    --shapes ${BLOCKED_SHAPES:-64x96x56x56:5 64x192x28x28:4} --json "$OUT/blockedw_ab.json") \
    >"$OUT/blockedw_ab.log" 2>&1 || rc=1
  grep -v "Spec(" "$OUT/blockedw_ab.log" | cut -c1-400 | tail -n 30
  return $rc
}

run_streams() {
  # The backward's two streams (launch.TWO_STREAMS): their GPU tests and the binding
  # tests of streams and CUDA graphs, then lanes_ab.py's settings default and onestream
  # at the ConvNeXt-T stages 56, 28 and 14, fp32 and bf16 ($STREAMS_SHAPES); carry
  # ptx-Kbench.
  echo "== two streams in the backward: GPU tests, then lanes_ab.py default / onestream"
  local rc=0
  WTCONV_TEST_GPU=1 timeout 300 python3 -m pytest -q -n 4 -p no:cacheprovider -p no:benchmark \
    tests/gpu/test_two_streams_gpu.py tests/gpu/test_bindings_gpu.py \
    -k "two_streams or respects_the_current_stream or cuda_graph" \
    >"$OUT/streams_tests.log" 2>&1 || rc=1
  tail -n 8 "$OUT/streams_tests.log"
  # shellcheck disable=SC2086  # STREAMS_SHAPES is a list of shapes
  (cd benchmarks && timeout 300 python3 lanes_ab.py --dtypes fp32 bf16 \
    --settings default onestream --json "$OUT/streams_ab.json" \
    --shapes ${STREAMS_SHAPES:-64x96x56x56:5 64x192x28x28:4 64x384x14x14:3}) \
    >"$OUT/streams_ab.log" 2>&1 || rc=1
  grep -v "Spec(" "$OUT/streams_ab.log" | cut -c1-400 | tail -n 30
  # the recorded programs on one stream and two, dx in one or two batch chunks
  (cd benchmarks && timeout 240 python3 streams_bench.py --storage float32 bfloat16 \
    --json "$OUT/streams_bench.json") 2>&1 | tee "$OUT/streams_bench.log" | tail -n 6 || rc=1
  return $rc
}

run_tiles() {
  # The tiled kernels: their oracle tests (every K of TEST_KS, all dtypes), then
  # benchmarks/tile_bench.py over the paper grid ($TILE_ARGS), plane kernel
  # against the tiles.
  echo "== tiled kernels: oracle tests, then tile_bench ${TILE_ARGS:-}"
  WTCONV_TEST_GPU=1 WTCONV_TEST_KS=$TEST_KS timeout 300 python3 -m pytest -q -x -n 16 \
    -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py -k tiled \
    >"$OUT/gpu_tiles.log" 2>&1
  local rc=$?
  tail -n 5 "$OUT/gpu_tiles.log"
  # shellcheck disable=SC2086  # TILE_ARGS is a list of options
  timeout 400 python3 benchmarks/tile_bench.py --json "$OUT/tile_bench.json" ${TILE_ARGS:-} \
    2>&1 | tee "$OUT/tile_bench.log" || rc=1
  return $rc
}

run_split() {
  # Split passes (coarse pre-pass + tiles), benchmarks/tile_bench.py: the paper
  # grid's sizes at L 3 and 5, forward (plane kernel, whole tiles, splits at 1-3, the
  # planner's choice) and at L 5 backward; then the ConvNeXt-T stages at 56 and
  # 28 pixels with one or four tiles per plane and splits at 1-2.
  echo "== split passes: tile_bench on the paper grid (L 3-5) and two ConvNeXt-T stages"
  local rc=0 log
  timeout 170 python3 benchmarks/tile_bench.py --levels 3 5 --variants 64:128:4:128 \
    --splits 1 2 3 --json "$OUT/split_paper.json" >"$OUT/split_paper.log" 2>&1 || rc=1
  timeout 170 python3 benchmarks/tile_bench.py --backward --levels 5 \
    --variants 64:128:4:128 --splits 1 2 3 --json "$OUT/split_paper_backward.json" \
    >"$OUT/split_paper_backward.log" 2>&1 || rc=1
  timeout 100 python3 benchmarks/tile_bench.py --configs 64x96x56x56:5 64x192x28x28:4 \
    --variants 64:128:4:128 32:128:4:128 --splits 1 2 --json "$OUT/split_convnext.json" \
    >"$OUT/split_convnext.log" 2>&1 || rc=1
  timeout 100 python3 benchmarks/tile_bench.py --backward --configs 64x96x56x56:5 \
    64x192x28x28:4 --variants 64:128:4:128 32:128:4:128 --splits 1 2 \
    --json "$OUT/split_convnext_backward.json" >"$OUT/split_convnext_backward.log" 2>&1 || rc=1
  for log in split_paper split_paper_backward split_convnext split_convnext_backward; do
    echo "-- $log"
    grep -v "^TileSpec\|^PlaneSpec\|^CoarseSpec\|^CoarseOutSpec\|^FinalizeSpec" "$OUT/$log.log" \
      | cut -c1-400 | tail -n 30
  done
  return $rc
}

run_shallowsplit() {
  # Splits where whole tiles would run (paper grid sizes): the GPU tests of the planner's
  # splits (K of $SHALLOW_KS, default 5; SHALLOW_TESTS=0 skips them), then whole tiles
  # against the planner's own tiles split at 1 and 2, forward and backward, fp32 and bf16
  # ($SHALLOW_CONFIGS: tile_bench.py configurations; $SHALLOW_K: their kernel size).
  # results/h100-2026-12-06c/k3/ ran SHALLOW_TESTS=0 SHALLOW_K=3 SHALLOW_SPLITS=2
  # SHALLOW_CONFIGS="8x64x256x256:3 8x128x512x512:3 8x64x256x256:4 8x128x512x512:4".
  echo "== shallow splits: GPU tests of the planner's splits, then whole tiles against"
  echo "   splits at ${SHALLOW_SPLITS:-1 2} (tile_bench.py, K ${SHALLOW_K:-5})"
  local rc=0 log configs
  if [ "${SHALLOW_TESTS:-1}" != 0 ]; then
    WTCONV_TEST_GPU=1 WTCONV_TEST_KS=${SHALLOW_KS:-5} timeout 420 python3 -m pytest -q -n 12 \
      -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
      -k "split_is_the_default or split_matches" >"$OUT/shallow_tests.log" 2>&1 || rc=1
    tail -n 4 "$OUT/shallow_tests.log"
  fi
  configs=${SHALLOW_CONFIGS:-"8x32x128x128:3 8x128x128x128:3 8x64x256x256:3 8x128x256x256:3 8x64x512x512:3 8x128x512x512:3 8x64x256x256:2 8x128x512x512:2"}
  # shellcheck disable=SC2086
  timeout 280 python3 benchmarks/tile_bench.py --k "${SHALLOW_K:-5}" --backward \
    --configs $configs --variants --auto-splits ${SHALLOW_SPLITS:-1 2} --no-plane \
    --storage float32 bfloat16 --json "$OUT/shallow_backward.json" \
    >"$OUT/shallow_backward.log" 2>&1 || rc=1
  # shellcheck disable=SC2086
  timeout 200 python3 benchmarks/tile_bench.py --k "${SHALLOW_K:-5}" --configs $configs \
    --variants --auto-splits ${SHALLOW_SPLITS:-1 2} --no-plane --storage float32 bfloat16 \
    --json "$OUT/shallow_forward.json" >"$OUT/shallow_forward.log" 2>&1 || rc=1
  for log in shallow_backward shallow_forward; do
    echo "-- $log"
    grep -v "^TileSpec\|^PlaneSpec\|^CoarseSpec\|^CoarseOutSpec\|^FinalizeSpec\|^RegisterSpec\|^FlipSpec\|^LaneSpec" \
      "$OUT/$log.log" | cut -c1-400 | tail -n 30
  done
  return $rc
}

run_splitchunks() {
  echo "== split backward in batch chunks: GPU tests, then the default against the batch whole"
  local rc=0 configs
  if [ "${CHUNK_TESTS:-batch_chunks}" != - ]; then
    WTCONV_TEST_GPU=1 WTCONV_TEST_KS=${CHUNK_KS:-5} timeout 420 python3 -m pytest -q -n 12 \
      -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
      -k "${CHUNK_TESTS:-batch_chunks}" >"$OUT/chunk_tests.log" 2>&1 || rc=1
    tail -n 4 "$OUT/chunk_tests.log"
  fi
  configs=${CHUNK_CONFIGS:-"8x32x128x128:5 8x128x128x128:5 8x64x256x256:5 8x128x256x256:5 8x64x512x512:5 8x128x512x512:5 8x64x256x256:3 8x128x512x512:3"}
  # shellcheck disable=SC2086
  timeout 300 python3 benchmarks/tile_bench.py --backward --configs $configs --variants \
    --split-batches ${CHUNK_SIZES:-8} --no-plane --storage float32 bfloat16 \
    --json "$OUT/chunk_backward.json" >"$OUT/chunk_backward.log" 2>&1 || rc=1
  grep -v "^TileSpec\|^PlaneSpec\|^CoarseSpec\|^CoarseOutSpec\|^FinalizeSpec\|^RegisterSpec\|^FlipSpec\|^LaneSpec\|^PartialSumSpec" \
    "$OUT/chunk_backward.log" | cut -c1-400 | tail -n 30
  return $rc
}

run_registers() {
  echo "== register kernel: GPU tests (and the default split at 28x28), then register_bench.py"
  local rc=0
  WTCONV_TEST_GPU=1 WTCONV_TEST_KS=${TEST_KS} timeout 300 python3 -m pytest -q -x -n 8 \
    -p no:cacheprovider -p no:benchmark -k "register or split_is_the_default" \
    tests/gpu/test_gpu_kernels.py >"$OUT/register_tests.log" 2>&1 || rc=1
  tail -n 5 "$OUT/register_tests.log"
  # shellcheck disable=SC2086  # REG_ARGS is a list of options
  timeout 150 python3 benchmarks/register_bench.py --configs 64x768x7x7:2 64x192x28x28:4 \
    ${REG_ARGS:-} --json "$OUT/register_bench.json" >"$OUT/register_bench.log" 2>&1 || rc=1
  timeout 100 python3 benchmarks/register_bench.py --backward --variants 128:255 \
    --json "$OUT/register_bench_backward.json" >"$OUT/register_bench_backward.log" 2>&1 || rc=1
  grep -hv "^RegisterSpec\|^TileSpec\|^PlaneSpec\|^CoarseSpec\|^FinalizeSpec" \
    "$OUT/register_bench.log" "$OUT/register_bench_backward.log" | cut -c1-600 | tail -n 20
  return $rc
}

run_lanes() {
  # The lane kernels (a plane to one, two or four threads; on at 14 x 14 since c99cd67): their
  # GPU oracle cases, then benchmarks/lanes_ab.py against the plane kernel's
  # weights-only variant and the default forwards at the 14 x 14 stage and half its
  # batch ($LANES_SHAPES), fp32 and bf16. Carry the PTX (scripts/build_ptx_cache.sh
  # lanes): a 14 x 14 variant takes minutes to compile.
  echo "== lane kernel: GPU tests, then lanes_ab.py"
  local rc=0
  if [ "${LANES_TESTS:-}" != "-" ]; then  # "-": the A/B only
    WTCONV_TEST_GPU=1 WTCONV_TEST_KS=${TEST_KS} timeout 240 python3 -m pytest -q -x -n 8 \
      -p no:cacheprovider -p no:benchmark -k "${LANES_TESTS:-lane_kernel}" \
      tests/gpu/test_gpu_kernels.py >"$OUT/lanes_tests.log" 2>&1 || rc=1
    tail -n 5 "$OUT/lanes_tests.log"
  fi
  # shellcheck disable=SC2086  # LANES_SHAPES is a list of shapes
  (cd benchmarks && timeout 320 python3 lanes_ab.py --dtypes fp32 bf16 \
    --shapes ${LANES_SHAPES:-64x384x14x14:3 32x384x14x14:3} ${LANES_SETTINGS:+--settings $LANES_SETTINGS} \
    --json "$OUT/lanes_ab.json") >"$OUT/lanes_ab.log" 2>&1 || rc=1
  grep -v "Spec(" "$OUT/lanes_ab.log" | cut -c1-400 | tail -n 40
  return $rc
}

run_wtconvnext() {
  echo "== WTConvNeXt-T end to end (benchmarks/wtconvnext.py): throughput, then the sanity run"
  timeout 420 python3 benchmarks/wtconvnext.py throughput --json "$OUT/wtconvnext_throughput.json" \
    ${E2E_ARGS:-} >"$OUT/wtconvnext_throughput.log" 2>&1
  local rc=$?
  tail -n 30 "$OUT/wtconvnext_throughput.log"
  timeout 150 python3 benchmarks/wtconvnext.py sanity --json "$OUT/wtconvnext_sanity.json" \
    >"$OUT/wtconvnext_sanity.log" 2>&1 || rc=1
  tail -n 8 "$OUT/wtconvnext_sanity.log"
  return $rc
}

run_ddp() {
  echo "== DistributedDataParallel gradients against one process (benchmarks/ddp_check.py)"
  timeout 200 python3 benchmarks/ddp_check.py --json "$OUT/ddp_check.json" >"$OUT/ddp_check.log" 2>&1
  local rc=$?
  tail -n 15 "$OUT/ddp_check.log"
  return $rc
}

run_hostprofile() {
  echo "== host cost of the torch training path (benchmarks/host_profile.py)"
  timeout 300 python3 benchmarks/host_profile.py >"$OUT/host_profile.txt" 2>&1
  local rc=$?
  head -n 16 "$OUT/host_profile.txt"
  return $rc
}

run_cupyhost() {
  echo "== host cost of the CuPy path's training step (benchmarks/cupy_host_profile.py)"
  (cd benchmarks && timeout 120 python3 cupy_host_profile.py --calls 1000) \
    >"$OUT/cupy_host_profile.txt" 2>&1
  local rc=$?
  head -n 19 "$OUT/cupy_host_profile.txt"
  return $rc
}

run_hoststate() {
  echo "== host cost of the CuPy training step as the process changes (host_state_probe.py)"
  timeout 240 python3 benchmarks/host_state_probe.py --calls 500 --rounds 3 \
    >"$OUT/host_state_probe.txt" 2>&1
  local rc=$?
  cat "$OUT/host_state_probe.txt"
  return $rc
}

run_pdl() {
  echo "== programmatic dependent launch of the recorded programs (benchmarks/pdl_probe.py)"
  # shellcheck disable=SC2086  # PDL_STORAGE is a list of storage names
  (cd benchmarks && timeout "${PDL_TIMEOUT:-480}" python3 pdl_probe.py \
    --storage ${PDL_STORAGE:-float32 bfloat16} --json "$OUT/pdl_probe.json") \
    >"$OUT/pdl_probe.txt" 2>&1
  local rc=$?
  cat "$OUT/pdl_probe.txt"
  return $rc
}

run_fwdhost() {
  echo "== host cost of the CuPy forward per dtype (benchmarks/forward_host_cost.py)"
  timeout 150 python3 benchmarks/forward_host_cost.py --dtypes float32 float16 bfloat16 \
    >"$OUT/forward_host_cost.txt" 2>&1
  local rc=$?
  grep ' kernel ' "$OUT/forward_host_cost.txt"
  return $rc
}

run_splitrule() {
  local args=${SPLITRULE_ARGS:-"--edge 32 --max-read 4.5 --rule level=3 --rule level=3,planes=1,inner=1 --shapes 64x192x28x28:4 --dtypes fp32 bf16"}
  echo "== small-plane split rule A/B (benchmarks/split_threshold.py $args)"
  # shellcheck disable=SC2086  # args is a list of options
  timeout "${SPLITRULE_TIMEOUT:-300}" python3 benchmarks/split_threshold.py $args \
    --jobs "$(nproc)" --json "$OUT/splitrule.json" 2>&1 | tee "$OUT/splitrule.log"
  return "${PIPESTATUS[0]}"
}

run_capsk9() {
  # Register caps where ptxas spilled at K 9 (results/h100-2026-12-07d): the K 9 oracle
  # cases that run the split backward's one-block-an-SM tile (TILE_SOLO_CAP_K9: the
  # planner's own passes on the 255 x 257 planes at L 2, 3 and 5, three dtypes: no
  # forced-tile case plans that tile), and the register backward's K 9 cases at 168 and
  # 200 registers ($CAPS_TESTS, a pytest -k expression; "-" skips them), then two
  # rounds of tile_bench.py (the planner's backward with its tiles' and plane kernels'
  # cap at $CAPS_TILE, against its default: the paper grid's split backward, and at the
  # 56 x 56 and 28 x 28 stages the weights-only plane backward, which spilled 68 / 52 B at
  # 128) and register_bench.py (the 7 x 7 register kernel at $CAPS_REG, backward and
  # forward), fp32 and bf16, every output checked bit for bit against the first run's.
  echo "== K 9 register caps: oracle cases, then tile_bench.py / register_bench.py"
  local rc=0 round pass
  if [ "${CAPS_TESTS:-}" != "-" ]; then
    WTCONV_TEST_GPU=1 WTCONV_TEST_KS=9 timeout "${CAPS_TEST_TIMEOUT:-300}" python3 -m pytest \
      -q -n 8 -p no:cacheprovider -p no:benchmark \
      -k "${CAPS_TESTS:-register_backward or 255x257-L2-K9-s1 or 255x257-L3-K9-s1 or 255x257-L5-K9-s1}" \
      tests/gpu/test_gpu_kernels.py >"$OUT/capsk9_tests.log" 2>&1 || rc=1
    tail -n 3 "$OUT/capsk9_tests.log"
  fi
  # shellcheck disable=SC2086  # CAPS_ROUNDS is a list
  for round in ${CAPS_ROUNDS:-1 2}; do
    # shellcheck disable=SC2086  # CAPS_TILE_CONFIGS, CAPS_TILE and CAPS_REG are lists
    timeout 240 python3 benchmarks/tile_bench.py --backward --k 9 \
      --configs ${CAPS_TILE_CONFIGS:-8x64x256x256:3 8x64x256x256:5 64x96x56x56:5 64x192x28x28:4} \
      --storage float32 bfloat16 --variants --auto-caps ${CAPS_TILE:-128 168} \
      --no-plane --json "$OUT/capsk9_tile_r$round.json" >"$OUT/capsk9_tile_r$round.log" 2>&1 || rc=1
    for pass in backward forward; do
      local flag=(); [ "$pass" = backward ] && flag=(--backward)
      timeout 150 python3 benchmarks/register_bench.py "${flag[@]}" --kernel-size 9 \
        --configs 64x768x7x7:2 --storage float32 bfloat16 --variants ${CAPS_REG:-128:168 128:200} \
        --json "$OUT/capsk9_reg${pass}_r$round.json" >"$OUT/capsk9_reg${pass}_r$round.log" 2>&1 || rc=1
    done
    grep -h "^8x\|^64x" "$OUT"/capsk9_*_r$round.log | cut -c1-400
  done
  return $rc
}

run_tiledtypes() {
  # The paper grid's forward is one tile kernel (L 3) or a coarse pass and two (L 5): 16-bit
  # storage halves its bytes but took 0.450 against 0.340 ms (fp32) at 8x64x256x256, L3
  # (results/h200-2026-12-05/bench_after_fix). Forward and training-step times per dtype
  # (lanes_ab.py's "default" setting: the planner as it stands), on the tree in $AB_BASE
  # first where it is set, then on the working tree, twice each; then ncu of the working
  # tree's L3 tile kernel in float16 (the third of three forwards).
  echo "== the paper grid's passes per dtype (lanes_ab.py --settings default; ncu)"
  local side dir round rc=0 shapes=${TILEDTYPE_SHAPES:-"8x64x256x256:3 8x32x512x512:5"}
  local rest=${PYTHONPATH#"$PWD"}
  rest=${rest#:}
  for round in 1 2; do
    for side in ${AB_BASE:+base} new; do
      dir=$PWD; [ "$side" = base ] && dir=$(cd "$AB_BASE" && pwd)
      echo "-- $side, round $round"
      # shellcheck disable=SC2086  # shapes is a list
      (cd "$dir/benchmarks" && PYTHONPATH="$dir${rest:+:$rest}" timeout 240 python3 lanes_ab.py \
        --settings default --shapes $shapes --dtypes fp32 fp16 bf16 --rounds 1 --repeats 20) \
        >"$OUT/tile_dtypes_${side}_$round.log" 2>&1 || rc=1
      grep " default: fwd " "$OUT/tile_dtypes_${side}_$round.log" | cut -c1-160
    done
  done
  ncu --clock-control none --launch-skip 2 --launch-count 1 --kernel-name regex:wtconv_tile \
    --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum \
    -o "$OUT/tile_float16" python3 benchmarks/forward_host_cost.py --shapes 8x64x256x256:3 \
    --dtypes float16 --launches 3 >"$OUT/tile_float16.log" 2>&1 || rc=1
  ncu -i "$OUT/tile_float16.ncu-rep" --page details >"$OUT/tile_float16.txt" 2>&1
  ncu -i "$OUT/tile_float16.ncu-rep" --page source --csv --print-source sass \
    | gzip >"$OUT/tile_float16_sass.csv.gz"
  rm -f "$OUT/tile_float16.ncu-rep"
  { grep -E "Duration|DRAM Throughput|dram__bytes|Achieved Occupancy|Registers Per" \
      "$OUT/tile_float16.txt"
    python3 benchmarks/sass_hotspots.py "$OUT/tile_float16_sass.csv.gz" --top 8; } 2>&1 \
    | tee "$OUT/tile_dtypes_summary.txt"
  # one archive: the device tool returns a limited number of files
  (cd "$OUT" && tar czf tile_dtypes.tgz tile_dtypes_*.log tile_float16* tile_dtypes_summary.txt \
    && rm -f tile_dtypes_*.log tile_float16*)
  return $rc
}

run_kernelbench() {
  echo "== kernel benchmark"
  timeout 300 python3 benchmarks/kernel_bench.py --json "$OUT/kernel_bench.json" 2>&1 \
    | tee "$OUT/kernel_bench.log"
}

run_bench() {
  echo "== python -m wtconv_cuda.bench"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
  python3 -m wtconv_cuda.bench --out "$OUT" ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  local rc=$?
  tail -n 40 "$OUT/bench.log"
  return $rc
}

run_torchstep() {
  # The PyTorch module's eager path, checked and measured in one short call
  # (~5 min on a cold machine): the variants it needs, its GPU tests, its host
  # cost against the functional path, the ConvNeXt-T stage benchmark and the
  # bf16 network step where host cost shows.
  echo "== torch module path: GPU tests, stage benchmark, WTConvNeXt-T bf16 eager"
  local jobs; jobs=$(nproc); [ "$jobs" -gt 32 ] && jobs=32
  timeout 100 python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 --strides 1 --jobs "$jobs" \
    --storage float32 float16 bfloat16 \
    --planes 29x26 30x27 40x36 64x64 20x31 56x56 28x28 14x14 7x7 16x16 2>&1 | tail -n 1
  WTCONV_TEST_GPU=1 timeout 80 python3 -m pytest -q -rfE -p no:cacheprovider -p no:benchmark \
    tests/gpu/test_bindings_gpu.py \
    -k "module_path or autocast or cuda_graph or zero_copy or module_in_bfloat16" \
    2>&1 | tee "$OUT/gpu_torch_module.log" | tail -n 4
  local rc=${PIPESTATUS[0]}
  timeout 60 python3 benchmarks/module_path_overhead.py --calls 200 --rounds 5 \
    2>&1 | tee "$OUT/module_path_overhead.txt" || rc=1
  timeout 70 python3 -m wtconv_cuda.bench --shapes convnext --dtypes float32 bfloat16 \
    --out "$OUT" >"$OUT/bench.log" 2>&1 || rc=1
  tail -n 24 "$OUT/bench.log"
  timeout 75 python3 benchmarks/wtconvnext.py throughput --nets convnext wtconvnext \
    --dtypes bf16 --modes eager --budget-s 70 --json "$OUT/wtconvnext_bf16_eager.json" \
    >"$OUT/wtconvnext_bf16_eager.log" 2>&1 || rc=1
  tail -n 6 "$OUT/wtconvnext_bf16_eager.log"
  return $rc
}

run_stepprofile() {
  # Host issue time, GPU busy time and kernel time by category of a
  # WTConvNeXt-T and a ConvNeXt-T step (benchmarks/step_profile.py), bf16 and fp32.
  echo "== WTConvNeXt-T step profile (benchmarks/step_profile.py)"
  local rc=0 dtype
  for dtype in bf16 fp32; do
    (cd benchmarks && timeout 200 python3 step_profile.py --dtype "$dtype" \
      --out "$OUT/step_profile_$dtype.json") >"$OUT/step_profile_$dtype.log" 2>&1 || rc=1
    grep -E " step .* host " "$OUT/step_profile_$dtype.log" | sed "s/^/$dtype /"
  done
  return $rc
}

run_sanitizer() {
  if [ -x scripts/sanitizer.sh ]; then bash scripts/sanitizer.sh; else echo "no scripts/sanitizer.sh"; fi
}

run_ab() {
  local base=${AB_BASE:?"set AB_BASE to a folder holding the base tree"}
  base=$(cd "$base" && pwd) || return 1
  echo "== A/B of kernel times: $base against the working tree"
  local jobs configs rc=0 side round
  # the plane sizes and levels kernel_bench.py times, as warmup's HxW:L
  read -ra configs < <(cd benchmarks && python3 -c 'from kernel_bench import CONFIGS
print(*sorted({f"{h}x{w}:{lv}" for _, _, h, w, lv, _ in CONFIGS}))')
  local rest=${PYTHONPATH#"$PWD"}
  rest=${rest#:}
  local base_path="$base${rest:+:$rest}"
  jobs=$(( $(nproc) / 2 )); [ "$jobs" -ge 1 ] || jobs=1
  # Both trees' variants compile at once; the cache is keyed by source, so the
  # kernels the trees share compile once. (`python -m` puts the current folder
  # first on sys.path: the base runs from its own folder.)
  (cd "$base" && PYTHONPATH=$base_path python3 -m wtconv_cuda.kernels.warmup \
    --kernel-sizes 5 --strides 1 --storage float32 --configs "${configs[@]}" --jobs "$jobs") \
    >"$OUT/ab_warmup_base.log" 2>&1 &
  local pid=$!
  python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 --strides 1 --storage float32 \
    --configs "${configs[@]}" --jobs "$jobs" >"$OUT/ab_warmup_new.log" 2>&1 || rc=1
  wait $pid || rc=1
  (
    for round in 1 2; do
      for side in base new; do
        echo "-- $side, round $round"
        if [ "$side" = base ]; then
          # shellcheck disable=SC2086  # AB_ARGS is a list of options
          (cd "$base" && PYTHONPATH=$base_path timeout 240 python3 \
            benchmarks/kernel_bench.py --dtypes float32 ${AB_ARGS:-} \
            --json "$OUT/ab_${side}_$round.json") || rc=1
        else
          # shellcheck disable=SC2086
          timeout 240 python3 benchmarks/kernel_bench.py --dtypes float32 ${AB_ARGS:-} \
            --json "$OUT/ab_${side}_$round.json" || rc=1
        fi
      done
    done
    exit $rc
  ) 2>&1 | tee "$OUT/ab.log" || rc=1
  return $rc
}

for phase in "${phases[@]}"; do
  case "$phase" in
    kernels|bindings|ncu|profile|tune|kernelbench|bench|sanitizer|wtconvnext|ddp|hostprofile|cupyhost|hoststate|pdl|fwdhost|torchstep|stepprofile|tiles|tileplanes|blockedw|streams|shallowsplit|splitchunks|tileprofile|stageprofile|split|registers|ab|bwdprofile|hotspots|tilehotspots|lanes|lanehotspots|tiledtypes|splitrule|capsk9)
      "run_$phase" || status=1 ;;
    *) echo "unknown phase: $phase"; status=2 ;;
  esac
done
exit $status
