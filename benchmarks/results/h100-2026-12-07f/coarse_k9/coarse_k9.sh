#!/usr/bin/env bash
# The split backward at 8x64x256x256 K 9 on HEAD and on .ptxcache/base (07263c6), bits and times.
set -uo pipefail
OUT=${OUT:-$PWD/device_out}; mkdir -p "$OUT"
export WTCONV_CUDA_CACHE=${WTCONV_CUDA_CACHE:-/tmp/wtconv_cache} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.log"
git rev-parse HEAD >> "$OUT/env.log" 2>/dev/null
configs=${CONFIGS:-"3:float32 5:float32 3:bfloat16 5:bfloat16"}
[ "${SKIP_SPLIT:-0}" = 1 ] && configs=""
pids=()
for tree in "$PWD" "$PWD/.ptxcache/base"; do for c in $configs; do
  (PYTHONPATH=$tree timeout 400 python3 .ptxcache/coarse_k9.py 8 64 256 256 ${c%%:*} 9 ${c##*:} warm \
    > "$OUT/warm_$(basename $tree)_${c/:/_}.log" 2>&1) & pids+=($!)
done; done
wait "${pids[@]}"; echo "warm done at $SECONDS s"; tail -n 2 "$OUT"/warm_*.log
for round in 1 2; do for c in $configs; do for tree in "$PWD" "$PWD/.ptxcache/base"; do
  echo -n "round $round $(basename $tree) "
  PYTHONPATH=$tree timeout 100 python3 .ptxcache/coarse_k9.py 8 64 256 256 ${c%%:*} 9 ${c##*:} time 2>&1 | tail -n 1
done; done; done | tee "$OUT/times.log"
