# As run from the repository root in the device tool (OUT set); see ../README.md.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
( cd ab_base && COMPILE_ONLY=1 PYTHONPATH=$PWD python3 ../benchmarks/results/h200-2026-12-01g/pair_load/wo_variants.py > $OUT/base_compile.log 2>&1 ) &
COMPILE_ONLY=1 PYTHONPATH=$PWD python3 benchmarks/results/h200-2026-12-01g/pair_load/wo_variants.py > $OUT/variants_compile.log 2>&1
wait
PYTHONPATH=$PWD python3 benchmarks/results/h200-2026-12-01g/pair_load/wo_variants.py > $OUT/variants.log 2>&1
( cd ab_base && PYTHONPATH=$PWD python3 ../benchmarks/results/h200-2026-12-01g/pair_load/wo_variants.py > $OUT/base.log 2>&1 )
grep round $OUT/variants.log $OUT/base.log; tail -2 $OUT/*compile.log
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 PYTHONPATH=$PWD timeout 300 python3 -m pytest -p no:cacheprovider -q -x -n 8 tests/gpu/test_gpu_kernels.py -k "dx_in_the_plane or fused" > $OUT/gputest.log 2>&1; tail -3 $OUT/gputest.log
