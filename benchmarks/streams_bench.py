"""The backward's recorded programs on one stream and on two, with dx in one, two or four chunks.

Where ``dx`` comes from the forward kernels, the recorded backward program
runs the ``dx`` part on a side stream beside the weight gradients when both
parts' work buffers fit in ``launch.SIDE_BY_SIDE_BUFFER_FRACTION`` of ``x``'s
bytes together (``launch.runs_side_by_side``). At 28 x 28 they do not, unless
the ``dx`` forward runs in more batch chunks (each chunk's split buffers are
smaller): two in fp32, four in 16 bits. For each ConvNeXt-T stage (56, 28, 14)
this times the program of

- ``default``: the planner's backward;
- ``whole``, ``halves``, ``quarters``: ``Tuning(dx_forward=True, dx_batch=B // n)``,
  ``dx`` in one, two or four chunks (forking where those fit);

each run with its side stream (``two``, where the program forks) and without
it (``one``: the same launches on the caller's stream), medians of 30 calls
(CUDA events around each, three rotating input sets), and checks that every
variant gives ``default``'s bits.

    python benchmarks/streams_bench.py --storage float32 bfloat16 --json streams.json

Its kernels are the user benchmark's (``scripts/build_ptx_cache.sh bench``):
the specs do not depend on the chunks' batch size.
"""

from __future__ import annotations

import cupy

from wtconv_cuda import gpu
from wtconv_cuda._bench.core import CupyEventTimer, time_median
from wtconv_cuda.kernels import launch
from wtconv_cuda.kernels.driver import side_stream
from wtconv_cuda.kernels.program import record

from dx_forward_bench import K, STAGES, stage_cli, stage_inputs


def tunings(stage):
    """The variants' names and launch-shape overrides."""
    return (("default", launch.Tuning()),
            *((name, launch.Tuning(dx_forward=True, dx_batch=stage[0] // n))
              for name, n in (("whole", 1), ("halves", 2), ("quarters", 4))))


def program_of(backend, problem, tuning):
    """The recorded backward of ``problem`` with ``tuning`` (as ``gpu._program`` records)."""
    return record(problem, True, backend.shared_limit, backend.max_slots,
                  lambda spec: backend.driver_handle(backend.kernel(spec)),
                  lambda values: backend.table(values).data.ptr, tuning)


def poisoned_like(a, storage):
    """An array like ``a`` filled with NaN (bfloat16: its raw bits, 0x7FC0)."""
    return cupy.full_like(a, 0x7FC0 if storage == "bfloat16" else float("nan"))


def bench_stage(stage, storage, backend):
    problem, weights, sets = stage_inputs(stage, storage)
    row = dict(shape=list(stage[:4]), levels=stage[4], k=K, storage=storage)
    side = side_stream(cupy.cuda.Device().id)
    reference = None
    for name, tuning in tunings(stage):
        program = program_of(backend, problem, tuning)
        row[f"{name} forks"] = program.forks
        for streams in ("one", "two") if program.forks else ("one",):
            dx = poisoned_like(sets[0][0], storage)
            grads = [poisoned_like(a, storage) for a in weights]

            def call(x, dy, program=program, dx=dx, grads=grads,
                     side=side if streams == "two" else None):
                program.run([a.data.ptr for a in (x, dy, dx, *weights, *grads)], gpu._allocate,
                            cupy.cuda.get_current_stream().ptr, side)
            key = f"{name} {streams}"
            row[key] = time_median(call, sets, CupyEventTimer(cupy), 30, 3).median_ms
            call(*sets[0])
            cupy.cuda.get_current_stream().synchronize()
            outputs = [dx.copy()] + [g.copy() for g in grads]
            if reference is None:
                reference = outputs
            row[f"{key} same bits"] = all(bool(cupy.array_equal(a, b))
                                          for a, b in zip(outputs, reference))
    return row


def describe(row):
    times = [f"{key} {row[key]:.3f} ms{'' if row[key + ' same bits'] else ' (other bits)'}"
             for key in (f"{name} {streams}" for name in ("default", "whole", "halves", "quarters")
                         for streams in ("one", "two")) if key in row]
    return ", ".join(times)


def main():
    stage_cli(__doc__.splitlines()[0], STAGES, bench_stage, describe)


if __name__ == "__main__":
    main()
