# The K 9 cases run.sh's call did not reach (left2_k9.txt), on the same warm machine.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
here=benchmarks/results/h200-2026-12-02/sweep
echo "cached PTX: $(ls "$WTCONV_CUDA_CACHE" | grep -c ptx$)"
ids=$(sed "s|^|tests/gpu/test_gpu_kernels.py::|" "$here/left2_k9.txt")
# shellcheck disable=SC2086  # ids is a list of node ids
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=9 timeout 440 python3 -m pytest -v -rfE -n 14 \
  -p no:cacheprovider -p no:benchmark $ids >"$OUT/gpu_k9b.log" 2>&1
echo "K 9: pytest rc $?, $(grep -c PASSED "$OUT/gpu_k9b.log") passed"
grep -E "FAILED|ERROR" "$OUT/gpu_k9b.log" | head -20; tail -n 2 "$OUT/gpu_k9b.log"
