# The user benchmark at the ConvNeXt-T stages, fp32 and bf16 (JSON and plot in one archive:
# the device tool returns a limited number of files).
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
timeout 400 python3 -m wtconv_cuda.bench --shapes convnext --dtypes fp32 bf16 --out "$OUT/bench" \
  > "$OUT/bench.log" 2>&1
echo "bench rc $?"; tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
grep -A 12 "^Inference" "$OUT/bench.log"
