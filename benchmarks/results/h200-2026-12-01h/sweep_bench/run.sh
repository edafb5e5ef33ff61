# As run from the repository root in the device tool (OUT set); see ../README.md.
export PYTHONUNBUFFERED=1
TEST_TIMEOUT=290 bash scripts/device_check.sh kernels > $OUT/kernels.log 2>&1
tail -12 $OUT/kernels.log
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD
mkdir -p $OUT/bench
timeout 170 python3 -m wtconv_cuda.bench --out $OUT/bench --shapes convnext --dtypes fp32 > $OUT/bench/bench.log 2>&1
tail -30 $OUT/bench/bench.log
