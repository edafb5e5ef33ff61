"""Why a short forward reads slower in the user benchmark than on its own.

The benchmark (``python -m wtconv_cuda.bench``) times the 7 x 7 stage's CuPy
forward at ~0.076 ms where the kernel takes ~0.022 ms and one
``wtconv_cuda.forward`` call ~0.031 ms in ``forward_host_cost.py``. This
script builds the benchmark's own implementations for one configuration and
times the forward in variants that each change one thing the two scripts do
differently (CUDA events around each call, median of 30, as the benchmark):

- ``bench``: the benchmark's CuPy implementation, its rotated inputs, its timer;
- ``one_input``: the same, always the same input (no rotation);
- ``no_stream_ctx``: ``wtconv_cuda.forward`` on the same weights without the
  ``with stream`` block;
- ``own_weights``: CuPy-owned copies of the weights instead of DLPack views;
- ``own_inputs``: CuPy-owned copies of the inputs;
- ``module``: the benchmark's ``WTConv2d`` forward (``no_grad``);
- ``dw7``: the depthwise 7 x 7 convolution;

each timed with the benchmark's torch timer, with a torch timer that looks
up the stream at every mark (the benchmark's timer before the twelfth
session) and with CuPy's events, then its host time per call
(``perf_counter`` around the call only, median) and its time per call when
60 calls are queued back to back (the larger of host and GPU time).
``--train`` times training steps instead (the benchmark's CuPy step, the
same without the stream block on CuPy-owned weights, ``WTConv2d``,
depthwise 7x7). First, ``--measure`` runs
the benchmark's own ``measure_config`` on the configuration (same process,
so the variants run in the state the benchmark leaves); last, a cProfile of
300 benchmark calls.

    python benchmarks/bench_probe.py --measure 64x768x7x7:2
    python benchmarks/bench_probe.py --train 64x768x7x7:2
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import sys
import time
from pathlib import Path

import cupy
import torch

import wtconv_cuda as wt
from wtconv_cuda._bench.core import Config, CudaEventTimer, CupyEventTimer, time_median
from wtconv_cuda._bench.measure import (
    MeasureOptions, Runtime, build_implementations, make_inputs, measure_config,
)
from wtconv_cuda.bench import find_materialising

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forward_host_cost import print_profile  # noqa: E402


class StreamPerMarkTimer(CudaEventTimer):
    """The benchmark's timer before the twelfth session: the stream looked up at every mark."""

    def mark(self):
        event = self._spare.pop() if self._spare else self._torch.cuda.Event(enable_timing=True)
        event.record(self._torch.cuda.current_stream(self._device))
        return event


def host_us(fn, inputs, calls=200):
    """Median host time of one call (the call alone, the GPU left to run)."""
    times = []
    for i in range(calls):
        args = inputs[i % len(inputs)]
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
        if i % 20 == 19:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def queued_us(fn, inputs, calls=60):
    """Time per call of ``calls`` calls queued back to back between two events."""
    for args in inputs:
        fn(*args)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(calls):
        fn(*inputs[i % len(inputs)])
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3 / calls


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*", default=["64x768x7x7:2"])
    parser.add_argument("--measure", action="store_true",
                        help="run the benchmark's measure_config on each configuration first")
    parser.add_argument("--train", action="store_true", help="time training steps instead")
    args = parser.parse_args(argv)
    runtime = Runtime(torch, "cuda", cupy)
    torch.backends.cudnn.benchmark = True
    for text in args.configs:
        dims, levels = text.split(":")
        cfg = Config(*(int(v) for v in dims.split("x")), int(levels))
        if args.measure:
            materialising, _ = find_materialising()
            row = measure_config(cfg, "float32", runtime, MeasureOptions(), materialising, cupy)
            print(f"measure_config {cfg.label}: inference {row['inference_ms']}, "
                  f"training {row['training_ms']}, errors {row['errors']}", flush=True)
        impls = build_implementations(cfg, "float32", runtime, None, cupy)
        xs, dys = make_inputs(cfg, "float32", runtime)
        bench = impls["cupy"]
        prepared = [(bench.prepare(x),) for x in xs]
        own = [(cupy.array(x[0], copy=True),) for x in prepared]
        layer_weights = bench.forward.__defaults__[0]
        own_weights = wt.WTConvWeights(*(None if t is None else cupy.asarray(t.cpu().numpy())
                                         for t in layer_weights))
        view_weights = wt.WTConvWeights(*(None if t is None else cupy.from_dlpack(t)
                                          for t in layer_weights))

        plain = functools.partial(wt.forward, w=own_weights)
        no_ctx = functools.partial(wt.forward, w=view_weights)

        def plain_train(x, dy):
            tape = wt.Tape()
            wt.forward(x, own_weights, tape=tape)
            return tape.backward(dy)

        variants = {
            "bench": (bench.forward, prepared),
            "one_input": (bench.forward, prepared[:1]),
            "no_stream_ctx": (no_ctx, prepared),
            "own_weights": (plain, prepared),
            "own_inputs": (bench.forward, own),
            "module": (impls["ours"].forward, [(x,) for x in xs]),
            "dw7": (impls["dw7"].forward, [(x,) for x in xs]),
        }
        if args.train:
            pairs = [(bench.prepare(x), bench.prepare(dy)) for x, dy in zip(xs, dys)]
            variants = {
                "bench_train": (bench.train, pairs),
                "plain_train": (plain_train, pairs),
                "module_train": (impls["ours"].train, list(zip(xs, dys))),
                "dw7_train": (impls["dw7"].train, list(zip(xs, dys))),
            }
        print(f"== {cfg.label}", flush=True)
        for name, (fn, inputs) in variants.items():
            fn(*inputs[0])
            torch.cuda.synchronize()
            t = time_median(fn, inputs, CudaEventTimer(torch, runtime.device), 30, 3)
            old = time_median(fn, inputs, StreamPerMarkTimer(torch, runtime.device), 30, 3)
            c = time_median(fn, inputs, CupyEventTimer(cupy), 30, 3)
            print(f"{name:14s} torch events {t.median_ms * 1e3:7.1f} us (min {t.min_ms * 1e3:6.1f})"
                  f" | stream per mark {old.median_ms * 1e3:7.1f} us"
                  f" | cupy events {c.median_ms * 1e3:7.1f} us | host {host_us(fn, inputs):6.1f} us"
                  f" | queued {queued_us(fn, inputs):7.1f} us", flush=True)
        fn, inputs = variants["bench_train" if args.train else "bench"]
        turns = itertools.cycle(inputs)
        print_profile(lambda: fn(*next(turns)), top=20)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
