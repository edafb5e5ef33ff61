# One-tile-per-plane forwards with the plane size compile-time (TileSpec.height, width:
# block n takes plane n, loads it as one contiguous run, stores with constant sizes)
# against ab_base (git archive 209e340 wtconv_cuda): split_stages.py at the
# ConvNeXt-T split/inner stages and one paper shape, the two trees alternately, twice;
# then the tiled, split and inner-level GPU oracle cases (K 5).
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
for a in .ptxcache/*.tar.xz; do [ -e "$a" ] && tar -C "$WTCONV_CUDA_CACHE" -xJf "$a"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
start=$SECONDS
configs="64x96x56x56:5 64x192x28x28:4 64x384x14x14:3 8x64x256x256:5"
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
WTCONV_TEST_GPU=1 WTCONV_TEST_KS=5 timeout $((570 - SECONDS + start)) python3 -m pytest -v -rfE \
  -n 14 -p no:cacheprovider -p no:benchmark tests/gpu/test_gpu_kernels.py \
  -k "tiled or split or inner" >"$OUT/gpu_k5.log" 2>&1
echo "pytest rc $? at $((SECONDS - start)) s"
grep -c PASSED "$OUT/gpu_k5.log"; grep -E "FAILED|ERROR" "$OUT/gpu_k5.log" | head -20; tail -n 2 "$OUT/gpu_k5.log"
