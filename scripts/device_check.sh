#!/usr/bin/env bash
# One device call: install what the image lacks, compile the kernels, run the
# GPU test suite, the benchmark and an Nsight Compute byte count.
#
#   bash scripts/device_check.sh [quick]
#
# Logs and JSON land in $OUT (the device tool's output folder) or ./device_out.
# Wheels the image lacks can be carried in .whl/ (see the device README); the
# package itself needs none: it restores numpy.row_stack for numba-cuda 0.30 on
# NumPy >= 2.5 (wtconv_cuda/kernels/_numba_compat.py).
set -uo pipefail
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
MODE=${1:-full}
export PYTHONUNBUFFERED=1
export WTCONV_CUDA_CACHE=${WTCONV_CUDA_CACHE:-/tmp/wtconv_cache}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
status=0

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
  python3 -c "import numpy, numba, cupy, torch; from importlib.metadata import version as v; print('numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', v('numba-cuda'), 'cupy', cupy.__version__, 'torch', torch.__version__)"
} 2>&1 | tee "$OUT/env.log"

# Knobs: TEST_KS (kernel sizes of the oracle sweep, default 3,5,7,9), REPORT=1 (load
# every compiled variant and record registers/local memory: slow, ~1 s per kernel).
TEST_KS=${TEST_KS:-3,5,7,9}
echo "== compile kernel variants"
report=(); [ "${REPORT:-0}" = 1 ] && report=(--report "$OUT/kernels.json")
python3 -m wtconv_cuda.kernels.warmup --kernel-sizes ${TEST_KS//,/ } --strides 1 2 --jobs 16 \
  --planes 17x23 56x56 255x257 1x7 28x28 14x14 7x7 16x16 "${report[@]}" \
  2>&1 | tee "$OUT/warmup.log" || status=1

echo "== GPU tests (kernel sizes $TEST_KS)"
if [ "$MODE" = quick ]; then sel=(-k "float32 and (2, 3, 17, 23)"); else sel=(); fi
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=$TEST_KS timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -x \
  -n 8 -p no:cacheprovider -p no:benchmark tests/gpu "${sel[@]}" \
  2>&1 | tee "$OUT/gpu_tests.log" | tail -n 25 || status=1

echo "== benchmark"
python3 benchmarks/kernel_bench.py --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" || status=1

echo "== HBM bytes (ncu, forward + backward at 64x96x56x56, L5, K5, fp32)"
ncu --clock-control none --launch-skip 3 --launch-count 3 --kernel-name regex:wtconv \
  --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum --csv \
  python3 benchmarks/ncu_target.py 64 96 56 56 5 5 >"$OUT/ncu.csv" 2>"$OUT/ncu.err" || status=1
python3 - "$OUT/ncu.csv" <<'EOF' | tee "$OUT/ncu_summary.txt"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, body = rows[0], rows[1:]
ix = {n: head.index(n) for n in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value")}
x_bytes = 64 * 96 * 56 * 56 * 4
for r in body:
    name = r[ix["Kernel Name"]][:40]
    value = float(r[ix["Metric Value"]].replace(",", ""))
    unit = r[ix["Metric Unit"]]
    scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit)
    extra = f"  = {value * scale / x_bytes:.3f} x bytes(x)" if scale else ""
    print(f"{name:40s} {r[ix['Metric Name']]:28s} {value:12.3f} {unit}{extra}")
EOF
exit $status
