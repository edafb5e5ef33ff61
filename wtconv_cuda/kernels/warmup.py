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

from .codegen import STORAGE, FinalizeSpec
from .launch import FINALIZE_THREADS, Problem, Tuning, plan_plane

DEFAULT_SHARED_LIMIT = 227 * 1024 - 1024  # H100/H200 opt-in limit, less a margin
DEFAULT_SLOTS = 264


def variants(kernel_sizes, storages, strides, plane_sizes, levels=range(7),
             shared_limit=DEFAULT_SHARED_LIMIT, tunings=(Tuning(),)) -> list:
    """Every kernel spec the planner picks for these options (forward and backward)."""
    specs = []
    for k, storage, stride, (h, w), lv, tuning in itertools.product(
            kernel_sizes, storages, strides, plane_sizes, levels, tunings):
        problem = Problem(1, 1, h, w, k, lv, stride, storage, True)
        for backward in (False, True):
            specs.append(plan_plane(problem, backward, shared_limit, DEFAULT_SLOTS, tuning).spec)
    for k, storage in itertools.product(kernel_sizes, storages):
        specs.append(FinalizeSpec(k, storage, FINALIZE_THREADS))
    return list(dict.fromkeys(specs))


def _compile_one(job):
    from .compiler import cached_ptx
    spec, cc = job
    start = time.perf_counter()
    cached_ptx(spec, cc)
    return spec, time.perf_counter() - start


def compile_all(specs, cc, jobs: int) -> list:
    """Compile ``specs`` for ``cc`` with ``jobs`` processes; returns (spec, seconds) pairs."""
    work = [(spec, cc) for spec in specs]
    if jobs <= 1:
        return [_compile_one(job) for job in work]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_compile_one, work))


def kernel_report(specs, device_id: int = 0) -> list[dict]:
    """Load each spec on the GPU and read its resource usage."""
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
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel-sizes", type=int, nargs="+", default=[3, 5, 7])
    parser.add_argument("--storage", nargs="+", default=list(STORAGE), choices=STORAGE)
    parser.add_argument("--strides", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--planes", nargs="+", default=["56x56", "28x28", "14x14", "7x7"],
                        help="plane sizes HxW to plan for")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--cc", default=None, help="target as MAJOR.MINOR (default: the GPU's, else 9.0)")
    parser.add_argument("--report", default=None, help="write a JSON resource report (needs a GPU)")
    args = parser.parse_args(argv)

    if args.cc is not None:
        cc = tuple(int(v) for v in args.cc.split("."))
    else:
        try:
            import cupy
            cc_text = cupy.cuda.Device().compute_capability
            cc = (int(cc_text[:-1]), int(cc_text[-1]))
        except Exception:
            cc = (9, 0)
    planes = [tuple(int(v) for v in p.split("x")) for p in args.planes]
    specs = variants(args.kernel_sizes, args.storage, args.strides, planes)
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
