# As run from the repository root in the device tool (OUT set); see ../README.md.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
TB="timeout 110 python3 benchmarks/tile_bench.py --no-plane"
$TB --configs 64x96x56x56:5 --variants 64:128:4:128 56:128:7:128 56:128:4:128 --splits 2 --json $OUT/f56.json > $OUT/fit2_56.log 2>&1
$TB --configs 64x192x28x28:4 --variants 32:64:4:128 28:64:7:128 28:64:2:128 --splits 2 --json $OUT/f28.json > $OUT/fit2_28.log 2>&1
grep -h "ms (" $OUT/fit2_*.log
