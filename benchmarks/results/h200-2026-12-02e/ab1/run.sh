# The level-tap reductions by tap row and the raw-LL chains by 2 x 2 quads (this tree)
# against ab_base (git archive fd98bb8 wtconv_cuda): both trees' K 5 variants of the
# ConvNeXt-T stages compiled in parallel, then benchmarks/dx_forward_bench.py (the backward
# with dx in the plane kernel / the planner's default / dx on the whole batch), the two
# trees alternately, twice; then the backward GPU oracle cases at K 5.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
for tree in ab_base .; do
  PYTHONPATH=$tree python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 --storage float32 bfloat16 \
    --strides 1 --configs 56x56:5 28x28:4 14x14:3 --jobs 15 2>&1 | tail -n 1
done
echo "warm at $((SECONDS - start)) s"
{
for round in 1 2; do
  for tree in ab_base .; do
    tag=$([ "$tree" = . ] && echo after || echo before)
    echo "== $tag (round $round)"
    PYTHONPATH=$tree timeout 120 python3 benchmarks/dx_forward_bench.py \
      --json "$OUT/${tag}_$round.json" 2>&1 | grep -v "^Compil" || echo "rc $?"
    echo "at $((SECONDS - start)) s"
  done
done
} 2>&1 | tee "$OUT/backward.log"
export PYTHONPATH=$PWD
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout $((560 - SECONDS + start)) python3 -m pytest -v -rfE \
  -n 14 -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "batch_chunked or fused or dx_in or dx_forward or two_planes or (matches_oracle and not tiled and not split and not register)" \
  >"$OUT/gpu_k5.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu_k5.log"; grep -E "FAILED|ERROR" "$OUT/gpu_k5.log" | head -20; tail -n 2 "$OUT/gpu_k5.log"
