# The GPU oracle cases the last session's K 7 and K 9 sweeps (h200-2026-12-01i, cut by the
# call's end) did not reach (left_k7.txt, left_k9.txt: collected minus passed or skipped
# there), after the WTConv2d step probe on this tree. Carried PTX in .ptxcache/.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
echo "cached PTX: $(ls "$WTCONV_CUDA_CACHE" | grep -c ptx$)"
here=benchmarks/results/h200-2026-12-02/sweep
start=$SECONDS
timeout 120 python3 benchmarks/module_step_probe.py --calls 300 --rounds 3 2>&1 \
  | head -n 9 | tee "$OUT/probe.log"
for k in 7 9; do
  left=$((560 - SECONDS + start)); [ $left -gt 30 ] || break
  ids=$(sed "s|^|tests/gpu/test_gpu_kernels.py::|" "$here/left_k$k.txt")
  # shellcheck disable=SC2086  # ids is a list of node ids
  WTCONV_TEST_GPU=1 WTCONV_TEST_KS=$k timeout $left python3 -m pytest -v -rfE -n 14 \
    -p no:cacheprovider -p no:benchmark $ids >"$OUT/gpu_k$k.log" 2>&1
  echo "K $k: pytest rc $? at $((SECONDS - start)) s, $(grep -c PASSED "$OUT/gpu_k$k.log") passed"
  grep -E "FAILED|ERROR" "$OUT/gpu_k$k.log" | head -20; tail -n 2 "$OUT/gpu_k$k.log"
done
