"""Sweep launch shapes (threads, strip, register cap) of the fused kernels.

Compiles every variant in parallel, then times forward and backward of each
at the ConvNeXt-T stage shapes with CUDA events (median of 30, three rotating
input sets). Prints one line per variant and writes JSON.

    python benchmarks/tune.py --json tune.json
"""

from __future__ import annotations

import argparse
import itertools
import json

import numpy as np

import cupy

from wtconv_cuda._bench.core import CupyEventTimer, time_median
from wtconv_cuda.kernels.compiler import gpu_kernel
from wtconv_cuda.kernels.launch import (
    CupyBackend, Problem, Tuning, Weights, plan_plane, run_backward, run_forward,
)
from wtconv_cuda.kernels.warmup import compile_all

SHAPES = [(64, 96, 56, 56, 5), (64, 192, 28, 28, 4), (64, 384, 14, 14, 3), (64, 768, 7, 7, 2)]


STORAGE_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def random_array(rng, shape, dtype, uniform=False):
    """A random CuPy array; bfloat16 as raw ``uint16`` bits (the kernels' storage)."""
    values = rng.uniform(-1, 1, shape) if uniform else rng.standard_normal(shape)
    values = values.astype(np.float32)
    if dtype is np.uint16:  # truncate float32 to its upper half: a valid bfloat16
        return cupy.asarray((values.view(np.uint32) >> 16).astype(np.uint16))
    return cupy.asarray(values.astype(dtype))


def launch_regs(row):
    """Registers of the backward variant (the same for every batch chunk)."""
    return next(v for k, v in row.items() if k.startswith("backward") and k.endswith("_regs"))


def median_ms(fn, n_inputs=3, repeat=30):
    """Median milliseconds of ``fn(i)`` for rotating input indices ``i``, CUDA events."""
    inputs = [(i,) for i in range(n_inputs)]
    return time_median(fn, inputs, CupyEventTimer(cupy), repeat, warmup=3).median_ms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--threads", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--strips", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--regs", type=int, nargs="+", default=[0, 64],
                        help="register caps (0: no cap)")
    parser.add_argument("--groups", type=int, nargs="+", default=[0])
    parser.add_argument("--warp-sync", nargs="+", default=["auto"], choices=["auto", "0", "1"],
                        help="syncwarp groups: auto (on for 32 threads), 0 or 1")
    parser.add_argument("--tunings", nargs="+", default=None, metavar="T:Q:REGS:G:WS",
                        help="explicit tunings instead of the product of the lists above, "
                             "e.g. 128:4:0:2:auto (0 = default for REGS and G)")
    parser.add_argument("--heights", type=int, nargs="+", default=None,
                        help="only the ConvNeXt-T stages of these plane heights")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--storage", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--chunks", type=int, nargs="+", default=[0],
                        help="backward batch entries per work unit (0 = the default)")
    args = parser.parse_args()
    backend = CupyBackend()
    k = args.k
    shapes = [s for s in SHAPES if args.heights is None or s[2] in args.heights]
    ws = {"auto": None, "0": False, "1": True}
    if args.tunings:
        fields = [t.split(":") for t in args.tunings]
        # 0 takes the planner's default (REGS: launch.REGISTER_CAP), as the help says; a
        # literal 0 would compile without a register cap.
        tunings = [Tuning(int(t), int(q), int(r) or None, int(g) or None, ws[w])
                   for t, q, r, g, w in fields]
    else:
        tunings = [Tuning(t, s, r, g or None, ws[w]) for t, s, r, g, w in
                   itertools.product(args.threads, args.strips, args.regs, args.groups,
                                     args.warp_sync)]
        tunings = [t for t in tunings if not (t.warp_sync and 32 % t.threads)]
    specs = set()
    for (b, c, h, w, lv), tuning, chunk in itertools.product(shapes, tunings, args.chunks):
        problem = Problem(b, c, h, w, k, lv, 1, args.storage, True)
        for backward, t in ((False, tuning), (True, tuning._replace(batch_chunk=chunk or None))):
            specs.add(plan_plane(problem, backward, backend.shared_limit, backend.max_slots,
                                 t).spec)
    compile_all(sorted(specs, key=repr), (9, 0), 16)
    rows = []
    rng = np.random.default_rng(0)
    dtype = STORAGE_DTYPES[args.storage]
    for b, c, h, w, lv in shapes:
        problem = Problem(b, c, h, w, k, lv, 1, args.storage, True)
        xs = [random_array(rng, (b, c, h, w), dtype) for _ in range(3)]
        dys = [random_array(rng, (b, c, h, w), dtype) for _ in range(3)]
        wts = Weights(*(random_array(rng, s, dtype, uniform=True) for s in
                        [(c, k, k), (c,), (c,), (lv, c, 4, k, k), (lv, c, 4)]))
        grads = Weights(*(cupy.empty_like(a) for a in wts))
        y = cupy.empty_like(xs[0])
        dx = cupy.empty_like(xs[0])
        floor_ms = 2 * xs[0].nbytes / 4.0e12 * 1e3  # forward: read x, write y
        best = {}
        for tuning in tunings:
            row = dict(shape=[b, c, h, w], levels=lv, k=k, tuning=tuning._asdict())
            passes = [(False, tuning)] + [
                (True, tuning._replace(batch_chunk=chunk or None)) for chunk in args.chunks]
            for backward, t in passes:
                launch = plan_plane(problem, backward, backend.shared_limit, backend.max_slots, t)
                attrs = gpu_kernel(launch.spec, backend.device_id).attributes
                if backward:
                    ms = median_ms(lambda i: run_backward(backend, problem, xs[i], dys[i], dx,
                                                          wts, grads, t))
                    key = f"backward_rb{launch.batch_chunk}"
                else:
                    ms = median_ms(lambda i: run_forward(backend, problem, xs[i], y, wts, t))
                    key = "forward"
                row[key + "_ms"] = ms
                row[key + "_regs"] = attrs["num_regs"]
                row[key + "_local"] = attrs["local_size_bytes"]
                if ms < best.get(key, (1e9,))[0]:
                    best[key] = (ms, t)
            rows.append(row)
            times = "  ".join(f"{k_[:-3]} {v:.3f}" for k_, v in row.items() if k_.endswith("_ms"))
            print(f"{(b, c, h, w, lv)} {tuning} ms: {times} (regs fwd {row['forward_regs']} "
                  f"bwd {launch_regs(row)}, local fwd {row['forward_local']})", flush=True)
        print(f"BEST {(b, c, h, w, lv)} floor(fwd) {floor_ms:.3f} ms:",
              {k_: (round(v[0], 3), tuple(v[1])) for k_, v in best.items()}, flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
