# The tiled, split and inner-level GPU oracle cases at K 3 on b3bbe96's kernels (the
# compile-time plane, the strip rule), until the session's device time runs out.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
export PYTHONPATH=$PWD
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=3 timeout 170 python3 -m pytest -v -rfE -n 14 \
  -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "tiled or split or inner" >"$OUT/gpu_k3.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu_k3.log"; grep -E "FAILED|ERROR" "$OUT/gpu_k3.log" | head -20; tail -n 2 "$OUT/gpu_k3.log"
