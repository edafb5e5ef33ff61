"""Where a short forward's time goes through the CuPy path: kernel, launch path, API.

For each shape (default: the ConvNeXt-T 7 x 7 stage, whose forward kernel
takes ~22 us, and the (1, 8, 16, 16) host-overhead shape) prints, in us per
call:

- ``kernel``: CUDA events around 100 back-to-back ``run_forward`` calls, / 100
  (the GPU never waits for the host);
- ``run_forward`` and ``wtconv_cuda.forward``: CUDA events around each single
  call, median of 200 (the benchmark's method: a call the GPU finishes before
  the host issues the next one shows its host time);
- the same two back to back, host wall clock per call (``perf_counter``);

then the 15 most expensive functions of 300 ``wtconv_cuda.forward`` calls
under cProfile. ``--dtypes`` repeats it per storage dtype; the arrays are CuPy
views of PyTorch tensors (``cupy.from_dlpack``), as in the user benchmark's
CuPy column, so bfloat16 arrives as ``ml_dtypes.bfloat16``.

    python benchmarks/forward_host_cost.py --dtypes float32 float16 bfloat16
    ncu --kernel-name regex:wtconv python benchmarks/forward_host_cost.py --launches 5
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import pstats
import statistics
import time

import cupy
import numpy as np

import wtconv_cuda as wt
from wtconv_cuda.gpu import _backend, _kernel_weights, _problem
from wtconv_cuda.kernels.launch import run_forward
from wtconv_cuda.weights import WTConvWeights


def device_array(values, dtype):
    """A CuPy view of a CUDA PyTorch tensor holding ``values`` (float32) in ``dtype``."""
    import torch
    tensor = torch.from_numpy(values).cuda().to(getattr(torch, dtype))
    return cupy.from_dlpack(tensor)  # the view keeps the tensor alive


def per_call_events_us(fn, calls=200):
    times = []
    for _ in range(calls):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        times.append((start, stop))
    cupy.cuda.Device().synchronize()
    return statistics.median(cupy.cuda.get_elapsed_time(a, b) * 1e3 for a, b in times)


def back_to_back_us(fn, calls=200):
    for _ in range(10):
        fn()
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def print_profile(call, calls=300, top=15):
    """Run ``call()`` ``calls`` times under cProfile, wait for the GPU, print the ``top``
    functions by their own time."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    cupy.cuda.Device().synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(top)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["64x768x7x7:2", "1x8x16x16:3"])
    parser.add_argument("--dtypes", nargs="+", default=["float32"],
                        choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--launches", type=int, default=0,
                        help="only launch the forward this many times (an ncu target)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    for text, dtype in itertools.product(args.shapes, args.dtypes):
        dims, levels = text.split(":")
        b, c, h, w = (int(v) for v in dims.split("x"))
        levels = int(levels)
        x = device_array(rng.standard_normal((b, c, h, w), dtype=np.float32), dtype)
        weights = WTConvWeights(*(device_array(rng.uniform(-1, 1, s).astype(np.float32), dtype)
                                  for s in [(c, 5, 5), (c,), (c,), (levels, c, 4, 5, 5),
                                            (levels, c, 4)]))
        problem = _problem(x, weights, levels, 1)
        backend = _backend(x.device.id)
        kw = _kernel_weights(weights, cupy)
        y = cupy.empty_like(x)

        def raw():
            run_forward(backend, problem, x, y, kw)

        def api():
            wt.forward(x, weights, levels=levels)

        if args.launches:
            for _ in range(args.launches):
                raw()
            cupy.cuda.Device().synchronize()
            continue
        raw()
        api()
        cupy.cuda.Device().synchronize()
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(100):
            raw()
        stop.record()
        stop.synchronize()
        kernel = cupy.cuda.get_elapsed_time(start, stop) * 10
        print(f"{text} {dtype}: kernel {kernel:.1f} us | per-call events: run_forward "
              f"{per_call_events_us(raw):.1f}, wtconv_cuda.forward {per_call_events_us(api):.1f} "
              f"| back to back: run_forward {back_to_back_us(raw):.1f}, "
              f"wtconv_cuda.forward {back_to_back_us(api):.1f}", flush=True)
        print_profile(api)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
