# The bindings' and reliability GPU suites on 2327759 (recorded launch programs), one line
# per test as it finishes (the previous call's quiet log lost its one failure to the time
# limit), then the binding overhead (benchmarks/binding_overhead.py) with the time left.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
start=$SECONDS
WTCONV_TEST_GPU=1 PYTHONPATH=$PWD timeout 420 python3 -m pytest -v -rfE --tb=short -n 14 \
  -p no:cacheprovider -p no:benchmark tests/gpu/test_bindings_gpu.py \
  tests/gpu/test_reliability_gpu.py >"$OUT/gpu.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu.log"; grep -E "FAILED|ERROR" "$OUT/gpu.log" | head -20; tail -n 3 "$OUT/gpu.log"
PYTHONPATH=$PWD timeout $((560 - SECONDS + start)) python3 benchmarks/binding_overhead.py \
  > "$OUT/binding_overhead.json" 2> "$OUT/binding_overhead.err"
echo "overhead rc $? at $((SECONDS - start)) s"; tail -c 1500 "$OUT/binding_overhead.json"
