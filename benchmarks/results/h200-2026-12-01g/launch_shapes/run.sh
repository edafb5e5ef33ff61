# As run from the repository root in the device tool (OUT set); see ../README.md.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 benchmarks/results/h200-2026-12-01g/launch_shapes/wo_threads.py > $OUT/threads.log 2>&1; grep round $OUT/threads.log | tail -5
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=3,5,7,9 timeout 420 python3 -m pytest -p no:cacheprovider -q -n 12 tests/gpu/test_gpu_kernels.py -k "dx_in_the_plane or fused" > $OUT/sweep.log 2>&1; tail -3 $OUT/sweep.log
