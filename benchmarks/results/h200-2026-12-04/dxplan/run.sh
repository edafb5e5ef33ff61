# The dx forward's per-chunk plan (dx_forward_plan: splits where their buffers fit, else
# the forward without a split on the fewest chunks) and SPLIT_SMALL_TILES[16].min_pixels
# 2^22 -> 2^21, against ab_base (git archive d65fd26 wtconv_cuda benchmarks). GPU cases of
# the dx path and the splits at K 5; the backward at the ConvNeXt-T stages in both trees
# (each tree's own dx_forward_bench.py); the split forward at 14 x 14 batches around the
# new threshold, planner's choice against split=0 (the plane kernel); the host cost of a
# forward at those shapes (back to back and per call); the CuPy training step's host cost.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
start=$SECONDS
(cd /tmp && PYTHONPATH=$OLDPWD/ab_base python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 \
  --storage float32 bfloat16 --strides 1 --configs 56x56:5 28x28:4 14x14:3 --jobs 5 2>&1 | tail -n 1) &
(cd /tmp && PYTHONPATH=$OLDPWD python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 \
  --storage float32 bfloat16 --strides 1 --configs 56x56:5 28x28:4 14x14:3 7x7:2 16x16:3 \
  --jobs 10 2>&1 | tail -n 1) &
wait
echo "warm at $((SECONDS - start)) s"
WTCONV_TEST_KS=5 WTCONV_TEST_GPU=1 PYTHONPATH=$PWD timeout 170 python3 -m pytest -v -rfE -n 14 \
  -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "dx or convnext_stage or split_matches or split_is" >"$OUT/gpu.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu.log"; grep -E " FAILED | ERROR " "$OUT/gpu.log" | head; tail -n 1 "$OUT/gpu.log"
{
for tree in ab_base .; do
  name=$([ $tree = . ] && echo after || echo before)
  echo "== $tree"
  (cd $tree && PYTHONPATH=$PWD timeout 90 python3 benchmarks/dx_forward_bench.py \
    --json "$OUT/dx_$name.json" 2>&1 | grep -v "^Compil")
  echo "at $((SECONDS - start)) s"
done
echo "== split forward, planner's choice (default) and the plane kernel (split=0)"
PYTHONPATH=$PWD timeout 60 python3 benchmarks/split_stages.py \
  --configs 32x384x14x14:3 28x384x14x14:3 64x192x14x14:3 16x384x14x14:3 \
  --whole-tunings default split=0 2>&1 | grep -v "^Compil"
echo "== host cost of a forward"
PYTHONPATH=$PWD timeout 60 python3 benchmarks/forward_host_cost.py \
  --shapes 32x384x14x14:3 64x768x7x7:2 1x8x16x16:3 2>&1 | grep -E "^[0-9]+x"
echo "at $((SECONDS - start)) s"
} 2>&1 | tee "$OUT/ab.log"
(cd benchmarks && PYTHONPATH=.. timeout 90 python3 cupy_host_profile.py --calls 1000) \
  > "$OUT/cupy_host_profile.txt" 2>&1
head -n 19 "$OUT/cupy_host_profile.txt"
echo "done at $((SECONDS - start)) s"
