# Launch shapes of the one-tile-per-plane forwards after the plane size went compile-time
# (aa81835: fewer registers): split_stages.py whole-forward times under other thread
# counts and output strips, per ConvNeXt-T stage, twice.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
sweep() {  # config tunings...
  local config=$1
  shift
  PYTHONPATH=. timeout 150 python3 benchmarks/split_stages.py --configs "$config" \
    --whole-tunings "$@" --json "$OUT/$(echo "$config" | tr ':' 'L')_$round.json" 2>&1 \
    | grep -E "whole|^64x" || echo "rc $?"
  echo "at $((SECONDS - start)) s"
}
{
for round in 1 2; do
  echo "== round $round"
  sweep 64x96x56x56:5 default threads=64 threads=192 threads=256 strip=2 strip=7
  sweep 64x192x28x28:4 default threads=32 threads=128 strip=2 strip=8
  sweep 64x384x14x14:3 default threads=64 strip=1 strip=4
done
} 2>&1 | tee "$OUT/shapes.log"
