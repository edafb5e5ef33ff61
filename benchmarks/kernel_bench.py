"""Kernel-level timings of the fused layer on a GPU (CuPy), with the floor.

For each configuration: median time of forward and of backward (dx and all
weight gradients) over >= 30 runs timed with CUDA events after warm-up,
rotating three input sets so that L2 does not flatter; the compulsory bytes
(forward: read x, write y; backward: read x and dy, write dx) against a
measured device-to-device copy bandwidth; PyTorch's depthwise 7x7 for scale;
and the host cost of a tiny call measured end to end from Python.

    python benchmarks/kernel_bench.py --json out.json
    python benchmarks/kernel_bench.py --dtypes float32 --edges 56 28   # two stages only
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import cupy

import wtconv_cuda as wt
from wtconv_cuda._bench.core import CupyEventTimer, host_time_per_call, time_median
from wtconv_cuda.weights import WTConvWeights

CONFIGS = [  # (B, C, H, W, L, K)
    (64, 96, 56, 56, 5, 5), (64, 192, 28, 28, 4, 5), (64, 384, 14, 14, 3, 5),
    (64, 768, 7, 7, 2, 5), (8, 64, 256, 256, 3, 5), (8, 32, 512, 512, 5, 5),
]


def cuda_time(fn, inputs, repeat=30, warmup=3) -> float:
    """Median milliseconds of ``fn(*inputs[i % len(inputs)])`` timed with CUDA events."""
    return time_median(fn, inputs, CupyEventTimer(cupy), repeat, warmup).median_ms


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted)."""
    n = 1 << 29  # 2 GiB of float32
    a = cupy.random.random(n // 4, dtype=cupy.float32)
    b = cupy.empty_like(a)
    ms = cuda_time(lambda: b.__setitem__(Ellipsis, a), [()], repeat=20)
    return 2 * a.nbytes / (ms * 1e-3)


def device_weights(c, k, levels, dtype, rng):
    w = wt.init_weights(c, k, levels, dtype=np.float32, seed=int(rng.integers(1 << 30)))
    scales = rng.uniform(0.5, 1.5, w.wavelet_scale.shape).astype(np.float32)
    w = w._replace(wavelet_scale=scales)
    return WTConvWeights(*(None if a is None else cupy.asarray(a.astype(dtype)) for a in w))


def bench_config(cfg, dtype, bandwidth, torch_mod):
    b, c, h, w_, levels, k = cfg
    rng = np.random.default_rng(0)
    weights = device_weights(c, k, levels, dtype, rng)
    xs = [cupy.asarray(rng.standard_normal((b, c, h, w_)).astype(dtype)) for _ in range(3)]
    dys = [cupy.asarray(rng.standard_normal((b, c, h, w_)).astype(dtype)) for _ in range(3)]
    saved = [wt.Saved(x, weights, levels, 1) for x in xs]
    fwd = cuda_time(lambda x: wt.forward(x, weights), [(x,) for x in xs])
    bwd = cuda_time(lambda s, dy: wt.backward(s, dy), list(zip(saved, dys)))
    nbytes = xs[0].nbytes
    row = dict(shape=[b, c, h, w_], levels=levels, k=k, dtype=np.dtype(dtype).name,
               forward_ms=fwd, backward_ms=bwd, train_ms=fwd + bwd,
               forward_floor_ms=2 * nbytes / bandwidth * 1e3,
               backward_floor_ms=3 * nbytes / bandwidth * 1e3)
    row["forward_roofline"] = row["forward_floor_ms"] / fwd
    row["backward_roofline"] = row["backward_floor_ms"] / bwd
    if torch_mod is not None:
        row.update(torch_depthwise7(torch_mod, xs, dys, dtype))
    return row


def torch_depthwise7(torch, xs, dys, dtype):
    tdtype = {np.float32: torch.float32, np.float16: torch.float16}[dtype]
    c = xs[0].shape[1]
    conv = torch.nn.Conv2d(c, c, 7, padding=3, groups=c).cuda().to(tdtype)
    txs = [torch.from_dlpack(x).requires_grad_(True) for x in xs]
    tdys = [torch.from_dlpack(dy) for dy in dys]

    def fwd(x):
        with torch.no_grad():
            conv(x)

    def train(x, dy):
        conv(x).backward(dy)

    f = cuda_time(fwd, [(x,) for x in txs])
    t = cuda_time(train, list(zip(txs, tdys)))
    return dict(dw7_forward_ms=f, dw7_train_ms=t)


def host_overhead(repeat=2000):
    """Microseconds per call of a (1, 8, 16, 16) forward and training step, end to end."""
    rng = np.random.default_rng(1)
    weights = device_weights(8, 5, 3, np.float32, rng)
    x = cupy.asarray(rng.standard_normal((1, 8, 16, 16)).astype(np.float32))
    dy = cupy.asarray(rng.standard_normal((1, 8, 16, 16)).astype(np.float32))

    def train_step():
        tape = wt.Tape()
        wt.forward(x, weights, tape=tape)
        tape.backward(dy)

    sync = cupy.cuda.Device().synchronize
    return {"forward_us": host_time_per_call(lambda: wt.forward(x, weights), calls=repeat,
                                             warmup=50, sync=sync),
            "train_step_us": host_time_per_call(train_step, calls=repeat, warmup=50, sync=sync)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16"])
    parser.add_argument("--edges", nargs="+", type=int, default=None,
                        help="time only the configurations with these plane edges (H), "
                             "e.g. 56 28 for two ConvNeXt-T stages")
    args = parser.parse_args()
    configs = [cfg for cfg in CONFIGS if args.edges is None or cfg[2] in args.edges]
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s")
    rows = []
    for dtype in args.dtypes:
        for cfg in configs:
            row = bench_config(cfg, np.dtype(dtype).type, bandwidth, torch)
            rows.append(row)
            print(f"{str(tuple(cfg)):28s} {dtype:8s} fwd {row['forward_ms']:.3f} ms "
                  f"({row['forward_roofline']:.0%} of floor)  bwd {row['backward_ms']:.3f} ms "
                  f"({row['backward_roofline']:.0%})  dw7 fwd {row.get('dw7_forward_ms', 0):.3f} "
                  f"train {row.get('dw7_train_ms', 0):.3f} vs ours {row['train_ms']:.3f}")
    overhead = host_overhead()
    print("host overhead (1,8,16,16):", {k: round(v, 1) for k, v in overhead.items()})
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(dict(bandwidth=bandwidth, rows=rows, host_overhead=overhead), handle, indent=1)


if __name__ == "__main__":
    main()
