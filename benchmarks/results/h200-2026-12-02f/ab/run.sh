# The weights-only backward with its plane's level table compiled in (this tree)
# against ab_base (git archive 545a567 wtconv_cuda): both trees' K 5 variants of the
# ConvNeXt-T stages compiled side by side, then benchmarks/dx_forward_bench.py, the
# two trees alternately, twice; the split forward's coarse problem under other launch
# shapes (benchmarks/split_stages.py); then the backward's GPU oracle cases at K 5.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
start=$SECONDS
for tree in ab_base .; do
  (cd /tmp && PYTHONPATH=$OLDPWD/$tree python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 \
    --storage float32 bfloat16 --strides 1 --configs 56x56:5 28x28:4 14x14:3 --jobs 8 2>&1 | tail -n 1) &
done
wait
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
timeout 100 python3 benchmarks/split_stages.py --configs 64x192x28x28:4 64x384x14x14:3 \
  --coarse-tunings default registers=true,threads=32 registers=true,threads=64 registers=false \
  > "$OUT/coarse.log" 2>&1; echo "coarse rc $? at $((SECONDS - start)) s"
grep -E "coarse|stages" "$OUT/coarse.log"
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout $((570 - SECONDS + start)) python3 -m pytest -v -rfE \
  -n 14 -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "dx_in or dx_forward or batch_chunked or fused or (matches_oracle and not tiled and not split and not register)" \
  >"$OUT/gpu_k5.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu_k5.log"; grep -E "FAILED|ERROR" "$OUT/gpu_k5.log" | head -20; tail -n 2 "$OUT/gpu_k5.log"
