# WTConv2d's small training step, op by op (benchmarks/module_step_probe.py), then the
# K 3 oracle sweep with whatever time the call has left (carried PTX in .ptxcache/).
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
echo "cached PTX: $(ls "$WTCONV_CUDA_CACHE" | grep -c ptx$)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
timeout 150 python3 benchmarks/module_step_probe.py --calls 300 --rounds 3 \
  --trace "$OUT/step_trace.json.gz" 2>&1 | tee "$OUT/probe.log"
echo "probe done at $((SECONDS - start)) s"
left=$((540 - SECONDS + start)); [ $left -gt 60 ] || left=60
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=3 timeout $left python3 -m pytest -v -rfE -n 14 \
  -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py >"$OUT/gpu_k3.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"; grep -c PASSED "$OUT/gpu_k3.log"; grep -E "FAILED|ERROR" "$OUT/gpu_k3.log" | head -20; tail -n 3 "$OUT/gpu_k3.log"
