# Where main's time goes now (545a567), fp32, K 5: ncu source counters of the
# weights-only plane backward at 56, 28, 14 and of the forward's tile kernel at 28
# and 14 (device_check.sh hotspots, tilehotspots); the split forward's stages at 28
# and 14 (benchmarks/split_stages.py); the backward (benchmarks/dx_forward_bench.py).
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p "$WTCONV_CUDA_CACHE"
start=$SECONDS
python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 --storage float32 bfloat16 \
  --strides 1 --configs 56x56:5 28x28:4 14x14:3 --jobs 15 2>&1 | tail -n 1
echo "warm at $((SECONDS - start)) s"
timeout 200 bash scripts/device_check.sh hotspots > "$OUT/hotspots.log" 2>&1
echo "hotspots rc $? at $((SECONDS - start)) s"
mv "$OUT/hotspots_summary.txt" "$OUT/bwd_summary.txt"
TILEHOT_SHAPES="64x192x28x28x4x5 64x384x14x14x3x5" timeout 120 \
  bash scripts/device_check.sh tilehotspots > "$OUT/tilehotspots.log" 2>&1
echo "tilehotspots rc $? at $((SECONDS - start)) s"
mv "$OUT/hotspots_summary.txt" "$OUT/tile_summary.txt"
tar czf "$OUT/hot.tgz" -C "$OUT" $(cd "$OUT" && ls hotspots_* 2>/dev/null) && rm -f "$OUT"/hotspots_*
timeout 90 python3 benchmarks/split_stages.py --configs 64x192x28x28:4 64x384x14x14:3 \
  > "$OUT/split_stages.log" 2>&1; echo "split rc $? at $((SECONDS - start)) s"
timeout 120 python3 benchmarks/dx_forward_bench.py --json "$OUT/backward.json" \
  > "$OUT/backward.log" 2>&1; echo "backward rc $? at $((SECONDS - start)) s"
cat "$OUT/split_stages.log" "$OUT/backward.log" | grep -v "^Compil"
