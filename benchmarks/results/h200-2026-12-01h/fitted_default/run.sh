# As run from the repository root in the device tool (OUT set); see ../README.md.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv > $OUT/env.log
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=3,5,7,9 timeout 330 python3 -m pytest -p no:cacheprovider -q -n 12 \
  tests/gpu/test_gpu_kernels.py -k "split_matches_oracle or split_is_the_default" > $OUT/split_tests.log 2>&1
tail -3 $OUT/split_tests.log
timeout 220 python3 benchmarks/tile_bench.py --configs 64x96x56x56:5 64x96x60x60:5 64x96x48x48:5 \
  64x96x40x40:5 64x96x36x36:5 64x96x56x56:4 --variants 64:128:4:128 --splits 2 \
  --json $OUT/fitted.json > $OUT/fitted.log 2>&1
grep -E "ms|^[0-9]" $OUT/fitted.log | tail -40
