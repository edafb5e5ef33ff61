# As run from the repository root in the device tool (OUT set); see ../README.md.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv > $OUT/env.log
TB="python3 benchmarks/tile_bench.py --no-plane"
( $TB --configs 64x96x56x56:5 --variants 64:128:4:128 56:128:4:128 56:128:2:128 56:64:4:128 56:256:4:128 --splits 2 3 --json $OUT/t56.json
  $TB --configs 64x192x28x28:4 --variants 32:64:4:128 28:64:2:128 28:64:7:128 28:64:1:128 28:128:2:128 28:32:2:128 --splits 2 --json $OUT/t28.json
  $TB --configs 64x384x14x14:3 --variants 16:32:2:128 14:32:7:128 14:32:1:128 14:64:1:128 --splits 1 --json $OUT/t14.json
) > $OUT/fit1.log 2>&1
tail -5 $OUT/fit1.log
