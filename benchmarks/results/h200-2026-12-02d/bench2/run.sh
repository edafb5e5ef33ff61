# The user benchmark at the ConvNeXt-T stages, fp32 and bf16 (the README's table), on
# the tree named in ../README.md.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
export PYTHONPATH=$PWD
timeout 560 python3 -m wtconv_cuda.bench --shapes convnext --dtypes fp32 bf16 \
  --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $((SECONDS - start)) s"
[ -d "$OUT/bench" ] && tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
grep -A 11 "^Inference" "$OUT/bench.log"; grep -A 11 "^Training" "$OUT/bench.log"
grep -iE "host|memory" "$OUT/bench.log" | head -20
