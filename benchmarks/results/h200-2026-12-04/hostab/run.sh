# Host cost A/B of the recorded launch programs: ab_base (git archive d65fd26 wtconv_cuda
# benchmarks/*.py) against this tree (2327759 + docs), alternately, three rounds each:
# forward_host_cost.py (a forward's kernel time, per-call events and back-to-back wall
# time) and cupy_host_profile.py (the CuPy training step's host cost, piece by piece).
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
start=$SECONDS
for round in 1 2 3; do
  for tree in ab_base .; do
    echo "== round $round $tree"
    (cd $tree && PYTHONPATH=$PWD timeout 60 python3 benchmarks/forward_host_cost.py \
      --shapes 64x384x14x14:3 64x768x7x7:2 1x8x16x16:3 2>&1 | grep -E "^[0-9]+x")
    (cd $tree/benchmarks && PYTHONPATH=.. timeout 40 python3 cupy_host_profile.py --calls 1000 \
      2>&1 | sed -n 3,5p)
  done
  echo "at $((SECONDS - start)) s"
done 2>&1 | tee "$OUT/ab.log"
