# ncu source counters of the 56 x 56 forward's tile kernel with the inner levels (and the
# 28 x 28 split's tiles), then the inner-level GPU tests of the final planner rule.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
OUT=$OUT/tile timeout 300 bash scripts/device_check.sh tilehotspots > "$OUT/tile.log" 2>&1
echo "tilehotspots rc $? at $((SECONDS - start)) s"
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout $((560 - SECONDS + start)) python3 -m pytest -v -rfE \
  -n 14 -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "inner_levels or split_is_the_default or dx_forward_chunks" >"$OUT/gpu_k5.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu_k5.log"; grep -E "FAILED|ERROR" "$OUT/gpu_k5.log" | head -20
tail -n 2 "$OUT/gpu_k5.log"
cat "$OUT/tile/hotspots_summary.txt"
tar czf "$OUT/tile.tgz" -C "$OUT" tile && rm -rf "$OUT/tile"
