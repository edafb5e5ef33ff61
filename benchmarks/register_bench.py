"""Kernel time of the register kernel (one thread per tiny plane) against the plane kernel.

For each configuration (``BxCxHxW:L``, K = 5, stride 1; default the ConvNeXt-T
7 x 7 stage) and storage, times the forward of the plane kernel
(``Tuning(registers=False)``), of the planner's choice ("auto") and of each
register-kernel variant asked for (``THREADS:CAP``: threads per block and
``.maxnreg``), with CUDA events (median of 30, three rotating input sets), and
reports the fraction of the copy roofline (``x`` read once, ``y`` written
once, at the measured device-to-device copy bandwidth). Registers and local
memory come from each loaded kernel. Correctness is the tests' job; this
script only checks that every output is finite and close to the plane
kernel's, and reports whether each run's outputs (backward: ``dx`` and every
weight gradient) are bit for bit the planner's. ``--backward`` times the
backward instead (``dx`` and every weight gradient; roofline: ``x`` and ``dy``
read, ``dx`` written).

    python benchmarks/register_bench.py --json register_bench.json
    python benchmarks/register_bench.py --configs 64x768x7x7:2 64x192x28x28:4 --variants 128:168
    python benchmarks/register_bench.py --backward --variants 128:255
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tile_bench import (  # noqa: E402
    ITEMSIZE, as_float32, copy_bandwidth, kernel_report, random_inputs,
)

from wtconv_cuda._bench.core import CupyEventTimer, time_median  # noqa: E402
from wtconv_cuda.kernels.launch import (  # noqa: E402
    CupyBackend, Problem, Tuning, Weights, planned_specs, run_backward, run_forward,
)


def parse_config(text: str) -> tuple:
    dims, levels = text.split(":")
    return (*(int(v) for v in dims.split("x")), int(levels))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["64x768x7x7:2"])
    parser.add_argument("--storage", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--variants", nargs="+", default=["128:168", "128:128", "128:255",
                                                          "64:168", "256:168"])
    parser.add_argument("--kernel-size", type=int, default=5)
    parser.add_argument("--backward", action="store_true", help="time the backward pass")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    backend = CupyBackend()
    runs = {"plane": Tuning(registers=False), "auto": Tuning()}
    for text in args.variants:
        threads, cap = (int(v) for v in text.split(":"))
        runs[f"r{threads}:{cap}"] = Tuning(registers=True, threads=threads, max_registers=cap)
    problems = [Problem(b, c, h, w, args.kernel_size, lv, 1, storage, True)
                for b, c, h, w, lv in map(parse_config, args.configs) for storage in args.storage]
    specs = [spec for p in problems for t in runs.values()
             for spec in planned_specs(p, args.backward, backend.shared_limit,
                                       backend.max_slots, t)]
    kernels = kernel_report(specs, backend)
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)

    rows = []
    gen = np.random.default_rng(0)
    for p in problems:
        xs, weights = random_inputs(gen, p)
        planes = (3 if args.backward else 2) * p.batch * p.channels * p.height * p.width
        nbytes = planes * ITEMSIZE[p.storage]
        outputs, gradients = {}, {}
        row = {"problem": p._asdict(), "ms": {}, "roofline": {}, "specs": {}}
        grads = Weights(*(cupy.empty_like(a) for a in weights))
        for name, tuning in runs.items():
            y = cupy.full_like(xs[0], 0xFFFF if p.storage == "bfloat16" else np.nan)

            def run(i, y=y, tuning=tuning):
                if args.backward:  # dy: another rotation's input
                    run_backward(backend, p, xs[i], xs[i - 1], y, weights, grads, tuning)
                else:
                    run_forward(backend, p, xs[i], y, weights, tuning)

            timing = time_median(run, [(i,) for i in range(len(xs))], CupyEventTimer(cupy),
                                 30, 3)
            run(0)
            outputs[name] = y
            if args.backward:
                gradients[name] = [g.copy() for g in grads]
            ms = timing.median_ms
            row["ms"][name] = round(ms, 4)
            row["roofline"][name] = round(nbytes / bandwidth / (ms * 1e-3), 4)
            row["specs"][name] = [repr(s) for s in planned_specs(
                p, args.backward, backend.shared_limit, backend.max_slots, tuning)]
        ref = as_float32(outputs["plane"], p.storage)
        row["max_rel_diff"] = {}
        for name, y in outputs.items():
            got = as_float32(y, p.storage)
            assert bool(cupy.isfinite(got).all()), f"{name}: non-finite outputs"
            diff = float(cupy.abs(got - ref).max() / cupy.abs(ref).max())
            row["max_rel_diff"][name] = diff
        # outputs bit for bit those of the planner's choice (a register cap must not
        # change them): dx or y, and backward every weight gradient
        row["same_bits_as_auto"] = {
            name: bool(cupy.array_equal(y, outputs["auto"])) and all(
                bool(cupy.array_equal(a, b))
                for a, b in zip(gradients.get(name, ()), gradients.get("auto", ())))
            for name, y in outputs.items() if name != "auto"}
        rows.append(row)
        cells = "  ".join(f"{n} {row['ms'][n]:.4f} ms ({100 * row['roofline'][n]:.1f}%)"
                          for n in runs)
        print(f"{p.batch}x{p.channels}x{p.height}x{p.width} L{p.levels} {p.storage}: {cells}"
              f"  same bits as auto: {row['same_bits_as_auto']}", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"bandwidth": bandwidth, "kernels": kernels, "rows": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
