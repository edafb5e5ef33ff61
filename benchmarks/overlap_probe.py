"""Probe: the backward's ``dx`` forward and its weight gradients on two streams at once.

Where the plane backward runs ``weights_only`` (the 56 x 56 and 28 x 28
ConvNeXt-T stages), ``run_backward`` issues two independent parts on one
stream: ``wtconv_flip`` and the forward's launches on ``dy`` (writing ``dx``),
then the weights-only plane kernel and ``wtconv_finalize`` (reading ``x`` and
``dy``). Each part leaves most of a multiprocessor's issue slots idle (the
weights-only kernel: four 128-thread blocks per SM, barrier and load stalls;
the tiles: one- or four-warp blocks with phases). This script times

- ``serial``: ``launch.run_backward`` as it stands;
- ``streams``: the same launches, the ``dx`` part on one non-blocking stream
  and the weights part on another, forked from and joined to the current
  stream with events,

medians of 30 calls each (CUDA events on the current stream, three rotating
input sets), and checks that both give the same ``dx`` and gradients bit for
bit. Nothing in the package uses two streams; this measures whether it would
pay.

    python benchmarks/overlap_probe.py --storage float32 bfloat16
"""

from __future__ import annotations

import cupy

from wtconv_cuda._bench.core import CupyEventTimer, time_median
from wtconv_cuda.kernels import launch

from dx_forward_bench import K, stage_cli, stage_inputs

STAGES = [(64, 96, 56, 56, 5), (64, 192, 28, 28, 4)]


def two_streams(backend, problem, streams):
    """``run_backward`` for a ``weights_only`` plan, its two parts on ``streams``."""
    plan = launch.plan_plane(problem, True, backend.shared_limit, backend.max_slots)
    if not plan.spec.weights_only:
        raise SystemExit(f"{problem}: the plane backward is not weights_only here")
    dx_plan = launch.dx_forward_plan(problem, backend.shared_limit, backend.max_slots)

    def step(x, dy, dx, weights, grads):
        main = cupy.cuda.get_current_stream()
        forked = main.record()
        for stream in streams:
            stream.wait_event(forked)
        with streams[0]:
            launch._run_dx_forward(backend, problem, dy, dx, weights, dx_plan)
        with streams[1]:
            launch._run_plane_backward(backend, problem, x, dy, dx, weights, grads, plan)
        for stream in streams:
            main.wait_event(stream.record())
    return step


def poisoned_like(a, storage):
    """An array like ``a`` filled with NaN (bfloat16: its raw bits, 0x7FC0)."""
    return cupy.full_like(a, 0x7FC0 if storage == "bfloat16" else float("nan"))


def bench_stage(stage, storage, backend, streams):
    problem, weights, sets = stage_inputs(stage, storage)
    outputs = {}
    row = dict(shape=list(stage[:4]), levels=stage[4], k=K, storage=storage)
    overlapped = two_streams(backend, problem, streams)
    for name in ("serial", "streams") * 2:  # two rounds, alternating
        dx = poisoned_like(sets[0][0], storage)
        grads = launch.Weights(*(poisoned_like(a, storage) for a in weights))

        def call(x, dy, name=name, dx=dx, grads=grads):
            if name == "serial":
                launch.run_backward(backend, problem, x, dy, dx, weights, grads)
            else:
                overlapped(x, dy, dx, weights, grads)
        ms = time_median(call, sets, CupyEventTimer(cupy), 30, 3).median_ms
        row.setdefault(name, []).append(ms)
        call(*sets[0])
        cupy.cuda.get_current_stream().synchronize()
        outputs.setdefault(name, (dx.copy(), [g.copy() for g in grads]))
    (dx_a, g_a), (dx_b, g_b) = outputs["serial"], outputs["streams"]
    row["same_bits"] = bool(cupy.array_equal(dx_a, dx_b)) and all(
        bool(cupy.array_equal(a, b)) for a, b in zip(g_a, g_b))
    return row


def main():
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    stage_cli(__doc__.splitlines()[0], STAGES,
              lambda stage, storage, backend: bench_stage(stage, storage, backend, streams),
              lambda row: "backward one stream " + " / ".join(f"{ms:.3f}" for ms in row["serial"])
              + " ms, two streams " + " / ".join(f"{ms:.3f}" for ms in row["streams"])
              + f" ms, same bits: {row['same_bits']}")


if __name__ == "__main__":
    main()
