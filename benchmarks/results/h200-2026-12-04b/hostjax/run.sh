# Tree 96efbc2. The bindings' host costs (benchmarks/binding_overhead.py; rule2/'s run lacked
# PYTHONPATH), the JAX callback path now replaying recorded programs; then ncu source counters
# of the 14 x 14 inner-level tile (split level 1, levels 2 and 3 in the block) at
# 32 x 384 x 14 x 14, L 3, K 5, fp32 (scripts/device_check.sh tilehotspots).
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p "$WTCONV_CUDA_CACHE"
timeout 150 python3 benchmarks/binding_overhead.py >"$OUT/binding_overhead.json" \
  2>"$OUT/binding_overhead.err"; tail -c 2500 "$OUT/binding_overhead.json"
TILEHOT_SHAPES="32x384x14x14x3x5" timeout 200 bash scripts/device_check.sh tilehotspots 2>&1 | tail -n 30
