# The register kernel's GPU oracle cases (forward and backward, K 3-9) on the
# sources of d65fd26: the twenty-fifth session's staging load had run them only
# in the simulator.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
start=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
WTCONV_TEST_GPU=1 PYTHONPATH=$PWD timeout 500 python3 -m pytest -v -rfE -n 14 \
  -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "register" >"$OUT/gpu.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu.log"; grep -E " FAILED | ERROR " "$OUT/gpu.log" | head; tail -n 1 "$OUT/gpu.log"
