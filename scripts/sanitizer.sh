#!/usr/bin/env bash
# compute-sanitizer over forward + backward on a few shapes (shared-memory and
# global-scratch kernel variants): memcheck and racecheck decide the exit
# status; synccheck and initcheck are run and logged for information.
#
#   bash scripts/sanitizer.sh
#
# Logs land in $OUT (the device tool's output folder) or ./sanitizer_out.
set -uo pipefail
OUT=${OUT:-$PWD/sanitizer_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export WTCONV_CUDA_CACHE=${WTCONV_CUDA_CACHE:-/tmp/wtconv_cache}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset NUMBA_ENABLE_CUDASIM
PY=${PYTHON:-python3}
status=0

# Compile (and cache) every kernel variant outside the sanitizer first.
$PY tests/gpu/sanitize_main.py --warmup 2>&1 | tee "$OUT/sanitizer_warmup.log" || status=1

for tool in memcheck racecheck synccheck initcheck; do
  echo "== compute-sanitizer --tool $tool"
  compute-sanitizer --tool "$tool" --error-exitcode 86 --log-file "$OUT/sanitizer_$tool.log" \
    $PY tests/gpu/sanitize_main.py >"$OUT/sanitizer_${tool}_stdout.log" 2>&1
  rc=$?
  tail -n 3 "$OUT/sanitizer_$tool.log" "$OUT/sanitizer_${tool}_stdout.log"
  echo "$tool: exit $rc"
  if [ "$tool" = memcheck ] || [ "$tool" = racecheck ]; then
    [ "$rc" -eq 0 ] || status=1
  fi
done
exit $status
