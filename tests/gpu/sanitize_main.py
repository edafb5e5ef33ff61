"""Forward and backward on a few shapes, for compute-sanitizer (scripts/sanitizer.sh).

Covers the shared-memory variant (several one-warp planes per block with
warp barriers, two 16-thread planes per warp on the smallest planes, 64-thread
planes with block barriers, and one 128-thread plane per block), the global
scratch variant (persistent blocks over planes), strides 1, 2 and 3, float32
and float16, levels deeper than the image, and backward work units of
several batch entries (``batch_chunk`` forced: ragged last units, several
units per block, thread groups past the last unit). Every output is
poisoned with NaN first and compared with the float64 oracle; the exit
status is non-zero on a mismatch. ``--warmup`` only compiles the kernels (run it outside the
sanitizer: compiling under it is slow).
"""

from __future__ import annotations

import sys

import numpy as np

import cupy
from wtconv_cuda import WTConvWeights, reference
from wtconv_cuda.kernels.launch import (CupyBackend, Problem, Tuning, Weights, run_backward,
                                       run_forward)

CASES = [  # (B, C, H, W), K, L, stride, storage, scratch, backward batch chunk (0: default)
    ((2, 3, 17, 23), 3, 2, 1, "float32", False, 0),
    ((2, 2, 9, 7), 5, 3, 2, "float16", False, 0),  # forward: two 16-thread planes per warp
    ((1, 2, 3, 2), 3, 4, 1, "float32", False, 0),
    ((1, 2, 48, 46), 5, 3, 1, "float32", False, 0),  # 128 threads, one plane per block
    ((3, 2, 33, 31), 3, 2, 1, "float32", True, 0),
    ((2, 3, 20, 18), 5, 2, 3, "float32", True, 0),
    ((1, 5, 64, 64), 5, 4, 1, "float16", True, 0),
    ((5, 3, 7, 7), 5, 2, 1, "float32", False, 2),  # units of 2, 2, 1; 16 planes per block
    ((9, 2, 14, 13), 3, 3, 1, "float16", False, 4),
    ((7, 4, 28, 28), 5, 4, 1, "float32", False, 3),  # 64-thread planes, block barriers
]
TOL = {"float32": 1e-5, "float16": 2e-3}


def run(case, check=True):
    shape, k, levels, stride, storage, scratch, chunk = case
    dtype = np.float32 if storage == "float32" else np.float16
    b, c, h, w = shape
    rng = np.random.default_rng(0)
    host = dict(x=rng.standard_normal(shape),
                dy=rng.standard_normal((b, c, -(-h // stride), -(-w // stride))))
    params = [rng.uniform(-1, 1, (c, k, k)), rng.uniform(-1, 1, c), rng.uniform(0.5, 1.5, c),
              rng.uniform(-1, 1, (levels, c, 4, k, k)), rng.uniform(-0.5, 0.5, (levels, c, 4))]
    host = {n: a.astype(dtype) for n, a in host.items()}
    params = [p.astype(dtype) for p in params]
    dev = Weights(*(cupy.asarray(p) for p in params))
    backend = CupyBackend()
    if scratch:
        backend.shared_limit = 0  # every plane goes to global scratch
    problem = Problem(b, c, h, w, k, levels, stride, storage, True)
    x, dy = cupy.asarray(host["x"]), cupy.asarray(host["dy"])
    y = cupy.full(dy.shape, cupy.nan, dtype)
    run_forward(backend, problem, x, y, dev)
    dx = cupy.full(shape, cupy.nan, dtype)
    grads = Weights(*(cupy.full(p.shape, cupy.nan, dtype) for p in params))
    run_backward(backend, problem, x, dy, dx, dev, grads, Tuning(batch_chunk=chunk or None))
    cupy.cuda.Device().synchronize()
    if not check:
        return True
    w64 = WTConvWeights(*(p.astype(np.float64) for p in params))
    x64, dy64 = host["x"].astype(np.float64), host["dy"].astype(np.float64)
    pairs = {"y": (y, reference.forward(x64, w64, levels, stride))}
    dx_ref, dw_ref = reference.backward(x64, w64, dy64, levels, stride)
    pairs["dx"] = (dx, dx_ref)
    pairs.update({n: (g, getattr(dw_ref, n)) for n, g in zip(Weights._fields, grads)})
    ok = True
    for name, (got, want) in pairs.items():
        got = cupy.asnumpy(got).astype(np.float64)
        scale = max(float(np.abs(want).max()), 1e-30)
        err = float(np.abs(got - want).max()) / scale if np.isfinite(got).all() else np.inf
        if not err <= TOL[storage]:
            print(f"MISMATCH {case}: {name} error {err:.3g}")
            ok = False
    return ok


def main(argv):
    warmup = "--warmup" in argv
    ok = all([run(case, check=not warmup) for case in CASES])
    print("warm-up done" if warmup else ("all cases match the oracle" if ok else "MISMATCHES"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
