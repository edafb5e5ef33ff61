"""Where the host time of a PyTorch training step goes, piece by piece.

On a tiny problem the GPU work is a few microseconds, so each timing below is
the host cost of one piece of the ``WTConv2d`` training path: the module's
weight views, the custom ops, the autograd machinery, and the raw kernel
launches underneath. A cProfile of the whole step (backward on the calling
thread, so the profiler sees it) follows the table.

    python benchmarks/host_profile.py --calls 500 > host_profile.txt

Prints a table of microseconds per call, then the profile's top entries.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import numpy as np
from binding_overhead import measure  # a sibling script: benchmarks/ is on sys.path


def split_step_us(fn, steps, torch):
    """Median host time to enqueue one call of ``fn`` from an idle GPU, and its GPU time.

    Each call starts after a synchronisation, so the launch queue is empty:
    the first number is pure host cost, the second the GPU's time from the
    first to the last queued event (which includes any gap while the host
    was still launching).
    """
    host, gpu = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(steps + 10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        fn()
        end.record()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        if i >= 10:
            host.append((t1 - t0) * 1e6)
            gpu.append(start.elapsed_time(end) * 1e3)
    return float(np.median(host)), float(np.median(gpu))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--shape", type=int, nargs=4, default=(1, 8, 16, 16), metavar="BCHW")
    parser.add_argument("--levels", type=int, default=1)
    parser.add_argument("--kernel-size", type=int, default=5)
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--split-only", action="store_true",
                        help="only the one-step host/GPU split, no table or profile")
    args = parser.parse_args(argv)

    import torch

    import wtconv_cuda as wt
    from wtconv_cuda.bindings import torch as wttorch

    b, c, h, w = args.shape
    k, levels = args.kernel_size, args.levels
    dev = torch.device("cuda", 0)
    weights = wt.init_weights(c, k, levels, seed=0, dtype=np.float32)
    layer = wttorch.WTConv2d.from_weights(weights).to(dev)
    x = torch.randn(b, c, h, w, device=dev)
    x_grad = x.clone().requires_grad_()
    dy = torch.randn(b, c, h, w, device=dev)
    conv = torch.nn.Conv2d(c, c, 7, padding=3, groups=c).to(dev)
    with torch.no_grad():
        kw = tuple(layer.kernel_weights())
    sizes = wttorch._check_tensors(x, *kw, 1)

    def train():
        layer(x_grad).backward(dy)

    def train_conv():
        conv(x_grad).backward(dy)

    def train_ops():
        torch.ops.wtconv_cuda.wtconv2d_fwd(x_grad, *layer.kernel_weights(), 1).backward(dy)

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, g):
            return g

    def trivial():
        Identity.apply(x_grad).backward(dy)

    pieces = {}
    sync = torch.cuda.synchronize

    print("one call at a time from an idle GPU (median of 200): host enqueue us, GPU us")
    for name, fn in (("module forward + backward", train),
                     ("depthwise 7x7 forward + backward", train_conv),
                     ("impl _backward_cuda", lambda: wttorch._backward_cuda(dy, x, *kw, 1,
                                                                            sizes))):
        host, gpu = split_step_us(fn, 200, torch)
        print(f"  {name:40s} {host:9.1f} {gpu:9.1f}")
    if args.split_only:
        return

    def add(name, fn):
        result = measure(fn, sync, args.calls, warmup=20)
        pieces[name] = result["host_us"], result["wall_us"]

    with torch.no_grad():
        add("module kernel_weights() (no grad)", layer.kernel_weights)
        add("impl _forward_cuda", lambda: wttorch._forward_cuda(x, *kw, 1, sizes))
        add("impl _backward_cuda", lambda: wttorch._backward_cuda(dy, x, *kw, 1, sizes))
        add("op wtconv2d_fwd", lambda: torch.ops.wtconv_cuda.wtconv2d_fwd(x, *kw, 1))
        add("op wtconv2d_bwd", lambda: torch.ops.wtconv_cuda.wtconv2d_bwd(dy, x, *kw, 1))
        add("module forward (no grad)", lambda: layer(x))
    add("module kernel_weights() (grad)", layer.kernel_weights)
    add("module forward (grad, graph built)", lambda: layer(x_grad))
    add("module forward + backward", train)
    add("custom ops forward + backward (the torch.compile path, eager)", train_ops)
    add("trivial Python autograd.Function forward + backward", trivial)
    torch.autograd.set_multithreading_enabled(False)
    add("module forward + backward, backward on this thread", train)
    add("trivial Function forward + backward, on this thread", trivial)
    torch.autograd.set_multithreading_enabled(True)
    add("depthwise 7x7 forward + backward (reference)", train_conv)

    print(f"shape {args.shape}, K {k}, L {levels}, {torch.cuda.get_device_name(dev)}, "
          f"torch {torch.__version__}")
    from wtconv_cuda.bindings import _common

    handles = _common.device_kernels(0)._handles
    print(f"direct cuLaunchKernel handles: {sum(h is not None for h in handles.values())} of "
          f"{len(handles)} kernels")
    print(f"{'piece':66s} {'host us':>9s} {'wall us':>9s}")
    for name, (host, wall) in pieces.items():
        print(f"{name:66s} {host:9.1f} {wall:9.1f}")

    torch.autograd.set_multithreading_enabled(False)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(200):
        train()
    sync()
    profile.disable()
    torch.autograd.set_multithreading_enabled(True)
    for key in ("tottime", "cumulative"):
        stream = io.StringIO()
        pstats.Stats(profile, stream=stream).sort_stats(key).print_stats(args.top)
        print(f"\n== cProfile of 200 training steps, by {key}\n{stream.getvalue()}")


if __name__ == "__main__":
    main()
