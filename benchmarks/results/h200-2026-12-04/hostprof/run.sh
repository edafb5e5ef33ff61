# Where the single-launch forward's host time goes with and without the recorded programs:
# forward_host_cost.py at 7 x 7 and (1, 8, 16, 16) in ab_base (git archive d65fd26) and in
# this tree (Program.run without a generator), alternately, twice, with its cProfile.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
start=$SECONDS
for round in 1 2; do
  for tree in ab_base .; do
    echo "== round $round $tree"
    (cd $tree && PYTHONPATH=$PWD timeout 60 python3 benchmarks/forward_host_cost.py \
      --shapes 64x768x7x7:2 1x8x16x16:3 2>&1 | grep -v "^Compil")
  done
  echo "at $((SECONDS - start)) s"
done 2>&1 | tee "$OUT/ab.log" | grep -E "^==|^[0-9]+x|^at"
