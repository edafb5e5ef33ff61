"""Backward-pass times of the plane backward's two ways to compute ``dx``, on a GPU.

At the ConvNeXt-T stages, for each dtype: the backward (``dx`` and every
weight gradient, ``wtconv_cuda.kernels.launch.run_backward``) with

- ``one-kernel``: ``dx`` in the plane kernel (``Tuning(dx_forward=False)``);
- ``default``: the planner's choice (``dx_forward_plan``): ``dx`` from the
  forward kernels in batch chunks whose work buffers stay within
  ``DX_FORWARD_BUFFER_FRACTION`` of the bytes of ``x``, on the forward without
  a split where no split fits ("no split");
- ``whole``: ``dx`` from the forward kernels on the whole batch at once,
  whatever its work buffers (``Tuning(dx_forward=True, dx_batch=B)``).

Medians of 30 runs (CUDA events, three rotating input sets, after warm-up),
plus the chunking and the float32 work-buffer bytes held while ``dx`` runs,
as a fraction of the bytes of ``x``. bfloat16 arrays travel as their raw bits.

    python benchmarks/dx_forward_bench.py --json out.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import cupy

from wtconv_cuda.kernels import launch
from wtconv_cuda._bench.core import CupyEventTimer, time_median

STAGES = [(64, 96, 56, 56, 5), (64, 192, 28, 28, 4), (64, 384, 14, 14, 3)]
K = 5


def random_storage(rng, shape, storage):
    """A CuPy array of standard normals in ``storage`` (bfloat16 as truncated raw bits)."""
    values = rng.standard_normal(shape).astype(np.float32)
    if storage == "bfloat16":
        values = (values.view(np.uint32) >> 16).astype(np.uint16)
    else:
        values = values.astype(storage)
    return cupy.asarray(values)


def weights_of(rng, c, levels, storage):
    shapes = [(c, 1, K, K), (c,), (c,), (levels, c, 4, 1, K, K), (levels, c, 4)]
    arrays = [random_storage(rng, s, storage) for s in shapes]
    return launch.Weights(*arrays)


def stage_inputs(stage, storage):
    """``(problem, weights, sets)`` of a stage ``(B, C, H, W, L)``: its stride-1 problem
    with bias at `K`, random weights and three random ``(x, dy)`` sets."""
    b, c, h, w, levels = stage
    problem = launch.Problem(b, c, h, w, K, levels, 1, storage, True)
    rng = np.random.default_rng(0)
    weights = weights_of(rng, c, levels, storage)
    sets = [(random_storage(rng, (b, c, h, w), storage), random_storage(rng, (b, c, h, w), storage))
            for _ in range(3)]
    return problem, weights, sets


def bench_stage(stage, storage, backend):
    b, c, h, w, levels = stage
    problem, weights, sets = stage_inputs(stage, storage)
    dx = cupy.empty_like(sets[0][0])
    grads = launch.Weights(*(cupy.empty_like(a) for a in weights))
    itemsize = launch.ITEMSIZE[storage]
    row = dict(shape=[b, c, h, w], levels=levels, k=K, storage=storage)
    for name, tuning in [("one-kernel", launch.Tuning(dx_forward=False)),
                         ("default", launch.Tuning()),
                         ("whole", launch.Tuning(dx_forward=True, dx_batch=b))]:
        def step(x, dy, tuning=tuning):
            launch.run_backward(backend, problem, x, dy, dx, weights, grads, tuning)
        ms = time_median(step, sets, CupyEventTimer(cupy), 30, 3).median_ms
        plan = launch.dx_forward_plan(problem, backend.shared_limit, backend.max_slots, tuning)
        batches = () if plan is None else plan.batches
        held = (launch.dx_forward_floats(problem, batches, backend.shared_limit,
                                         backend.max_slots, plan.tuning) if batches else 0)
        row[name] = dict(ms=ms, batches=list(batches),
                         no_split=bool(batches) and plan.tuning == launch.DX_NO_SPLIT,
                         dx_buffers_of_x=4 * held / (b * c * h * w * itemsize))
    return row


def stage_cli(description: str, stages, bench, describe, argv=None) -> list:
    """The stage benchmarks' command line: ``--storage`` and ``--json``; ``bench(stage,
    storage, backend)`` for every dtype and stage, a line ``describe(row)`` printed for
    each; the rows written as JSON. Returns the rows."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", default=None)
    parser.add_argument("--storage", nargs="+", default=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    backend = launch.CupyBackend()
    rows = []
    for storage in args.storage:
        for stage in stages:
            row = bench(stage, storage, backend)
            rows.append(row)
            print(f"{str(tuple(stage)):24s} {storage:9s} {describe(row)}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def main():
    stage_cli(__doc__.splitlines()[0], STAGES, bench_stage, lambda row: "  ".join(
        f"{n} {row[n]['ms']:.3f} ms {row[n]['batches']}"
        f"{' no split' if row[n]['no_split'] else ''} "
        f"({row[n]['dx_buffers_of_x']:.2f} x)" for n in ("one-kernel", "default", "whole")))


if __name__ == "__main__":
    main()
