# Two changes (this tree) against ab_base (git archive 9244b6e wtconv_cuda: the level
# table compiled in): the base taps' products as one fused multiply-add each (the
# weights-only, one-kernel and tile backwards), and the register kernel's taps loaded
# before a subband's first product (the split forwards' coarse problem at 28 and 14).
# fp32, K 5: both trees' variants compiled side by side, then dx_forward_bench.py and
# split_stages.py, the trees alternately, twice; then GPU oracle cases until the deadline.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
start=$SECONDS
for tree in ab_base .; do
  (cd /tmp && PYTHONPATH=$OLDPWD/$tree python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 \
    --storage float32 --strides 1 --configs 56x56:5 28x28:4 14x14:3 --jobs 8 2>&1 | tail -n 1) &
done
wait
echo "warm at $((SECONDS - start)) s"
{
for round in 1 2; do
  for tree in ab_base .; do
    tag=$([ "$tree" = . ] && echo after || echo before)
    echo "== $tag (round $round)"
    PYTHONPATH=$tree timeout 60 python3 benchmarks/dx_forward_bench.py --storage float32 \
      --json "$OUT/${tag}_$round.json" 2>&1 | grep -v "^Compil" || echo "rc $?"
    PYTHONPATH=$tree timeout 60 python3 benchmarks/split_stages.py \
      --configs 64x192x28x28:4 64x384x14x14:3 --whole-tunings default 2>&1 | grep -E "whole|stages"
    echo "at $((SECONDS - start)) s"
  done
done
} 2>&1 | tee "$OUT/ab.log"
export PYTHONPATH=$PWD
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout $((300 - SECONDS + start)) python3 -m pytest -v -rfE \
  -n 15 -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "dx_in or batch_chunked or tiled_backward_matches or split_matches" >"$OUT/gpu_k5.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu_k5.log"; grep -E " FAILED | ERROR " "$OUT/gpu_k5.log" | head -20; tail -n 2 "$OUT/gpu_k5.log"
