# Recorded launch programs (wtconv_cuda/kernels/program.py): the CuPy path and the PyTorch
# binding replay each problem's launches instead of planning every call. The bindings'
# and reliability GPU suites on this tree; the host cost of a forward (forward_host_cost.py)
# in ab_base (git archive d65fd26 wtconv_cuda benchmarks/*.py) and this tree; the CuPy
# training step's host cost piece by piece; the user benchmark at the ConvNeXt-T stages.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
start=$SECONDS
WTCONV_TEST_GPU=1 PYTHONPATH=$PWD timeout 300 python3 -m pytest -q -rfE -n 12 \
  -p no:cacheprovider -p no:benchmark tests/gpu/test_bindings_gpu.py \
  tests/gpu/test_reliability_gpu.py >"$OUT/gpu.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"; tail -n 12 "$OUT/gpu.log"
{
for tree in ab_base .; do
  echo "== $tree"
  (cd $tree && PYTHONPATH=$PWD timeout 45 python3 benchmarks/forward_host_cost.py \
    --shapes 64x384x14x14:3 64x768x7x7:2 1x8x16x16:3 2>&1 | grep -E "^[0-9]+x")
done
echo "at $((SECONDS - start)) s"
} 2>&1 | tee "$OUT/ab.log"
(cd benchmarks && PYTHONPATH=.. timeout 45 python3 cupy_host_profile.py --calls 1000) \
  > "$OUT/cupy_host_profile.txt" 2>&1
head -n 20 "$OUT/cupy_host_profile.txt"
PYTHONPATH=$PWD timeout $((585 - SECONDS + start)) python3 -m wtconv_cuda.bench --shapes convnext \
  --dtypes fp32 bf16 --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $((SECONDS - start)) s"
[ -d "$OUT/bench" ] && tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
grep -A 11 "^Inference" "$OUT/bench.log"; grep -A 11 "^Training" "$OUT/bench.log"; grep -A 6 "^Host" "$OUT/bench.log"
