# The user benchmark at the ConvNeXt-T stages (fp32, bf16), then as much of the
# K 7 oracle sweep as the call leaves.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 --strides 1 --storage float32 bfloat16 \
  --configs 56x56:5 28x28:4 14x14:3 7x7:2 16x16:1 16x16:3 --jobs 16 >"$OUT/warmup.log" 2>&1
echo "warmup: $((SECONDS - start)) s"
timeout 330 python3 -m wtconv_cuda.bench --out "$OUT" --shapes convnext --dtypes fp32 bf16 \
  >"$OUT/bench.log" 2>&1
echo "bench rc $? at $((SECONDS - start)) s"; tail -n 45 "$OUT/bench.log"
left=$((540 - SECONDS + start))
if [ $left -gt 60 ]; then
  WTCONV_TEST_GPU=1 WTCONV_TEST_KS=7 timeout $left python3 -m pytest -v -rfE -n 14 \
    -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py >"$OUT/gpu_k7.log" 2>&1
  echo "pytest K7 rc $? at $((SECONDS - start)) s"; grep -c PASSED "$OUT/gpu_k7.log"
  grep -E "FAILED|ERROR" "$OUT/gpu_k7.log" | head -20; tail -n 2 "$OUT/gpu_k7.log"
fi
