#!/usr/bin/env bash
# Compile kernel variants to PTX on a CPU machine, for a device call to carry.
#
#   bash scripts/build_ptx_cache.sh K [K ...]
#   bash scripts/build_ptx_cache.sh lanes    (the device_check.sh lanes phase's A/B;
#                                             LANES_SHAPES and LANES_SETTINGS as there)
#   bash scripts/build_ptx_cache.sh bench    (python -m wtconv_cuda.bench's variants;
#                                             BENCH_ARGS as in device_check.sh)
#   bash scripts/build_ptx_cache.sh blocked  (the device_check.sh blockedw phase's A/B;
#                                             BLOCKED_SHAPES as there)
#
# A fresh device machine starts with an empty kernel cache, and compiling the
# oracle sweep's variants of one kernel size there takes most of a 10-minute
# call (several seconds of numba and NVVM per variant, some 45 s). The cache is plain PTX keyed
# by the generated source, the spec, the target and the numba and numba-cuda
# versions (wtconv_cuda/kernels/compiler.py), so it can be built anywhere with
# the device image's compiler versions and carried; the driver then only
# assembles the PTX (ptxas) when a kernel is loaded.
#
# This script makes a virtual environment with the H200 image's versions
# (numba 0.68.0, numba-cuda 0.30.4; NVVM 13.0, whose PTX ISA 9.0 the image's
# CUDA 13.0 driver accepts: NVVM 13.5 writes ISA 9.5, which ptxas 13.0
# refuses), compiles
# the variants that `scripts/device_check.sh kernels` warms for each K given,
# and packs them as .ptxcache/ptx-K<k>.tar.xz (a few MB per K). Carry
# .ptxcache in the device call; device_check.sh unpacks every archive there
# into $WTCONV_CUDA_CACHE before its phases. Variants whose source changed
# since the archive was built simply miss the cache and compile there.
#
# Knobs: PTX_VENV (default .venv-ptx), JOBS (default: all cores), PLANES (the
# plane sizes, as in device_check.sh's kernels phase). An interrupted build
# leaves .ptxcache/K<k>/ behind and resumes from it; a finished one packs it
# and removes it (the carried folder must stay small: 64 MiB in all).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 K [K ...]" >&2; exit 2; }

venv=${PTX_VENV:-.venv-ptx}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "numba==0.68.0" "numba-cuda==0.30.4" "numpy==2.4.*" \
    "nvidia-nvvm==13.0.88" "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-runtime==13.0.*" \
    "cuda-bindings==13.0.*"
fi

jobs=${JOBS:-$(nproc)}
planes=${PLANES:-17x23 56x56 255x257 1x7 28x28 14x14 7x7}
mkdir -p .ptxcache
for k in "$@"; do
  work=.ptxcache/K$k  # kept until packed: an interrupted build resumes where it stopped
  mkdir -p "$work"
  echo "== K $k: compiling into $work"
  if [ "$k" = lanes ]; then  # the lanes phase's A/B (its default shapes, fp32 and bf16)
    # shellcheck disable=SC2086  # LANES_SHAPES is a list of shapes
    settings=()
    # shellcheck disable=SC2206  # LANES_SETTINGS is a list of lanes_ab.py settings
    [ -n "${LANES_SETTINGS:-}" ] && settings=(--settings $LANES_SETTINGS)
    env -u NUMBA_ENABLE_CUDASIM WTCONV_CUDA_CACHE="$PWD/$work" PYTHONPATH="$PWD" \
      "$venv/bin/python" benchmarks/lanes_ab.py --compile-only --jobs "$jobs" --dtypes fp32 bf16 \
      --shapes ${LANES_SHAPES:-64x384x14x14:3 32x384x14x14:3} "${settings[@]}" | tail -n 2
  elif [ "$k" = blocked ]; then  # the blockedw phase's A/B (its shapes, fp32 and bf16)
    # shellcheck disable=SC2086  # BLOCKED_SHAPES is a list of shapes
    env -u NUMBA_ENABLE_CUDASIM WTCONV_CUDA_CACHE="$PWD/$work" PYTHONPATH="$PWD" \
      "$venv/bin/python" benchmarks/lanes_ab.py --compile-only --jobs "$jobs" --dtypes fp32 bf16 \
      --settings default blocked --shapes ${BLOCKED_SHAPES:-64x96x56x56:5 64x192x28x28:4} \
      | tail -n 2
  elif [ "$k" = bench ]; then  # the user benchmark's variants (its grid and dtypes)
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
    env -u NUMBA_ENABLE_CUDASIM WTCONV_CUDA_CACHE="$PWD/$work" PYTHONPATH="$PWD" \
      "$venv/bin/python" -m wtconv_cuda.bench --compile-only --jobs "$jobs" ${BENCH_ARGS:-} \
      | tail -n 2
  else
    # shellcheck disable=SC2086  # planes is a list
    env -u NUMBA_ENABLE_CUDASIM WTCONV_CUDA_CACHE="$PWD/$work" PYTHONPATH="$PWD" \
      "$venv/bin/python" -m wtconv_cuda.kernels.warmup --kernel-sizes "$k" --strides 1 2 \
      --jobs "$jobs" --cc 9.0 --planes $planes | tail -n 2
  fi
  grep -L "^\.version 9\.0$" "$work"/*.ptx | head -n 1 | grep -q . \
    && { echo "PTX other than ISA 9.0 in $work: wrong NVVM" >&2; exit 1; }
  tar -C "$work" -cJf ".ptxcache/ptx-K$k.tar.xz" .
  rm -rf "$work"
  ls -l ".ptxcache/ptx-K$k.tar.xz"
done
