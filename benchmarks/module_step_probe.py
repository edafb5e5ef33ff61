"""Where the host time of ``WTConv2d``'s small training step goes, op by op.

The user benchmark's host-overhead row times ``y = layer(x);
torch.autograd.grad(y, (x, *params), dy)`` at (1, 8, 16, 16), L 3, K 5 back to
back (GPU work per step: a few microseconds). This script times that step and
variants of it that remove one piece each, then records the step under
``torch.profiler`` (CPU activities, both threads: the backward runs on the
autograd device thread) and prints the ops by self host time.

Variants (microseconds per step, back to back, one synchronisation at the end):

* ``step``: the benchmark's step;
* ``step, backward on this thread``: autograd multithreading off;
* ``step, kernels not launched``: ``PointerLauncher.call`` is a no-op (the
  outputs are garbage; host cost only);
* ``forward (graph built)``, ``forward (no grad)``;
* ``depthwise 7x7 step``: the reference the target compares against.

    python benchmarks/module_step_probe.py --calls 300 --trace step_trace.json.gz
    python benchmarks/module_step_probe.py --tree ab_base --profiled-steps 0   # another checkout

For a before/after on one host, alternate ``--tree`` runs of the base checkout
(e.g. ``git archive REV | tar -x -C ab_base``) with runs of this one.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys

import numpy as np
from binding_overhead import measure  # a sibling script: benchmarks/ is on sys.path


def per_call_us(fn, sync, calls: int, warmup: int = 30) -> float:
    """Microseconds per call of ``fn`` back to back, to the final synchronisation."""
    return measure(fn, sync, calls, warmup)["wall_us"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the table")
    parser.add_argument("--levels", type=int, default=3)
    parser.add_argument("--profiled-steps", type=int, default=50, help="0: no profile")
    parser.add_argument("--tree", default=None, help="checkout whose wtconv_cuda to import")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--trace", default=None, help="write a gzipped Chrome trace here")
    args = parser.parse_args(argv)
    if args.tree:
        sys.path.insert(0, args.tree)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from wtconv_cuda.bindings import _common
    from wtconv_cuda.bindings.torch import WTConv2d

    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    layer = WTConv2d(8, 8, 5, wt_levels=args.levels).to(dev)
    params = tuple(p for p in layer.parameters() if p.requires_grad)
    conv = torch.nn.Conv2d(8, 8, 7, padding=3, groups=8).to(dev)
    conv_params = tuple(conv.parameters())
    x = torch.randn(1, 8, 16, 16, device=dev, requires_grad=True)
    dy = torch.randn(1, 8, 16, 16, device=dev)
    torch.backends.cudnn.benchmark = True
    sync = torch.cuda.synchronize

    def step():
        return torch.autograd.grad(layer(x), (x, *params), dy)

    def forward_graph():
        return layer(x)

    def forward_no_grad():
        with torch.no_grad():
            return layer(x)

    def conv_step():
        return torch.autograd.grad(conv(x), (x, *conv_params), dy)

    real_call = _common.PointerLauncher.call

    def stubbed_step():
        _common.PointerLauncher.call = lambda *a, **k: None
        try:
            return step()
        finally:
            _common.PointerLauncher.call = real_call

    def single_thread_step():
        torch.autograd.set_multithreading_enabled(False)
        try:
            return step()
        finally:
            torch.autograd.set_multithreading_enabled(True)

    variants = {
        "step": step,
        "step, backward on this thread": single_thread_step,
        "step, kernels not launched": stubbed_step,
        "forward (graph built)": forward_graph,
        "forward (no grad)": forward_no_grad,
        "depthwise 7x7 step": conv_step,
    }
    # results must match the unstubbed step before timing anything
    ref = step()
    again = single_thread_step()
    assert all(torch.equal(a, b) for a, b in zip(ref, again)), "thread variants differ"
    table = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            table[name].append(per_call_us(fn, sync, args.calls))
    import wtconv_cuda

    print(f"(1, 8, 16, 16), L {args.levels}, K 5, fp32, {torch.cuda.get_device_name(dev)}, "
          f"torch {torch.__version__}; us per call, {args.rounds} rounds of {args.calls}; "
          f"wtconv_cuda from {wtconv_cuda.__file__}")
    for name, values in table.items():
        print(f"  {name:34s} median {np.median(values):8.1f}   rounds "
              + " ".join(f"{v:7.1f}" for v in values))

    if args.profiled_steps < 1:
        return
    for _ in range(20):
        step()
    sync()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.profiled_steps):
            step()
        sync()
    print(f"\n== torch.profiler, {args.profiled_steps} steps, by self CPU time")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
    if args.trace:
        plain = args.trace[:-3] if args.trace.endswith(".gz") else args.trace
        prof.export_chrome_trace(plain)
        if plain != args.trace:
            with open(plain, "rb") as src, gzip.open(args.trace, "wb") as dst:
                dst.write(src.read())
        summarise_trace(plain, args.profiled_steps)


def summarise_trace(path: str, steps: int) -> None:
    """Per thread: busy microseconds per step at the top level, and the longest gaps."""
    with open(path) as handle:
        events = [e for e in json.load(handle)["traceEvents"] if e.get("ph") == "X"]
    by_thread: dict = {}
    for e in events:
        by_thread.setdefault(e["tid"], []).append(e)
    print("\n== trace: per thread, top-level events")
    for tid, evs in by_thread.items():
        evs.sort(key=lambda e: e["ts"])
        top, end = [], -1.0
        for e in evs:
            if e["ts"] >= end:
                top.append(e)
                end = e["ts"] + e["dur"]
        busy = sum(e["dur"] for e in top)
        names: dict = {}
        for e in top:
            names[e["name"]] = names.get(e["name"], 0.0) + e["dur"]
        head = sorted(names.items(), key=lambda kv: -kv[1])[:8]
        print(f"thread {tid}: {len(top)} top-level events, {busy / steps:.1f} us busy per step")
        for name, dur in head:
            print(f"    {dur / steps:8.1f} us/step  {name[:90]}")


if __name__ == "__main__":
    main()
