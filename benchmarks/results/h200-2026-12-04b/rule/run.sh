# The 14 x 14 rule as committed (SPLIT_SMALL_TILES[16]: the inner levels from 2^20 to 2^22
# pixels, the split above; the backward's dx forward on the inner levels where the split's
# buffers do not fit, DX_INNER): the GPU oracle cases of the inner levels, the split and
# the dx paths at K 5, then the user benchmark at the ConvNeXt-T stages.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout 250 python3 -m pytest -v -n 8 -p no:cacheprovider \
  tests/gpu/test_gpu_kernels.py -k "inner_levels or dx_forward_chunks or split or dx_in_the" \
  2>&1 | grep -E "PASSED|FAILED|ERROR|passed|failed|Error" | tee "$OUT/gpu.log" | tail -n 8
timeout 320 python3 -m wtconv_cuda.bench --shapes convnext --dtypes fp32 bf16 --out "$OUT/bench" \
  2>&1 | grep -v "^Compil" | tail -n 60 | tee "$OUT/bench.log"
