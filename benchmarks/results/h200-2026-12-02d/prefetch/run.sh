# The forward tiles' L2 prefetch (TileSpec.prefetch; one tile per plane): split_stages.py
# at the ConvNeXt-T split/inner stages under the planner's distance (default: 256, 1024
# and 4096 planes at 56, 28 and 14), none (prefetch=0) and two other distances, twice;
# then ncu source counters of the tile kernel at 14 x 14 (split at 1) and 56 x 56 (inner
# levels), with the default prefetch.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
configs="64x96x56x56:5 64x192x28x28:4 64x384x14x14:3"
{
for round in 1 2; do
  tunings="default prefetch=0"
  [ $round = 1 ] && tunings="default prefetch=0 prefetch=64 prefetch=4096"
  echo "== round $round"
  # shellcheck disable=SC2086
  PYTHONPATH=. timeout 200 python3 benchmarks/split_stages.py --configs $configs --whole-tunings $tunings \
    --json "$OUT/stages_$round.json" 2>&1 | grep -v "^Compil" || echo "rc $?"
  echo "at $((SECONDS - start)) s"
done
} 2>&1 | tee "$OUT/stages.log"
mkdir -p "$OUT/hot"
[ -n "$SKIP_HOT" ] && exit 0
OUT=$OUT/hot TILEHOT_SHAPES="64x384x14x14x3x5 64x96x56x56x5x5" timeout 240 \
  bash scripts/device_check.sh tilehotspots > "$OUT/tilehot.log" 2>&1
echo "tilehotspots rc $? at $((SECONDS - start)) s"
cat "$OUT/hot/hotspots_summary.txt"
tar czf "$OUT/hot.tgz" -C "$OUT" hot && rm -rf "$OUT/hot"
