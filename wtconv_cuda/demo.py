"""Small end-to-end run: ``python -m wtconv_cuda.demo``.

Runs one forward and backward pass of a WTConv layer and compares it with the
float64 oracle. Without a GPU (or without CuPy) it runs the CPU path; with
both it also runs the GPU path.
"""

from __future__ import annotations

import time

import numpy as np

import wtconv_cuda as wt
from wtconv_cuda import reference

SHAPE = (2, 16, 56, 56)  # B, C, H, W
KERNEL_SIZE, LEVELS, STRIDE = 5, 3, 1


def _gpu_available() -> bool:
    try:
        import cupy
    except ImportError:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


def _relative_error(a, ref) -> float:
    return float(np.abs(np.asarray(a, np.float64) - ref).max() / np.abs(ref).max())


def _report(label, seconds, y, dx, dw, oracle):
    ref_y, ref_dx, ref_dw = oracle
    print(f"{label}: forward + backward in {seconds * 1e3:.1f} ms")
    print(
        f"  max relative error vs float64 oracle: y {_relative_error(y, ref_y):.2e}, "
        f"dx {_relative_error(dx, ref_dx):.2e}"
    )
    for name, g, ref in zip(wt.WTConvWeights._fields, dw, ref_dw):
        if g is not None:
            print(f"    d{name:<15} {_relative_error(g, ref):.2e}")


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> int:
    """Run the demo and print its results.

    Returns
    -------
    int
        Process exit status (0).
    """
    rng = np.random.default_rng(0)
    weights = wt.init_weights(SHAPE[1], KERNEL_SIZE, LEVELS, seed=rng)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    b, c, h, w = SHAPE
    dy = rng.standard_normal((b, c, -(-h // STRIDE), -(-w // STRIDE))).astype(np.float32)
    print(f"wtconv_cuda {wt.__version__}: x {SHAPE} float32, K={KERNEL_SIZE}, ", end="")
    print(f"levels={LEVELS}, stride={STRIDE}")

    oracle, seconds = _timed(
        lambda: (
            reference.forward(x, weights, stride=STRIDE),
            *reference.backward(x, weights, dy, stride=STRIDE),
        )
    )
    print(f"float64 oracle: forward + backward in {seconds * 1e3:.1f} ms")

    def cpu_step():
        tape = wt.Tape()
        y = wt.forward(x, weights, stride=STRIDE, tape=tape)
        return (y, *tape.backward(dy))

    gpu = _gpu_available()
    label = "CPU path" if gpu else "CPU path (no GPU found)"
    (y, dx, dw), seconds = _timed(cpu_step)
    _report(label, seconds, y, dx, dw, oracle)

    if gpu:
        _run_gpu(x, weights, dy, oracle)
    return 0


def _run_gpu(x, weights, dy, oracle):
    import cupy

    cx, cdy = cupy.asarray(x), cupy.asarray(dy)
    cw = wt.WTConvWeights(*(None if a is None else cupy.asarray(a) for a in weights))

    def gpu_step():
        tape = wt.Tape()
        y = wt.forward(cx, cw, stride=STRIDE, tape=tape)
        dx, dw = tape.backward(cdy)
        cupy.cuda.Device().synchronize()
        return y, dx, dw

    try:
        gpu_step()  # compile and warm up
        (y, dx, dw), seconds = _timed(gpu_step)
    except NotImplementedError as exc:
        print(f"GPU path: not available yet ({exc})")
        return
    dw_host = wt.WTConvWeights(*(None if g is None else cupy.asnumpy(g) for g in dw))
    _report("GPU path", seconds, cupy.asnumpy(y), cupy.asnumpy(dx), dw_host, oracle)


if __name__ == "__main__":
    raise SystemExit(main())
