# Where the 14 x 14 forward's inner levels (split level 1, coarse levels in the tile's block)
# stop beating the split (inner/: faster at 16-32 x 384 and 64 x 192, slower at 64 x 384):
# batches 40 and 48 x 384. Then the 28 x 28 stage's rule (SPLIT_SMALL_TILES[32]: split at 2,
# coarse 7 x 7 on the register kernel) against its inner levels, at 64 and 32 x 192, L 4.
# Tree 8ed1010. K 5, fp32, benchmarks/split_threshold.py --rule, two rounds.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
PYTHONPATH=$PWD timeout 250 python3 benchmarks/split_threshold.py \
  --rule inner=1,min_pixels=0 --shapes 40x384x14x14:3 48x384x14x14:3 56x384x14x14:3 \
  --dtypes fp32 --rounds 2 --jobs 15 --json "$OUT/crossover16.json" 2>&1 \
  | grep -v "^Compil" | tee "$OUT/crossover16.log"
PYTHONPATH=$PWD timeout 300 python3 benchmarks/split_threshold.py --edge 32 \
  --rule inner=1 --shapes 64x192x28x28:4 32x192x28x28:4 \
  --dtypes fp32 --rounds 2 --jobs 15 --json "$OUT/edge32.json" 2>&1 \
  | grep -v "^Compil" | tee "$OUT/edge32.log"
