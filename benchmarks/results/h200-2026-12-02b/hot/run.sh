# ncu source counters, loop by loop: the split forward's tile kernel (56 L5, 28 L4), then the
# weights-only plane backward (56, 28, 14). Carried PTX in .ptxcache/ warms the kernel cache.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
OUT=$OUT/tile timeout 300 bash scripts/device_check.sh tilehotspots > "$OUT/tile.log" 2>&1
echo "tilehotspots rc $? at $((SECONDS - start)) s"
OUT=$OUT/bwd timeout $((560 - SECONDS + start)) bash scripts/device_check.sh hotspots > "$OUT/bwd.log" 2>&1
echo "hotspots rc $? at $((SECONDS - start)) s"
