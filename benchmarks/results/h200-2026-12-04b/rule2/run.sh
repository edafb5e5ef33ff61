# Tree 96efbc2. The GPU oracle cases rule/ did not reach (its call cut them at 41%): the
# inner levels at 14 x 14 (16 x 384, and 15 x 13 planes), the planner's dx forward at the
# 14 x 14 and 28 x 28 stages in 16-bit storage, the dx paths. Then the JAX binding's GPU
# cases, whose callback path now replays recorded programs (7d14c0e), and the bindings'
# host costs.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout 240 python3 -m pytest -v -n 8 -p no:cacheprovider \
  tests/gpu/test_gpu_kernels.py -k "inner_levels or dx_forward_chunks or dx_in_the" \
  2>&1 | grep -E "PASSED|FAILED|ERROR|passed|failed|Error" | tee "$OUT/gpu.log" | tail -n 4
WTCONV_TEST_GPU=1 timeout 200 python3 -m pytest -v -p no:cacheprovider \
  tests/gpu/test_bindings_gpu.py -k jax 2>&1 | tail -n 40 | tee "$OUT/gpu_jax.log" | tail -n 25
timeout 100 python3 benchmarks/binding_overhead.py >"$OUT/binding_overhead.json" \
  2>"$OUT/binding_overhead.err"; tail -c 1500 "$OUT/binding_overhead.json"
