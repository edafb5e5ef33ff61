# The register kernel's staging load unrolled, its loads ahead of their stores
# (STAGING_LOADS = 64 in this tree, 16 in ab_u16), against ab_base (git archive
# 6e86eed wtconv_cuda: one load and its store per loop iteration). fp32 and bf16,
# K 5: the three trees' variants compiled side by side; then the 7 x 7 stage on the
# register kernel (forward, backward), the split forwards' stages at 28 and 14 and at
# the batch chunks of a 14 x 14 dx (16 and 32, split forced), the backward; then the
# register kernel's and the split's GPU oracle cases until the deadline.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
start=$SECONDS
for tree in ab_base ab_u16 .; do
  (cd /tmp && PYTHONPATH=$OLDPWD/$tree python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 \
    --storage float32 bfloat16 --strides 1 --configs 28x28:4 14x14:3 7x7:2 --jobs 5 2>&1 \
    | tail -n 1) &
done
wait
echo "warm at $((SECONDS - start)) s"
SMALL=split=1,tile=16,threads=32,strip=2
{
for tree in ab_base ab_u16 .; do
  echo "== $tree"
  PYTHONPATH=$tree timeout 60 python3 benchmarks/register_bench.py --variants 128:168 \
    --json "$OUT/reg_fwd_${tree#ab_}.json" 2>&1 | grep -v "^Compil" | tail -n 8
  PYTHONPATH=$tree timeout 60 python3 benchmarks/register_bench.py --variants 128:168 \
    --backward --json "$OUT/reg_bwd_${tree#ab_}.json" 2>&1 | grep -v "^Compil" | tail -n 8
  [ "$tree" = ab_u16 ] && continue
  PYTHONPATH=$tree timeout 60 python3 benchmarks/split_stages.py \
    --configs 64x192x28x28:4 64x384x14x14:3 --whole-tunings default 2>&1 | grep -E "whole|stages"
  PYTHONPATH=$tree timeout 90 python3 benchmarks/split_stages.py --configs 32x384x14x14:3 \
    16x384x14x14:3 64x96x14x14:3 --split-tuning $SMALL --whole-tunings default $SMALL 2>&1 \
    | grep -E "whole|stages|x14"
  PYTHONPATH=$tree timeout 90 python3 benchmarks/dx_forward_bench.py \
    --json "$OUT/dx_${tree#ab_}.json" 2>&1 | grep -v "^Compil" || echo "rc $?"
  echo "at $((SECONDS - start)) s"
done
} 2>&1 | tee "$OUT/ab.log"
export PYTHONPATH=$PWD
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=3,5 timeout $((570 - SECONDS + start)) python3 -m pytest -v -rfE \
  -n 15 -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "register or split_matches or dx_in" >"$OUT/gpu.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu.log"; grep -E " FAILED | ERROR " "$OUT/gpu.log" | head -20; tail -n 2 "$OUT/gpu.log"
