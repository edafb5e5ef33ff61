"""Kernel time of the tiled kernels against the plane kernel, paper grid.

For each configuration (B = 8, C, H = W, L, K = 5 by default) and storage,
times the forward of the plane kernel (``Tuning(tiles=False)``) and of each
tile variant asked for, with CUDA events (median of 30, three rotating input
sets), and reports the fraction of the copy roofline (``x`` read once, ``y``
written once, at the measured device-to-device copy bandwidth). Each variant's
registers and local memory come from its loaded kernel. Correctness is the
tests' job; this script only checks that the tiled output is finite and close
to the plane kernel's. ``--backward`` times the backward instead (``dx``
and every weight gradient, roofline ``x`` and ``dy`` read and ``dx``
written): the plane kernel, each variant asked for and the planner's choice
("auto"). ``--levels`` takes any level count, at the paper grid's sizes;
``--configs`` replaces the grid (``BxCxHxW:L``). ``--splits`` adds, for each
variant, passes split at those levels (coarse pre-pass, then the tiles; see
:func:`wtconv_cuda.kernels.launch.plan_split`), named ``VARIANT/sC``; "auto"
is the planner's own choice through ``run_forward`` / ``run_backward``, and
``--auto-splits`` adds the planner's own split at those levels (``auto/sC``,
``Tuning(split=C)``: the tiles it would pick for ``C`` levels); backward,
``--split-batches`` adds its split backward in batch chunks of those sizes
(``auto/bN``, ``Tuning(split_batch=N)``; ``N >= B`` runs the batch whole);
``--auto-caps`` adds the planner's own passes at another register cap (``auto/rN``,
``Tuning(max_registers=N)``: the tiles' and, where the planner picks it directly, the
plane kernel's, such as the weights-only backward's; the coarse problem and the
backward's ``dx`` forward keep their own). ``--no-plane``
skips the plane kernel (then the first run is the reference of the differences).

    python benchmarks/tile_bench.py --json tile_bench.json
    python benchmarks/tile_bench.py --variants 64:256:4:128 64:128:4:128:8 32:128:2:0
    python benchmarks/tile_bench.py --backward --levels 1 3 --variants 64:128:4:128
    python benchmarks/tile_bench.py --configs 64x96x56x56:5 --variants 32:128:4:128 --splits 2
    python benchmarks/tile_bench.py --backward --levels 3 --variants --auto-splits 2 --no-plane
    python benchmarks/tile_bench.py --backward --levels 5 --variants --split-batches 8 4 --no-plane
    python benchmarks/tile_bench.py --backward --k 9 --levels 3 --variants --auto-caps 168 --no-plane
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

import cupy

from wtconv_cuda._bench.core import CupyEventTimer, paper_grid, time_median
from wtconv_cuda.kernels.compiler import distinct, gpu_kernel, parse_compute_capability
from wtconv_cuda.kernels.launch import (
    CupyBackend, Problem, Tuning, Weights, plan_plane, plan_split, plan_tiles, planned_specs,
    run_forward,
)
from wtconv_cuda.kernels.warmup import compile_all

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
HOST_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def random_array(rng, shape, storage):
    """Random normal values in ``storage`` (bfloat16 as the top half of float32 bits)."""
    values = rng.standard_normal(shape, dtype=np.float32)
    if storage == "bfloat16":
        return cupy.asarray((values.view(np.uint32) >> 16).astype(np.uint16))
    return cupy.asarray(values.astype(HOST_DTYPE[storage]))


def random_inputs(rng, problem, rotations=3):
    """``rotations`` random inputs ``x`` and random kernel :class:`Weights` of ``problem``."""
    b, c, h, w, k, L, _, storage, _ = problem
    xs = [random_array(rng, (b, c, h, w), storage) for _ in range(rotations)]
    return xs, Weights(random_array(rng, (c, k, k), storage), random_array(rng, (c,), storage),
                       random_array(rng, (c,), storage),
                       random_array(rng, (L, c, 4, k, k), storage),
                       random_array(rng, (L, c, 4), storage))


def problems(configs, storages, k):
    """The stride-1, biased :class:`Problem` of every configuration and storage."""
    for cfg in configs:
        for storage in storages:
            yield Problem(cfg.batch, cfg.channels, cfg.height, cfg.width, k, cfg.levels, 1,
                          storage, True)


def kernel_report(specs, backend):
    """Compile ``specs`` on 16 processes, load them and print their registers and local memory.

    Returns ``{repr(spec): {"regs", "local_bytes"}}``. Repeats are dropped by type and
    value (:func:`wtconv_cuda.kernels.compiler.distinct`).
    """
    specs = distinct(specs)
    cc = parse_compute_capability(cupy.cuda.Device().compute_capability)
    compile_all(sorted(specs, key=repr), cc, 16)
    kernels = {}
    for spec in specs:
        attrs = gpu_kernel(spec, backend.device_id).attributes
        kernels[repr(spec)] = {"regs": attrs["num_regs"], "local_bytes": attrs["local_size_bytes"]}
        print(f"{spec}: {kernels[repr(spec)]}", flush=True)
    return kernels


def copy_bandwidth(nbytes=1 << 30, repeats=20):
    """Device-to-device copy bandwidth, bytes/s, read plus write counted."""
    src = cupy.random.random(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    timing = time_median(lambda: cupy.copyto(dst, src), [()], CupyEventTimer(cupy), repeats, 3)
    return 2 * src.nbytes / (timing.median_ms * 1e-3)


def grid_configs(levels=None, configs=None):
    """The paper grid's configurations, or its sizes at each of ``levels`` (any ``L``), or
    ``configs`` (``BxCxHxW:L`` strings) instead."""
    if configs:
        parsed = []
        for text in configs:
            dims, lv = text.split(":")
            b, c, h, w = (int(v) for v in dims.split("x"))
            parsed.append(paper_grid()[0]._replace(batch=b, channels=c, height=h, width=w,
                                                   levels=int(lv), grid="custom"))
        return parsed
    if levels is None:
        return paper_grid()
    sizes = dict.fromkeys(c._replace(levels=0) for c in paper_grid())
    return [size._replace(levels=lv) for size in sizes for lv in levels]


def parse_variant(text):
    """``TS:THREADS:STRIP:REGS[:ASTRIP[:PLANES]]`` -> (Tuning with tiles forced on, analysis
    strip). ``ASTRIP`` 0 keeps the default; ``PLANES``: ``Tuning.tile_planes`` (planes of
    one channel a block, for tiles over their whole plane).

    ``ASTRIP`` reaches the unsplit variants only: the split ones (``--splits``) run
    through ``run_forward``, whose tiles keep the default analysis strip (``PLANES``
    reaches both)."""
    values = [int(v) for v in text.split(":")]
    ts, threads, strip, regs = values[:4]
    astrip = values[4] if len(values) > 4 else None
    planes = values[5] if len(values) > 5 else None
    return Tuning(threads=threads, strip=strip, max_registers=regs, tiles=True, tile=ts,
                  tile_planes=planes), astrip


def tile_plan(problem, backend, variant):
    """The tile launch of ``variant`` (Tuning, analysis strip) or None."""
    tuning, astrip = variant
    plan = plan_tiles(problem, backend.shared_limit, tuning)
    if plan is not None and astrip:
        plan = plan._replace(spec=plan.spec._replace(analysis_strip=astrip))
    return plan


def launch_tiles(backend, plan, problem, x, y, weights):
    """One tiled forward, launched as ``run_forward`` would (any spec)."""
    scalars = (problem.height, problem.width, problem.channels, int(problem.has_bias),
               plan.tiles_x, plan.ntiles)
    backend.call(backend.kernel(plan.spec), plan.grid, plan.block,
                 (x, y, *weights, *(np.int64(v) for v in scalars)), plan.shared_bytes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--storage", nargs="+", default=["float32"])
    parser.add_argument("--variants", nargs="*", default=["64:128:4:128"],
                        metavar="TS:THREADS:STRIP:REGS[:ASTRIP[:PLANES]]")
    parser.add_argument("--levels", type=int, nargs="+", default=None)
    parser.add_argument("--configs", nargs="+", default=None, metavar="BxCxHxW:L",
                        help="configurations instead of the paper grid")
    parser.add_argument("--splits", type=int, nargs="+", default=[],
                        help="also each variant split at these levels")
    parser.add_argument("--auto-splits", type=int, nargs="+", default=[],
                        help="also the planner's own tiles split at these levels")
    parser.add_argument("--split-batches", type=int, nargs="+", default=[],
                        help="--backward: also the planner's split backward in batch chunks "
                             "of these sizes (auto/bN; N >= B: the batch whole)")
    parser.add_argument("--auto-caps", type=int, nargs="+", default=[],
                        help="also the planner's own passes at these .maxnreg values "
                             "(auto/rN: Tuning(max_registers=N))")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--no-plane", action="store_true", help="skip the plane kernel")
    parser.add_argument("--backward", action="store_true",
                        help="time the backward (dx and every weight gradient) instead: the "
                             "plane kernel against the tiles (not the planner's default yet)")
    args = parser.parse_args()

    backend = CupyBackend()
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    if args.backward:
        return backward_main(args, backend, bandwidth)
    variants = {v: parse_variant(v) for v in args.variants}
    # whole runs through run_forward: split variants and the planner's choice
    whole = {f"{v}/s{c}": tuning._replace(split=c)
             for v, (tuning, _) in variants.items() for c in args.splits}
    whole.update({f"auto/s{c}": Tuning(split=c) for c in args.auto_splits})
    whole.update({f"auto/r{n}": Tuning(max_registers=n) for n in args.auto_caps})
    whole["auto"] = Tuning()
    configs = grid_configs(args.levels, args.configs)

    specs = []
    for problem in problems(configs, args.storage, args.k):
        if not args.no_plane:
            specs.append(plan_plane(problem, False, backend.shared_limit, backend.max_slots,
                                 Tuning(tiles=False)).spec)
        for variant in variants.values():
            plan = tile_plan(problem, backend, variant)
            if plan is not None:
                specs.append(plan.spec)
        for tuning in whole.values():
            if tuning.split is None or plan_split(problem, backend.shared_limit, tuning):
                specs.extend(planned_specs(problem, False, backend.shared_limit,
                                           backend.max_slots, tuning))
    kernels = kernel_report(specs, backend)

    rng = np.random.default_rng(0)
    rows = []
    for problem in problems(configs, args.storage, args.k):
        b, c, h, w, k, L, _, storage, _ = problem
        xs, weights = random_inputs(rng, problem)
        y = cupy.empty_like(xs[0])
        nbytes = 2 * xs[0].size * ITEMSIZE[storage]
        row = {"config": f"{b}x{c}x{h}x{w} L{L} K{k}", "storage": storage, "ms": {},
               "roofline": {}}
        runs = [] if args.no_plane else [("plane", Tuning(tiles=False))]
        runs += [(name, plan) for name, plan in
                 ((n, tile_plan(problem, backend, v)) for n, v in variants.items())
                 if plan is not None]
        runs += [(name, tuning) for name, tuning in whole.items()
                 if tuning.split is None or plan_split(problem, backend.shared_limit, tuning)]
        reference = None
        for name, plan in runs:
            def forward(i, plan=plan):
                if isinstance(plan, Tuning):
                    run_forward(backend, problem, xs[i], y, weights, plan)
                else:
                    launch_tiles(backend, plan, problem, xs[i], y, weights)
            ms = time_median(forward, [(i,) for i in range(3)], CupyEventTimer(cupy), 30,
                             3).median_ms
            row["ms"][name] = round(ms, 4)
            row["roofline"][name] = round(nbytes / bandwidth / (ms * 1e-3), 4)
            forward(0)
            out = as_float32(y, storage)
            if reference is None:
                reference = out.copy()
            else:
                diff = float(cupy.linalg.norm(out - reference) / cupy.linalg.norm(reference))
                row.setdefault("diff_vs_first", {})[name] = diff
                row.setdefault("bitwise_equal_first", {})[name] = bool(
                    cupy.array_equal(out, reference))
        row["auto_plan"] = [repr(spec) for spec in planned_specs(
            problem, False, backend.shared_limit, backend.max_slots)]
        rows.append(row)
        cells = "  ".join(f"{n} {row['ms'][n]:.3f} ms ({100 * row['roofline'][n]:.1f}%)"
                          for n in row["ms"])
        same = row.get("bitwise_equal_first", {})
        print(f"{row['config']:24s} {storage:8s} {cells}  bitwise equal to the first: "
              f"{sum(same.values())}/{len(same)}", flush=True)
        del xs, y, weights
        cupy.get_default_memory_pool().free_all_blocks()

    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"bandwidth": bandwidth, "kernels": kernels, "rows": rows}, handle,
                      indent=1)
    return 0


def as_float32(v, storage):
    """A float32 copy of a device array of ``storage`` (bfloat16: raw ``uint16`` bits)."""
    if storage == "bfloat16":
        return (v.astype(cupy.uint32) << 16).view(cupy.float32)
    return v.astype(cupy.float32)


def relative(a, b, storage):
    """Relative Frobenius difference of two device arrays of ``storage``."""
    a, b = as_float32(a, storage), as_float32(b, storage)
    return float(cupy.linalg.norm(a - b) / cupy.linalg.norm(b))


def backward_main(args, backend, bandwidth):
    """``--backward``: plane-kernel backward against tiled backwards and the planner's
    choice (``run_backward``)."""
    from wtconv_cuda.kernels.codegen import FinalizeSpec
    from wtconv_cuda.kernels.launch import FINALIZE_THREADS, run_backward
    variants = {v: parse_variant(v)[0] for v in args.variants}
    variants.update({f"{v}/s{c}": parse_variant(v)[0]._replace(split=c)
                     for v in args.variants for c in args.splits})
    variants.update({f"auto/s{c}": Tuning(split=c) for c in args.auto_splits})
    variants.update({f"auto/b{n}": Tuning(split_batch=n) for n in args.split_batches})
    variants.update({f"auto/r{n}": Tuning(max_registers=n) for n in args.auto_caps})
    variants["auto"] = Tuning()
    configs = grid_configs(args.levels, args.configs)

    def runs_here(problem, tuning):
        if tuning.split is not None or tuning.split_batch is not None:
            return plan_split(problem, backend.shared_limit, tuning, True) is not None
        return tuning.tiles is None or plan_tiles(problem, backend.shared_limit, tuning,
                                                  backward=True) is not None

    specs = []
    for problem in problems(configs, args.storage, args.k):
        if not args.no_plane:
            specs.append(plan_plane(problem, True, backend.shared_limit, backend.max_slots,
                                 Tuning(tiles=False)).spec)
        specs.append(FinalizeSpec(args.k, problem.storage, FINALIZE_THREADS))
        for tuning in variants.values():
            if runs_here(problem, tuning):
                specs.extend(planned_specs(problem, True, backend.shared_limit,
                                           backend.max_slots, tuning))
    kernels = kernel_report(specs, backend)
    rng = np.random.default_rng(1)
    rows = []
    for problem in problems(configs, args.storage, args.k):
        b, c, h, w, k, L, _, storage, _ = problem
        xs, weights = random_inputs(rng, problem)
        dys = [random_array(rng, (b, c, h, w), storage) for _ in range(3)]
        dx = cupy.empty_like(xs[0])
        grads = Weights(*(cupy.empty_like(a) for a in weights))
        nbytes = 3 * xs[0].size * ITEMSIZE[storage]
        row = {"config": f"{b}x{c}x{h}x{w} L{L} K{k}", "storage": storage, "ms": {},
               "roofline": {}, "diff_vs_first": {}}
        runs = [] if args.no_plane else [("plane", Tuning(tiles=False))]
        runs += [(name, t) for name, t in variants.items() if runs_here(problem, t)]
        reference = None
        for name, tuning in runs:
            def backward(i, tuning=tuning):
                run_backward(backend, problem, xs[i], dys[i], dx, weights, grads, tuning)
            ms = time_median(backward, [(i,) for i in range(3)], CupyEventTimer(cupy), 30,
                             3).median_ms
            row["ms"][name] = round(ms, 4)
            row["roofline"][name] = round(nbytes / bandwidth / (ms * 1e-3), 4)
            backward(0)
            outputs = [dx.copy()] + [g.copy() for g in grads]
            if reference is None:
                reference = outputs
            else:
                names = ("dx",) + Weights._fields
                row["diff_vs_first"][name] = {
                    n: relative(a, r, storage) for n, a, r in zip(names, outputs, reference)}
        rows.append(row)
        cells = "  ".join(f"{n} {row['ms'][n]:.3f} ms ({100 * row['roofline'][n]:.1f}%)"
                          for n in row["ms"])
        row["first"] = runs[0][0]
        worst = {n: max(d.values()) for n, d in row["diff_vs_first"].items()}
        print(f"{row['config']:24s} {storage:8s} {cells}  worst relative diff vs "
              f"{runs[0][0]}: "
              f"{worst}", flush=True)
        del xs, dys, dx, grads, weights
        cupy.get_default_memory_pool().free_all_blocks()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"bandwidth": bandwidth, "kernels": kernels, "rows": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
