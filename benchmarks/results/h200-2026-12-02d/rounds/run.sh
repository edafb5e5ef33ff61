# Output strips by fewest rounds and 32-thread 28 x 28 split tiles (this tree) against
# ab_base (git archive aa81835 wtconv_cuda, the compile-time plane):
# split_stages.py at the ConvNeXt-T split/inner stages and a 48 x 48 plane (a fitted 48
# tile: strip 6 now), the two trees alternately, twice;
# then the tiled, split and inner-level GPU oracle cases (K 5) and the user benchmark.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
configs="64x96x56x56:5 64x192x28x28:4 64x384x14x14:3 64x96x48x48:5"
{
for round in 1 2; do
  for tree in ab_base .; do
    tag=$([ "$tree" = . ] && echo after || echo before)
    echo "== $tag (round $round)"
    # shellcheck disable=SC2086
    PYTHONPATH=$tree timeout 150 python3 benchmarks/split_stages.py --configs $configs \
      --whole-tunings default --json "$OUT/${tag}_$round.json" 2>&1 | grep -v "^Compil" \
      || echo "rc $?"
    echo "at $((SECONDS - start)) s"
  done
done
} 2>&1 | tee "$OUT/stages.log"
export PYTHONPATH=$PWD
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout $((500 - SECONDS + start)) python3 -m pytest -v -rfE \
  -n 14 -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "tiled or split or inner" >"$OUT/gpu_k5.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu_k5.log"; grep -E "FAILED|ERROR" "$OUT/gpu_k5.log" | head -20; tail -n 2 "$OUT/gpu_k5.log"
timeout $((585 - SECONDS + start)) python3 -m wtconv_cuda.bench --shapes convnext --dtypes fp32 bf16 \
  --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $((SECONDS - start)) s"
[ -d "$OUT/bench" ] && tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
grep -A 11 "^Inference" "$OUT/bench.log"; grep -A 11 "^Training" "$OUT/bench.log"; grep -A 6 "^Host" "$OUT/bench.log"
