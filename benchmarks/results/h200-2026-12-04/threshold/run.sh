# The 16-pixel split's size rule (SPLIT_SMALL_TILES[16].min_pixels) with launches replayed
# (recorded programs): 2^22 (current) against 2^21, alternately in one process, through
# wtconv_cuda.forward and a Tape's backward on CuPy arrays (benchmarks/split_threshold.py,
# tree ebb093b plus that script). ConvNeXt-T's 14 x 14 stage at batches around the
# thresholds, K 5, L 3, fp32. Two device calls (the session had 290 s of device time):
#
# 1. threshold.log: 28 x 384, three rounds. As run it had "--dtypes fp32 bf16", and the
#    bf16 half stopped at its first call: wtconv_cuda.forward takes float32 and float16
#    CuPy arrays only (its documented dtypes). The script now offers fp32 and fp16.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
PYTHONPATH=$PWD timeout 540 python3 benchmarks/split_threshold.py --min-pixels 2097152 \
  --shapes 28x384x14x14:3 32x384x14x14:3 48x384x14x14:3 64x192x14x14:3 64x384x14x14:3 \
  --dtypes fp32 --rounds 3 --jobs 14 --json "$OUT/threshold.json" 2>&1 \
  | grep -v "^Compil" | tee "$OUT/threshold.log"
#
# 2. threshold2.log / .json: 64 x 384, 32 x 384 and 64 x 192, two rounds, on the same
#    (warm) machine.
PYTHONPATH=$PWD timeout 150 python3 benchmarks/split_threshold.py --min-pixels 2097152 \
  --shapes 64x384x14x14:3 32x384x14x14:3 64x192x14x14:3 --dtypes fp32 --rounds 2 \
  --jobs 14 --json "$OUT/threshold2.json" 2>&1 | grep -v "^Compil" | tee "$OUT/threshold2.log"
