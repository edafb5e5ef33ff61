"""What a Python ``autograd.Function``'s backward costs on PyTorch's autograd device thread.

``loss.backward()`` on CUDA tensors runs the backward nodes on a per-device
autograd thread, not the calling one. `host_profile.py` measured the
layer's training step at ~760 us that way and ~480 us with the backward on the
calling thread, while a trivial ``Function`` pays only ~40-60 us for the hand-off.
This script finds out which part of a backward body gets slower on that
thread: for each body below it times

* ``direct``: the body called on this thread;
* ``step``: ``y = F.apply(x); y.backward(g)`` with the body as ``F``'s backward,
  from the calling thread (so the body runs on the autograd thread);
* ``step - direct``: the hand-off plus whatever the body loses on the other thread.

    python benchmarks/autograd_thread_cost.py --calls 300
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def _busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def bodies(x):
    """Name -> backward body ``f(grad) -> grad`` (each returns a tensor like ``grad``)."""
    from wtconv_cuda.bindings import _common
    from wtconv_cuda.bindings import torch as wt_torch
    from wtconv_cuda.bindings.torch import WTConv2d

    index = x.device.index
    layer = WTConv2d(8, 8, 5, wt_levels=1).to(x.device)
    params = layer._parameters_in_flat_order()
    sizes = _common.check_layer(tuple(x.shape), (8, 5, 5), (8,), (8,), (1, 8, 4, 5, 5),
                                (1, 8, 4), 1, 1)
    weights = [params[0], params[1], params[2], params[3], params[4]]

    def nothing(g):
        return g

    def python_100us(g):
        _busy(100)
        return g

    def seven_empty(g):
        for _ in range(7):
            torch.empty((8, 5, 5), device=g.device)
        return g

    def device_scope(g):
        with _common.DeviceScope(index):
            pass
        return g

    def current_stream(g):
        wt_torch._current_stream(index)
        return g

    def launcher(g):
        wt_torch._launcher(g.device)
        return g

    def layer_backward(g):
        return wt_torch._backward_cuda(g, x, *weights, 1, sizes)[0]

    return {"nothing": nothing, "python busy 100 us": python_100us,
            "7 x torch.empty": seven_empty, "DeviceScope enter/exit": device_scope,
            "current stream handle": current_stream, "_launcher()": launcher,
            "the layer's _backward_cuda": layer_backward}


def make_function(body):
    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return body(g)

    return Probe


def median_us(fn, calls: int) -> float:
    times = []
    for i in range(calls + 20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        if i >= 20:
            times.append((t1 - t0) * 1e6)
    torch.cuda.synchronize()
    return float(np.median(times))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("autograd_thread_cost.py needs a CUDA device")
        return 1
    x = torch.randn(1, 8, 16, 16, device="cuda")
    g = torch.randn_like(x)
    xr = x.clone().requires_grad_()
    print(f"{'backward body':30s} {'direct us':>10s} {'step us':>10s} {'step - direct':>14s}")
    for name, body in bodies(x).items():
        probe = make_function(body)

        def step():
            probe.apply(xr).backward(g)

        def forward_only():
            with torch.no_grad():
                probe.apply(xr)

        direct = median_us(lambda: body(g), args.calls)
        total = median_us(step, args.calls)
        base = median_us(forward_only, args.calls)
        print(f"{name:30s} {direct:10.1f} {total:10.1f} {total - direct:14.1f}"
              f"   (forward alone {base:.1f})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
