# As much of the K 9 oracle sweep as the session's last device minutes allow.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=9 timeout 290 python3 -m pytest -v -rfE -n 15 \
  -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py >"$OUT/gpu_k9.log" 2>&1
echo "pytest K9 rc $?"; grep -c PASSED "$OUT/gpu_k9.log"
grep -E "FAILED|ERROR" "$OUT/gpu_k9.log" | head -20; tail -n 2 "$OUT/gpu_k9.log"
