# The split forward stage by stage (benchmarks/split_stages.py) before (ab_base: HEAD's
# wtconv_cuda) and after the coarse values' early loads in the tile kernel, alternately;
# then the coarse problem under other launch shapes (this tree).
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
    PYTHONPATH=$tree timeout 150 python3 benchmarks/split_stages.py \
      --json "$OUT/${tag}_$round.json" 2>&1 | grep -v "^Compil" || echo "rc $?"
    echo "at $((SECONDS - start)) s"
  done
done
echo "== coarse problem launch shapes"
PYTHONPATH=. timeout $((570 - SECONDS + start)) python3 benchmarks/split_stages.py \
  --coarse-tunings default threads=8 threads=32 planes_per_block=8 max_registers=64 split=1 \
  --json "$OUT/coarse_tunings.json" 2>&1 | grep -v "^Compil" || echo "rc $?"
echo "at $((SECONDS - start)) s"
} 2>&1 | tee "$OUT/stages.log"
