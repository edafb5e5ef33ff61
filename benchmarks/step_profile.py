"""Where a WTConvNeXt-T step's time goes: host issue time, GPU busy time, kernels.

Builds ConvNeXt-T and WTConvNeXt-T (``wtconvnext.py``'s networks), runs a few
warm-up steps, then for each network and phase (training step, inference):

* ``step ms``: wall time of a step, back to back (CUDA events, median);
* ``host ms``: time for the Python call of one step to return when it starts
  from an idle GPU (the host's cost of issuing it, unless something in it
  waits for the GPU);
* ``gpu busy ms``: the union of the step's kernel and copy intervals in a
  ``torch.profiler`` trace;
* the step's kernel time by category (ours, copies and casts, convolutions,
  GEMMs, the rest), and the calls that wait for the GPU (synchronisations,
  device-to-host copies).

If host ms is close to step ms and well above gpu busy ms, the step is
host-bound; the per-category table says which GPU work a change would save.

    python benchmarks/step_profile.py --dtype bf16 --out step_profile.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import wtconvnext as wn  # a sibling script: benchmarks/ is on sys.path

#: Kernel-name fragments -> category, first match wins.
CATEGORIES = (
    ("ours", ("wtconv", "_fwd_", "_bwd_", "cudapy")),
    ("copy/cast", ("copy", "Memcpy", "Memset", "cast", "to_copy")),
    ("conv", ("conv", "Conv", "cudnn", "depthwise", "xmma_fprop", "dgrad", "wgrad")),
    ("gemm", ("gemm", "Gemm", "cutlass", "sm90_xmma", "nvjet", "matmul")),
)
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
         "cudaMemcpy", "cuStreamSynchronize", "cuCtxSynchronize")


def category(name: str) -> str:
    for label, fragments in CATEGORIES:
        if any(f in name for f in fragments):
            return label
    return "other"


def busy_union_us(intervals) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, end = 0.0, -np.inf
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def host_issue_ms(fn, inputs, repeat: int) -> float:
    times = []
    for i in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*inputs[i % len(inputs)])
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return float(np.median(times))


def step_ms(fn, inputs, repeat: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(repeat):
        start.record()
        fn(*inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def trace(fn, inputs, steps: int) -> dict:
    """Kernel time by category, GPU busy time and waiting calls, per step."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            fn(*inputs[i % len(inputs)])
        torch.cuda.synchronize()
    by_cat, by_kernel, waits = defaultdict(float), defaultdict(float), defaultdict(int)
    intervals = []
    cpu_ops = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us = e.time_range.elapsed_us()
            by_cat[category(e.name)] += us / steps
            by_kernel[e.name[:90]] += us / steps
            intervals.append((e.time_range.start, e.time_range.end))
        else:
            if any(e.name.startswith(w) for w in WAITS):
                waits[e.name] += 1
            if e.name.startswith("aten::") or e.name.startswith("autograd::"):
                cpu_ops[e.name] += e.self_cpu_time_total / steps
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:15]
    top_cpu = sorted(cpu_ops.items(), key=lambda kv: -kv[1])[:15]
    return {"gpu_busy_ms": busy_union_us(intervals) / steps / 1e3,
            "kernel_ms_by_category": {k: v / 1e3 for k, v in sorted(by_cat.items())},
            "waits_per_step": {k: v / steps for k, v in waits.items()},
            "top_kernels_ms": [(k, v / 1e3) for k, v in top],
            "top_aten_self_cpu_ms": [(k, v / 1e3) for k, v in top_cpu]}


def measure(net: str, args, device) -> dict:
    model, source = wn.build_network(net, args.arch, False, 1000, wn.STAGE_LEVELS, 0)
    model = model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    inputs = wn._inputs(args.batch, 224, 1000, device)
    out = {"arch": source}
    phases = {"train": wn.make_train_step(model, optimizer, args.dtype, "cuda"),
              "infer": wn.make_infer_step(model, args.dtype, "cuda")}
    for phase, fn in phases.items():
        if phase == "infer":
            model.eval()
        for i in range(args.warmup):
            fn(*inputs[i % len(inputs)])
        torch.cuda.synchronize()
        row = {"step_ms": step_ms(fn, inputs, args.steps),
               "host_ms": host_issue_ms(fn, inputs, args.steps)}
        row.update(trace(fn, inputs, args.trace_steps))
        out[phase] = row
    return out


def report(results: dict) -> str:
    lines = []
    for net, r in results.items():
        for phase in ("train", "infer"):
            row = r[phase]
            cats = "  ".join(f"{k} {v:.2f}" for k, v in row["kernel_ms_by_category"].items())
            lines.append(f"{net:11s} {phase:5s}  step {row['step_ms']:6.2f} ms  host "
                         f"{row['host_ms']:6.2f} ms  gpu busy {row['gpu_busy_ms']:6.2f} ms  "
                         f"| kernels (ms): {cats}  | waits/step: {row['waits_per_step'] or 'none'}")
    for net, r in results.items():
        for phase in ("train", "infer"):
            lines.append(f"\n{net} {phase}: top kernels (ms per step)")
            lines += [f"  {v:7.3f}  {k}" for k, v in r[phase]["top_kernels_ms"]]
            lines.append(f"{net} {phase}: top aten ops by self CPU time (ms per step)")
            lines += [f"  {v:7.3f}  {k}" for k, v in r[phase]["top_aten_self_cpu_ms"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--arch", choices=("auto", "timm", "builtin"), default="auto")
    parser.add_argument("--nets", nargs="+", default=["convnext", "wtconvnext"])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--trace-steps", type=int, default=3)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("step_profile.py needs a CUDA device")
        return 1
    device = torch.device("cuda", 0)
    torch.backends.cudnn.benchmark = True
    storages = ("float32", "bfloat16") if args.dtype == "bf16" else ("float32",)
    print(wn.precompile_kernels(224, wn.STAGE_LEVELS, storages), flush=True)
    results = {net: measure(net, args, device) for net in args.nets}
    print(report(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
