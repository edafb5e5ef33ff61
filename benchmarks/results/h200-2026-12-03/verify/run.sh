# This tree (the register kernel's unrolled staging load, f775133, plus the split forward
# pooling in place where its coarse problem runs on the register kernel) against ab_base
# (git archive f775133 wtconv_cuda). Both trees' ConvNeXt-T variants compiled side by
# side; the GPU oracle cases of the register kernel, the split passes and the dx chunks
# at every kernel size; the backward (dx_forward_bench.py) and the split forwards' stages
# in both trees; then the user benchmark (python -m wtconv_cuda.bench --shapes convnext
# --dtypes fp32 bf16) on this tree with the time left.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
start=$SECONDS
(cd /tmp && PYTHONPATH=$OLDPWD/ab_base python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 \
  --storage float32 bfloat16 --strides 1 --configs 28x28:4 14x14:3 --jobs 5 2>&1 | tail -n 1) &
(cd /tmp && PYTHONPATH=$OLDPWD python3 -m wtconv_cuda.kernels.warmup --kernel-sizes 5 \
  --storage float32 bfloat16 --strides 1 --configs 56x56:5 28x28:4 14x14:3 7x7:2 16x16:3 \
  --jobs 10 2>&1 | tail -n 1) &
wait
echo "warm at $((SECONDS - start)) s"
WTCONV_TEST_GPU=1 PYTHONPATH=$PWD timeout 150 python3 -m pytest -v -rfE -n 15 \
  -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "register or split_matches or convnext_stage" >"$OUT/gpu.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu.log"; grep -E " FAILED | ERROR " "$OUT/gpu.log" | head; tail -n 1 "$OUT/gpu.log"
{
for tree in ab_base .; do
  echo "== $tree"
  PYTHONPATH=$tree timeout 80 python3 benchmarks/dx_forward_bench.py \
    --json "$OUT/dx_$([ $tree = . ] && echo after || echo before).json" 2>&1 | grep -v "^Compil"
  PYTHONPATH=$tree timeout 40 python3 benchmarks/split_stages.py \
    --configs 64x192x28x28:4 64x384x14x14:3 --whole-tunings default 2>&1 | grep -E "whole|stages"
  echo "at $((SECONDS - start)) s"
done
} 2>&1 | tee "$OUT/ab.log"
PYTHONPATH=$PWD timeout $((585 - SECONDS + start)) python3 -m wtconv_cuda.bench --shapes convnext \
  --dtypes fp32 bf16 --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $((SECONDS - start)) s"
[ -d "$OUT/bench" ] && tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
grep -A 11 "^Training" "$OUT/bench.log"; grep -A 6 "^Host" "$OUT/bench.log"
