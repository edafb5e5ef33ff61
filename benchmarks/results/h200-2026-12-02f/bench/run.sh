# The user benchmark on ac67398 (the weights-only backward with its plane's level table
# compiled in): python -m wtconv_cuda.bench --shapes convnext --dtypes fp32 bf16, after
# the ConvNeXt-T stages' variants and the host-overhead shape are compiled; then the
# weights-only and dx-path GPU oracle cases at K 3 until the deadline.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p "$WTCONV_CUDA_CACHE"
start=$SECONDS
python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 --storage float32 bfloat16 \
  --strides 1 --configs 56x56:5 28x28:4 14x14:3 7x7:2 16x16:3 --jobs 15 2>&1 | tail -n 1
echo "warm at $((SECONDS - start)) s"
timeout 200 python3 -m wtconv_cuda.bench --shapes convnext --dtypes fp32 bf16 \
  --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $((SECONDS - start)) s"
[ -d "$OUT/bench" ] && tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
grep -A 11 "^Inference" "$OUT/bench.log"; grep -A 11 "^Training" "$OUT/bench.log"
grep -A 11 "^Peak" "$OUT/bench.log"; grep -A 6 "^Host" "$OUT/bench.log"
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=3 timeout $((450 - SECONDS + start)) python3 -m pytest -v -rfE \
  -n 15 -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "dx_in or dx_forward or batch_chunked" >"$OUT/gpu_k3.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu_k3.log"; grep -E " FAILED | ERROR " "$OUT/gpu_k3.log" | head -20; tail -n 2 "$OUT/gpu_k3.log"
