"""Where the plane backward's time goes: the kernel timed with phases cut out.

Each variant generates the plane kernel's source as usual and then deletes
one or more of its phases (so its gradients are wrong: this measures, it
does not compute), compiles it under its own cache key and times the
backward with CUDA events (median of 30, three rotating input sets). The
difference between two variants is the time of the phases one of them lacks,
with the rest of the kernel around them (occupancy, barriers) unchanged.

    python benchmarks/backward_breakdown.py --json out.json

Variants (cumulative cuts):

``full``
    the kernel as shipped;
``no level taps``
    without the level-tap correlations and their reductions;
``dx only``
    without any weight-gradient phase (``dx`` alone: the forward pipeline
    on ``dy``).

Caveat: ptxas allocates the cut kernels' registers differently; at 14 x 14
the cut variants spilled 264-312 B per thread where the full kernel spilled
32 B (``kernels/ptxas.py``), so a difference bounds a phase's cost rather
than measuring it exactly.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

import cupy

import wtconv_cuda as wt
from wtconv_cuda.kernels import codegen, compiler, launch

from kernel_bench import cuda_time, device_weights  # a sibling script: benchmarks/ is on sys.path

# K = 5. (The 14 x 14 stage, 64 x 384 L 3, runs no plane kernel by default since c99cd67:
# its backward is the lane kernels'.)
CONFIGS = [(64, 96, 56, 56, 5), (64, 192, 28, 28, 4)]

#: Comment lines that open a phase of the generated backward, by phase name.
MARKERS = {"level taps": "# level taps: item"}


def cut_block(source: str, marker: str) -> str:
    """Delete the statement that follows the comment block containing ``marker``.

    The comment lines at the marker's indentation, the next statement at that
    indentation and every deeper-indented line after it go.
    """
    lines = source.split("\n")
    start = next(i for i, line in enumerate(lines) if marker in line)
    depth = len(lines[start]) - len(lines[start].lstrip())
    while start > 0 and lines[start - 1].strip().startswith("#") and (
            len(lines[start - 1]) - len(lines[start - 1].lstrip()) == depth):
        start -= 1
    end = start
    while lines[end].strip().startswith("#"):
        end += 1
    end += 1  # the statement itself
    while end < len(lines) and (not lines[end].strip() or
                                len(lines[end]) - len(lines[end].lstrip()) > depth):
        end += 1
    return "\n".join(lines[:start] + lines[end:])


VARIANTS = {
    "full": (),
    "no level taps": ("level taps",),
    "dx only": None,  # the whole weight-gradient phase
}


def patched_source(original, cuts):
    def source(spec):
        if cuts is None and spec.backward:
            saved = codegen._emit_weight_gradients
            codegen._emit_weight_gradients = lambda e, s: None
            try:
                return original(spec)
            finally:
                codegen._emit_weight_gradients = saved
        text = original(spec)
        if spec.backward:
            for name in cuts:
                text = cut_block(text, MARKERS[name])
        return text
    return source


def problem_of(cfg) -> launch.Problem:
    b, c, h, w, levels = cfg
    return launch.Problem(b, c, h, w, 5, levels, 1, "float32", True)


def _compile_variant(job) -> None:
    """Worker: compile one variant's plane-kernel specs into the shared cache."""
    name, specs, cc = job
    original = codegen.plane_kernel_source
    codegen.plane_kernel_source = patched_source(original, VARIANTS[name])
    try:
        for spec in specs:
            compiler.cached_ptx(spec, cc)
    finally:
        codegen.plane_kernel_source = original


def compile_variants(names, jobs: int) -> None:
    """Compile every variant of every configuration's planned specs, in parallel."""
    backend = launch.CupyBackend()
    cc = compiler.parse_compute_capability(cupy.cuda.Device().compute_capability)
    work = [(name, launch.planned_specs(problem_of(cfg), True, backend.shared_limit,
                                        backend.max_slots), cc)
            for cfg in CONFIGS for name in names]
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile_variant, work))


def time_backward(cfg, rng):
    """Median ms of the backward at ``cfg``, on inputs and weights made as
    ``kernel_bench.py`` makes them."""
    b, c, h, w, levels = cfg
    weights = device_weights(c, 5, levels, np.float32, rng)
    xs = [cupy.asarray(rng.standard_normal((b, c, h, w)).astype(np.float32)) for _ in range(3)]
    dys = [cupy.asarray(rng.standard_normal((b, c, h, w)).astype(np.float32)) for _ in range(3)]
    saved = [wt.Saved(x, weights, levels, 1) for x in xs]
    return cuda_time(lambda s, dy: wt.backward(s, dy), list(zip(saved, dys)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                        help="processes compiling the variants ahead")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()
    compile_variants(args.variants, args.jobs)
    original = codegen.plane_kernel_source
    rows = []
    for cfg in CONFIGS:
        for name in args.variants:
            codegen.plane_kernel_source = patched_source(original, VARIANTS[name])
            compiler._loaded.clear()
            try:
                ms = time_backward(cfg, np.random.default_rng(0))
            finally:
                codegen.plane_kernel_source = original
            rows.append(dict(shape=list(cfg[:4]), levels=cfg[4], variant=name, backward_ms=ms))
            print(f"{str(cfg):24s} {name:16s} {ms:.3f} ms", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
