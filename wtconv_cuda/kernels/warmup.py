"""Compile kernel variants ahead of use, in parallel, into the on-disk cache.

Usage::

    python -m wtconv_cuda.kernels.warmup --kernel-sizes 3 5 7 --strides 1 2 --jobs 8
    python -m wtconv_cuda.kernels.warmup --report kernels.json   # on a GPU: load and
                                                                  # record registers and
                                                                  # local memory

Without a GPU, ``--cc`` picks the target architecture (default 9.0, Hopper).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from .codegen import STORAGE, FinalizeSpec, PlaneSpec
from .compiler import distinct
from .flip import FlipSpec
from .launch import (
    FINALIZE_THREADS, SPLIT_MIN_PIXELS, SPLIT_SMALL_TILES, Problem, Tuning, plan_plane,
    plan_registers, plan_split, plan_tiles, planned_specs,
)
from .registers import RegisterSpec

DEFAULT_SHARED_LIMIT = 227 * 1024 - 1024  # H100/H200 opt-in limit, less a margin
DEFAULT_SLOTS = 264
#: Problem sizes, in pixels, from which the planner's size rules change their choice
#: (one problem of each size covers them all).
LARGE_PIXELS = tuple(sorted({SPLIT_MIN_PIXELS}
                            | {n for rule in SPLIT_SMALL_TILES.values()
                               for n in (rule.min_pixels, rule.inner_max_pixels) if n}))


def variants(kernel_sizes, storages, strides, plane_sizes, levels=range(7),
             shared_limit=DEFAULT_SHARED_LIMIT, tunings=(Tuning(),)) -> list:
    """Every kernel spec the planner picks for these options (forward and backward).

    The planner's choice depends on the batch size and channel count only
    through whether a backward block writes the gradients itself
    (``PlaneSpec.fused_finalize``), how large a problem is
    (:data:`~wtconv_cuda.kernels.launch.SPLIT_MIN_PIXELS`, and the size rules
    of some tile sizes: :data:`LARGE_PIXELS` lists them) and whether ``B`` is
    a multiple of a block's planes (whole-plane tiles with several planes a
    block, ``TileSpec.planes``, and the lane kernels). So a single-plane
    problem and one of each size in :data:`LARGE_PIXELS` per combination of
    the options, its batch also rounded up to a multiple of 16, plus the other
    finalize choice of each backward spec, cover them all. Where the planner
    runs a pass on tiles
    (:func:`~wtconv_cuda.kernels.launch.plan_tiles`), the tile spec is listed
    before the plane specs, which stay in the list (``Tuning(tiles=False)``
    runs them); where it splits a pass
    (:func:`~wtconv_cuda.kernels.launch.plan_split`), the pre-pass, the
    coarse problem's specs and the tiles.

    Parameters
    ----------
    kernel_sizes : iterable of int
        Odd kernel sizes ``K``.
    storages : iterable of str
        Storage names, from `wtconv_cuda.kernels.codegen.STORAGE`.
    strides : iterable of int
        Layer strides.
    plane_sizes : iterable of (int, int)
        Plane sizes ``(H, W)``.
    levels : iterable of int, optional
        Wavelet levels (default 0 to 6).
    shared_limit : int, optional
        Dynamic shared memory per block to plan with, in bytes.
    tunings : iterable of Tuning, optional
        Launch-shape overrides to plan with (default: only the defaults).

    Returns
    -------
    list of CoarseSpec, TileSpec, PlaneSpec, FinalizeSpec, CoarseOutSpec and FlipSpec
        Without duplicates, in first-planned order: the tile and plane specs,
        then one finalize and one flip spec per kernel size and storage.
    """
    specs = []
    for k, storage, stride, (h, w), lv, tuning in itertools.product(
            kernel_sizes, storages, strides, plane_sizes, levels, tunings):
        problem = Problem(1, 1, h, w, k, lv, stride, storage, True)
        # problems as large as each of the planner's size rules asks, with B as it falls
        # and rounded up to a multiple of 16: whole-plane tiles (TileSpec.planes) and the
        # lane kernels take several planes a block where B is a multiple of them
        batches = [-(-n // (h * w)) for n in LARGE_PIXELS]
        larges = [problem._replace(batch=b)
                  for b in dict.fromkeys(v for b in batches for v in (b, -(-b // 16) * 16))]
        # tiny planes: the register kernel (its backward needs B a multiple of 32; B is
        # a run-time value, and B up to 128 shares one variant)
        for registers in (plan_registers(problem, shared_limit, tuning),
                          plan_registers(problem._replace(batch=32), shared_limit, tuning, True)):
            if registers is not None:
                specs.append(registers.spec)
        for backward in (False, True):
            for p in (problem, *larges):  # (one tile per plane with inner levels: large only)
                tiled = plan_tiles(p, shared_limit, tuning, backward)
                if tiled is not None:  # large planes: the tiles (the plane kernel stays warm)
                    specs.append(tiled.spec)
            for p in (problem, *larges):
                if plan_split(p, shared_limit, tuning, backward) is None:
                    continue
                # deep levels: coarse pre-pass, the coarse problem, tiles, coarse_out
                for spec in planned_specs(p, backward, shared_limit, DEFAULT_SLOTS, tuning):
                    specs.append(spec)
                    if isinstance(spec, PlaneSpec) and backward:
                        specs.append(spec._replace(fused_finalize=not spec.fused_finalize))
        for backward in (False, True):
            spec = plan_plane(problem, backward, shared_limit, DEFAULT_SLOTS, tuning).spec
            specs.append(spec)
            if backward:  # whether the finalize fuses depends on B: warm both variants
                specs.append(spec._replace(fused_finalize=not spec.fused_finalize))
        for large in larges:
            if not plan_plane(large, True, shared_limit, DEFAULT_SLOTS, tuning).spec.weights_only:
                continue
            # large problems' dx from the forward kernels: wtconv_flip, the forward's
            # specs, the weights-only plane kernel (both finalize choices)
            for spec in planned_specs(large, True, shared_limit, DEFAULT_SLOTS, tuning):
                specs.append(spec)
                if isinstance(spec, PlaneSpec) and spec.backward:
                    specs.append(spec._replace(fused_finalize=not spec.fused_finalize))
    for k, storage in itertools.product(kernel_sizes, storages):
        specs.append(FinalizeSpec(k, storage, FINALIZE_THREADS))
        specs.append(FlipSpec(storage, k))  # a stride-1 backward's dx (forced small)
    return distinct(specs)


def _compile_one(job):
    from .compiler import cached_ptx
    spec, cc = job
    start = time.perf_counter()
    cached_ptx(spec, cc)
    return spec, time.perf_counter() - start


def compile_all(specs, cc, jobs: int) -> list:
    """Compile ``specs`` for ``cc`` with ``jobs`` processes; returns (spec, seconds) pairs.

    Each spec goes through :func:`wtconv_cuda.kernels.compiler.cached_ptx`, so
    variants already in the cache only cost a look-up.

    Parameters
    ----------
    specs : iterable of PlaneSpec or FinalizeSpec
        Variants to compile.
    cc : tuple of int
        Target ``(major, minor)``.
    jobs : int
        Worker processes; 1 or less compiles in this process.

    Returns
    -------
    list of (spec, float)
        Each spec with its wall-clock seconds (compile, or cache look-up), in
        the order of ``specs``.

    Raises
    ------
    wtconv_cuda.kernels.compiler.CompileError
        A variant could not be compiled.
    """
    work = [(spec, cc) for spec in specs]
    if jobs <= 1:
        return [_compile_one(job) for job in work]
    # The register kernels (straight-line code for a whole plane) take numba the
    # longest: start them first.
    order = sorted(range(len(work)), key=lambda i: not isinstance(work[i][0], RegisterSpec))
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        done = dict(zip(order, pool.map(_compile_one, [work[i] for i in order])))
    return [done[i] for i in range(len(work))]


def run_compile_subprocess(cmd, timeout: float, env=None) -> str:
    """Run a compile command (e.g. this module's CLI) in a fresh interpreter.

    A separate process never shares the caller's CUDA state. Failure or a
    timeout is reported, not raised: the kernels then compile on first use.

    Parameters
    ----------
    cmd : list of str
        The command line.
    timeout : float
        Seconds before giving up.
    env : dict, optional
        Environment of the subprocess (default: inherited).

    Returns
    -------
    str
        One line saying what happened: the command's last output line on
        success.
    """
    import subprocess

    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return f"kernel precompilation timed out after {timeout:.0f} s (compiling on first use)"
    lines = (done.stdout + done.stderr).strip().splitlines()
    last = lines[-1] if lines else ""
    if done.returncode != 0:
        return f"kernel precompilation failed (exit {done.returncode}): {last[:300]}"
    return last


def kernel_report(specs, device_id: int = 0) -> list[dict]:
    """Load each spec on the GPU and read its resource usage.

    Parameters
    ----------
    specs : iterable of PlaneSpec or FinalizeSpec
        Variants to load (compiled first if not cached).
    device_id : int, optional
        CUDA device ordinal.

    Returns
    -------
    list of dict
        One row per spec: ``spec`` (its fields as a dict), ``kind`` (the spec
        class name), ``registers`` (per thread), ``local_bytes`` (local memory
        per thread; non-zero means spills) and ``static_shared_bytes``.

    Raises
    ------
    wtconv_cuda.kernels.compiler.CompileError
        A variant could not be compiled or loaded.
    """
    from .compiler import gpu_kernel
    rows = []
    for spec in specs:
        attrs = gpu_kernel(spec, device_id).attributes
        rows.append(dict(spec=spec._asdict(), kind=type(spec).__name__,
                         registers=attrs["num_regs"],
                         local_bytes=attrs["local_size_bytes"],
                         static_shared_bytes=attrs["shared_size_bytes"]))
    return rows


def main(argv=None) -> int:
    """Command-line entry point (``python -m wtconv_cuda.kernels.warmup``).

    Plans the variants for the options given (see the module docstring and
    ``--help``), compiles them into the cache and prints a summary; with
    ``--report``, also loads them on the GPU and writes the resource report
    of :func:`kernel_report` as JSON.

    Parameters
    ----------
    argv : list of str, optional
        Arguments; default ``sys.argv[1:]``.

    Returns
    -------
    int
        Exit status: 0 (errors propagate as exceptions).
    """
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel-sizes", type=int, nargs="+", default=[3, 5, 7])
    parser.add_argument("--storage", nargs="+", default=list(STORAGE), choices=STORAGE)
    parser.add_argument("--strides", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--planes", nargs="+", default=["56x56", "28x28", "14x14", "7x7"],
                        help="plane sizes HxW to plan for")
    parser.add_argument("--levels", type=int, nargs="+", default=list(range(7)),
                        help="wavelet levels to plan for (default 0 to 6)")
    parser.add_argument("--configs", nargs="+", default=[],
                        help="plane sizes with their levels, HxW:L (instead of every "
                             "combination of --planes and --levels)")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--cc", default=None, help="target as MAJOR.MINOR (default: the GPU's, else 9.0)")
    parser.add_argument("--report", default=None, help="write a JSON resource report (needs a GPU)")
    parser.add_argument("--threads", type=int, nargs="+", default=[],
                        help="also plan with these threads per plane (besides the default)")
    parser.add_argument("--strips", type=int, nargs="+", default=[0],
                        help="with --threads: coefficient rows per thread (0 = the default)")
    args = parser.parse_args(argv)

    if args.cc is not None:
        cc = tuple(int(v) for v in args.cc.split("."))
    else:
        try:
            import cupy

            from .compiler import parse_compute_capability
            cc = parse_compute_capability(cupy.cuda.Device().compute_capability)
        except Exception:
            cc = (9, 0)
    planes = [tuple(int(v) for v in p.split("x")) for p in args.planes]
    tunings = [Tuning()] + [Tuning(threads=t, strip=q or None)
                            for t in args.threads for q in args.strips]
    if args.configs:
        pairs = [(tuple(int(v) for v in c.split(":")[0].split("x")), int(c.split(":")[1]))
                 for c in args.configs]
        specs = distinct(
            spec for plane, lv in pairs
            for spec in variants(args.kernel_sizes, args.storage, args.strides, [plane], [lv],
                                 tunings=tunings))
    else:
        specs = variants(args.kernel_sizes, args.storage, args.strides, planes, args.levels,
                         tunings=tunings)
    start = time.perf_counter()
    timings = compile_all(specs, cc, args.jobs)
    slowest = max(t for _, t in timings)
    print(f"compiled {len(specs)} variants for sm_{cc[0]}{cc[1]} in "
          f"{time.perf_counter() - start:.1f} s (slowest {slowest:.1f} s)")
    if args.report:
        rows = kernel_report(specs)
        with open(args.report, "w") as handle:
            json.dump(rows, handle, indent=1)
        spills = [r for r in rows if r["local_bytes"]]
        print(f"loaded {len(rows)} kernels; {len(spills)} use local memory")
        for r in spills:
            print("  local memory:", r["local_bytes"], "B", r["spec"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
