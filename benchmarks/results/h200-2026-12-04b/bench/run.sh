# Tree 0498af5 (the 14 x 14 rule of 96efbc2, bfloat16 CuPy arrays): the user benchmark at the
# ConvNeXt-T stages, fp32 and bf16, with the CuPy path in both (the README's table).
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
timeout 225 python3 -m wtconv_cuda.bench --shapes convnext --dtypes fp32 bf16 --out "$OUT/bench" \
  2>&1 | grep -v "^Compil" | tail -n 45 | tee "$OUT/bench.log"
