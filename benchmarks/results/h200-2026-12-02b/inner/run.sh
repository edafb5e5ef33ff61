# Inner levels (the coarse levels in the tile's block) against the split they replace:
# benchmarks/split_stages.py at the 56 and 28 stages, then the GPU oracle cases that run
# them (K 5: the inner-level, split and dx-chunk tests, and the 56 x 56 sweep cases).
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
timeout 200 python3 benchmarks/split_stages.py --json "$OUT/stages.json" 2>&1 \
  | grep -v "^Compil" | tee "$OUT/stages.log"
echo "stages done at $((SECONDS - start)) s"
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout $((560 - SECONDS + start)) python3 -m pytest -v -rfE \
  -n 14 -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "inner_levels or split_is_the_default or dx_forward_chunks or 56x56" >"$OUT/gpu_k5.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu_k5.log"; grep -E "FAILED|ERROR" "$OUT/gpu_k5.log" | head -20
tail -n 3 "$OUT/gpu_k5.log"
