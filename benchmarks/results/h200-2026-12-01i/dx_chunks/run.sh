# dx from the forward kernels in batch chunks: backward times at the ConvNeXt-T stages
# (benchmarks/dx_forward_bench.py, fp32 and bf16), then the K 5 oracle sweep.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
echo "cached PTX: $(ls "$WTCONV_CUDA_CACHE" | grep -c ptx$)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
git log -1 --format=%H 2>/dev/null | tee -a "$OUT/env.log"
start=$SECONDS
python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 --strides 1 --storage float32 bfloat16 \
  --configs 56x56:5 28x28:4 14x14:3 --jobs 16 >"$OUT/warmup.log" 2>&1
echo "warmup: $((SECONDS - start)) s"
timeout 220 python3 benchmarks/dx_forward_bench.py --json "$OUT/dx_forward.json" 2>&1 \
  | tee "$OUT/dx_forward.log"
echo "bench done at $((SECONDS - start)) s"
left=$((530 - SECONDS + start)); [ $left -gt 60 ] || left=60
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout $left python3 -m pytest -v -rfE -n 14 \
  -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py >"$OUT/gpu_k5.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"; grep -c PASSED "$OUT/gpu_k5.log"; grep -E "FAILED|ERROR" "$OUT/gpu_k5.log" | head -20; tail -n 3 "$OUT/gpu_k5.log"
