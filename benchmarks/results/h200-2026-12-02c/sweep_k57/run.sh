# The GPU oracle cases that run the changed kernels (tile strip orders, coarse pre-pass) at
# K 7 and 5: the tiled, split and inner-level tests and the sweep's 56 x 56 and 255 x 257
# planes (tiles, inner levels and splits by default), after a warmup of their variants.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
TEST_KS=7,5 TEST_WORKERS=14 TEST_TIMEOUT=330 WARM_PLANES="56x56 255x257 130x67 257x300" \
  TEST_FILTER="tiled or split or inner or 56x56 or 255x257" \
  bash scripts/device_check.sh kernels 2>&1 | tail -n 30
