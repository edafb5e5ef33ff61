"""Kernel time of a split forward, stage by stage, and of its coarse problem under other tunings.

A split forward (:func:`wtconv_cuda.kernels.launch.plan_split`) is three or
more launches: ``wtconv_coarse_in`` pools ``x`` into the LL band of level
``c``, the coarse problem (levels above ``c`` on that band, zero base
branch) runs on its own plan, then the tiles run ``c`` levels and add the
coarse output. This script times, with CUDA events (median of 30, three
rotating inputs), the whole ``run_forward``, each stage alone, and the
coarse problem under every ``--coarse-tunings`` entry (``Tuning`` fields as
``name=value`` pairs separated by commas; ``default`` is the planner's
choice), so that a change to one stage, or a better plan for the coarse
problem, shows against the whole. The coarse inputs are random float32
planes and parameters with a zero base weight, as the split passes them.
The whole forward is timed under each ``--whole-tunings`` entry; by default
the planner's choice and ``inner=false``, the split itself where the
planner runs the coarse levels in the tiles' blocks instead
(:func:`wtconv_cuda.kernels.launch.inner_tiles`). The stages are the
split's (``inner=false``).

    python benchmarks/split_stages.py
    python benchmarks/split_stages.py --configs 64x96x56x56:5 \\
        --coarse-tunings default threads=8 max_registers=96 split=1 registers=true
    python benchmarks/split_stages.py --configs 16x384x14x14:3 \\
        --split-tuning split=1,tile=16,threads=32,strip=2 \\
        --whole-tunings default split=1,tile=16,threads=32,strip=2
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import cupy

from wtconv_cuda.kernels.compiler import distinct, parse_compute_capability
from wtconv_cuda.kernels.launch import (
    CupyBackend, Problem, Tuning, Weights, _int64s, _launch_coarse_in, plan_split, planned_specs,
    run_forward,
)
from wtconv_cuda.kernels.warmup import compile_all

from tile_bench import random_inputs  # (benchmarks/ is the script's folder)
from tune import median_ms

CONFIGS = ["64x96x56x56:5", "64x192x28x28:4"]


def parse_config(text: str, k: int, storage: str) -> Problem:
    """``BxCxHxW:L`` -> a stride-1 :class:`Problem` with a bias."""
    dims, levels = text.split(":")
    b, c, h, w = (int(v) for v in dims.split("x"))
    return Problem(b, c, h, w, k, int(levels), 1, storage, True)


def parse_tuning(text: str) -> Tuning:
    """``default`` or ``name=value,...`` (ints, ``true``/``false``) -> :class:`Tuning`."""
    if text == "default":
        return Tuning()
    fields = {}
    for pair in text.split(","):
        name, value = pair.split("=")
        fields[name] = {"true": True, "false": False}.get(value.lower(), None)
        if fields[name] is None:
            fields[name] = int(value)
    return Tuning(**fields)


def coarse_weights(rng, channels: int, k: int, levels: int) -> Weights:
    """The coarse problem's float32 parameters as a split passes them: a zero base weight
    and scale (standing in for the bias too), random level taps and scales."""
    def normal(*shape):
        return cupy.asarray(rng.standard_normal(shape, dtype=np.float32))
    scale = cupy.zeros(channels, cupy.float32)
    return Weights(cupy.zeros((channels, k, k), cupy.float32), scale, scale,
                   normal(levels, channels, 4, k, k), normal(levels, channels, 4))


#: The split without the inner levels that replace it on planes one tile covers
#: (``--split-tuning`` adds fields, e.g. to split a problem the planner keeps whole).
SPLIT = Tuning(inner=False)


def precompile(backend, problem: Problem, whole_tunings: list, coarse_tunings: list) -> None:
    """Compile every variant the timings will launch, on all cores, before timing."""
    split = plan_split(problem, backend.shared_limit, SPLIT)
    if split is None:
        raise SystemExit(f"{problem} does not split")
    specs = [spec for text in whole_tunings for spec in planned_specs(
        problem, False, backend.shared_limit, backend.max_slots, parse_tuning(text))]
    for text in coarse_tunings:
        specs += planned_specs(split.coarse, False, backend.shared_limit, backend.max_slots,
                               parse_tuning(text))
    cc = parse_compute_capability(cupy.cuda.Device().compute_capability)
    compile_all(distinct(specs), cc, 16)


def stage_times(problem: Problem, whole_tunings: list, coarse_tunings: list, rng) -> dict:
    """Times of the whole forward, the split's stages and the coarse problem's tunings (ms)."""
    backend = CupyBackend()
    precompile(backend, problem, whole_tunings, coarse_tunings)
    split = plan_split(problem, backend.shared_limit, SPLIT)
    b, c, h, w = problem[:4]
    xs, weights = random_inputs(rng, problem)
    y = cupy.empty_like(xs[0])
    result = {"problem": list(problem), "split": split.split}
    result["whole"] = {}
    for text in whole_tunings:
        tuning = parse_tuning(text)
        specs = planned_specs(problem, False, backend.shared_limit, backend.max_slots, tuning)
        ms = median_ms(lambda i: run_forward(backend, problem, xs[i], y, weights, tuning))
        attrs = backend.kernel(specs[-1]).attributes
        result["whole"][text] = {"ms": ms, "specs": [repr(s) for s in specs],
                                 "last_regs": attrs["num_regs"],
                                 "last_local_bytes": attrs["local_size_bytes"]}
        print(f"  whole  {text:32s} {ms * 1e3:8.1f} us  {specs[-1]} ({attrs['num_regs']} "
              f"registers, {attrs['local_size_bytes']} B local)", flush=True)

    # the pre-pass alone: its work buffers allocated once, outside the timed calls
    pool = backend.float32(split.layout.pooled_floats)
    keep = backend.float32(split.layout.floats)
    result["coarse_in_ms"] = median_ms(
        lambda i: _launch_coarse_in(backend, split, (xs[i],), weights, pool, keep))

    q = split.coarse
    pooled = [cupy.asarray(rng.standard_normal((q.batch, q.channels, q.height, q.width),
                                               dtype=np.float32)) for _ in range(3)]
    out = cupy.empty_like(pooled[0])
    qweights = coarse_weights(rng, q.channels, q.kernel_size, q.levels)
    result["coarse"] = {}
    for text in coarse_tunings:
        tuning = parse_tuning(text)
        specs = planned_specs(q, False, backend.shared_limit, backend.max_slots, tuning)
        ms = median_ms(lambda i: run_forward(backend, q, pooled[i], out, qweights, tuning))
        result["coarse"][text] = {"ms": ms, "specs": [repr(s) for s in specs]}
        print(f"  coarse {text:32s} {ms * 1e3:8.1f} us  {specs[-1]}", flush=True)

    tiled = split.tiles
    scalars = _int64s(h, w, c, 1, tiled.tiles_x, tiled.ntiles)
    coarse_scalars = _int64s(q.height, q.width)
    kernel = backend.kernel(tiled.spec)
    result["tiles_ms"] = median_ms(lambda i: backend.call(
        kernel, tiled.grid, tiled.block,
        (xs[i], y, *weights, *scalars, pooled[i], *coarse_scalars), tiled.shared_bytes))
    attrs = kernel.attributes
    result["tiles_regs"] = attrs["num_regs"]
    result["tiles_local_bytes"] = attrs["local_size_bytes"]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=CONFIGS, metavar="BxCxHxW:L")
    parser.add_argument("--whole-tunings", nargs="+", default=["default", "inner=false"])
    parser.add_argument("--coarse-tunings", nargs="+", default=["default"])
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--storage", default="float32", choices=["float32", "float16"])
    parser.add_argument("--split-tuning", default="default",
                        help="Tuning fields of the split whose stages are timed")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    global SPLIT
    SPLIT = parse_tuning(args.split_tuning)._replace(inner=False)
    rng = np.random.default_rng(0)
    results = []
    for text in args.configs:
        problem = parse_config(text, args.k, args.storage)
        print(f"{text} K{args.k} {args.storage}", flush=True)
        r = stage_times(problem, args.whole_tunings, args.coarse_tunings, rng)
        default = r["coarse"].get("default", {}).get("ms", float("nan"))
        print(f"  split stages: coarse_in {r['coarse_in_ms'] * 1e3:.1f} + coarse "
              f"{default * 1e3:.1f} + tiles {r['tiles_ms'] * 1e3:.1f} us (tiles: "
              f"{r['tiles_regs']} registers, {r['tiles_local_bytes']} B local)", flush=True)
        results.append(r)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
