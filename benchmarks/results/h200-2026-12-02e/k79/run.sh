# The backward's GPU oracle cases at K 7 and 9 on 1436714 (tap-row reductions, quad LL
# chains, quad loads of float32 planes): the weights-only and one-kernel backward cases,
# until the deadline (kernels compile on first use, in each worker).
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p "$WTCONV_CUDA_CACHE"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=7,9 timeout 260 python3 -m pytest -v -rfE \
  -n 15 -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "dx_in or batch_chunked or fused" >"$OUT/gpu_k79.log" 2>&1
echo "pytest rc $?"
grep -c PASSED "$OUT/gpu_k79.log"; grep -E "FAILED|ERROR" "$OUT/gpu_k79.log" | head -20; tail -n 2 "$OUT/gpu_k79.log"
