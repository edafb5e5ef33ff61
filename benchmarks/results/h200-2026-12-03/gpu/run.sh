# 2f3d011: the GPU oracle cases of the register kernel (every kernel size, forward and
# backward) and of the planner's dx chunks at the ConvNeXt-T stages (the 28 x 28 one
# through the split forward that pools in place), then the split passes', until the
# deadline. No warm-up: the tests compile what they launch.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
start=$SECONDS
WTCONV_TEST_GPU=1 timeout 240 python3 -m pytest -v -rfE -n 15 -p no:cacheprovider \
  -p no:benchmark tests/gpu/test_gpu_kernels.py -k "register or convnext_stage" \
  >"$OUT/gpu_register.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu_register.log"; grep -E " FAILED | ERROR " "$OUT/gpu_register.log" | head
tail -n 1 "$OUT/gpu_register.log"
