# The inner taps loaded during level L: split_stages.py at 56 x 56 before (ab_base: HEAD~1)
# and after, alternately; then the user benchmark at the ConvNeXt-T stages, fp32 and bf16
# (JSON and plot in one archive).
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
{
for round in 1 2; do
  for tree in ab_base .; do
    tag=$([ "$tree" = . ] && echo after || echo before)
    echo "== $tag (round $round)"
    PYTHONPATH=$tree timeout 80 python3 benchmarks/split_stages.py --configs 64x96x56x56:5 \
      --whole-tunings default --json "$OUT/${tag}_$round.json" 2>&1 | grep -E "whole|stages" \
      || echo "rc $?"
  done
done
echo "at $((SECONDS - start)) s"
} 2>&1 | tee "$OUT/stages.log"
export PYTHONPATH=$PWD
timeout $((215 - SECONDS + start)) python3 -m wtconv_cuda.bench --shapes convnext \
  --dtypes fp32 bf16 --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $((SECONDS - start)) s"
[ -d "$OUT/bench" ] && tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
grep -A 11 "^Inference" "$OUT/bench.log"
