# As run from the repository root in the device tool (OUT set); see ../README.md.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv > $OUT/env.log
timeout 250 python3 benchmarks/kernel_bench.py --dtypes float32 --json $OUT/kernel_bench.json > $OUT/kernel_bench.log 2>&1
grep -iE "ms|56|28|14" $OUT/kernel_bench.log | head -30
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout 300 python3 -m pytest -p no:cacheprovider -q -rf -n 12 \
  tests/gpu/test_gpu_kernels.py > $OUT/gpu_k5.log 2>&1
tail -8 $OUT/gpu_k5.log
