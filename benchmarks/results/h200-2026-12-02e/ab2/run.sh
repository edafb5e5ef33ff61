# The weights-only backward's load of x and dy by 2 x 2 quads (this tree) against ab_base
# (git archive 2a5b2a8 wtconv_cuda: tap-row reductions and quad LL chains):
# benchmarks/dx_forward_bench.py, the two trees alternately, twice; the user benchmark on
# this tree; then the weights-only backward's GPU oracle cases at K 5 until the deadline.
# (`python -m` puts the working directory first on sys.path: the warmup compiles this
# tree; ab_base's differing variants compile on first use.)
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 --storage float32 bfloat16 \
  --strides 1 --configs 56x56:5 28x28:4 14x14:3 7x7:2 16x16:3 --jobs 15 2>&1 | tail -n 1
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
timeout 150 python3 -m wtconv_cuda.bench --shapes convnext --dtypes fp32 bf16 \
  --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $((SECONDS - start)) s"
[ -d "$OUT/bench" ] && tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
grep -A 11 "^Inference" "$OUT/bench.log"; grep -A 11 "^Training" "$OUT/bench.log"; grep -A 6 "^Host" "$OUT/bench.log"
export PYTHONPATH=$PWD
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout $((440 - SECONDS + start)) python3 -m pytest -v -rfE \
  -n 14 -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "dx_in or dx_forward or batch_chunked or fused" >"$OUT/gpu_k5.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu_k5.log"; grep -E "FAILED|ERROR" "$OUT/gpu_k5.log" | head -20; tail -n 2 "$OUT/gpu_k5.log"
