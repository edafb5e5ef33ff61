# Tree: this folder's commit (bfloat16 CuPy arrays through wtconv_cuda.forward and a Tape).
# The public-API GPU cases (bfloat16 new; float32; float64 and ints rejected), then the user
# benchmark at the ConvNeXt-T stages in bfloat16, which now times the CuPy path too.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout 150 python3 -m pytest -v -n 4 -p no:cacheprovider \
  tests/gpu/test_gpu_kernels.py tests/gpu/test_reliability_gpu.py \
  -k "public_api or float64_rejected or unsupported_dtypes" 2>&1 \
  | grep -E "PASSED|FAILED|ERROR|passed|failed|Error|assert" | tee "$OUT/gpu.log" | tail -n 12
timeout 240 python3 -m wtconv_cuda.bench --shapes convnext --dtypes bf16 --out "$OUT/bench" \
  2>&1 | grep -v "^Compil" | tail -n 40 | tee "$OUT/bench.log"
