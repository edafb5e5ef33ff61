"""A/B of the lane kernel for a backward's weight gradients, through the CuPy path.

Where ``dx`` comes from the forward kernels, the weight gradients run on the
plane kernel's ``weights_only`` variant unless the planner takes the lane
kernel (:mod:`wtconv_cuda.kernels.lanes`; ``LANES_MAX_PIXELS`` and
``LANES_DEFAULT`` in :mod:`wtconv_cuda.kernels.launch`). For each shape and
dtype this script alternates the settings ``plane`` (no lane kernel),
``lanes1`` / ``lanes2`` (the weight gradients on the lane kernel, one or two
threads a plane, for planes of up to ``LANES_FORCE_MAX_PIXELS``) and ``all1``
/ ``all2`` (the forward and the backward's ``dx`` forward on its forward
too, ``LANES_FORWARD_MAX_PIXELS``; ``all4``: those with four threads a plane,
``LANES_FORWARD_DEFAULT``; ``noreg1`` / ``noreg2`` / ``noreg4``: the default
lane rules, the forward's with one, two or four threads a plane, and the
register kernel off, ``REGISTER_MAX_PIXELS`` 0, so that planes of up to 8 x 8,
which it takes first, run on the lane kernel's forward: the 7 x 7 stage's
passes, and the 7 x 7 coarse problem of the 28 x 28 stage's split forward; at
such shapes ``plane`` is the register kernel; ``reg32`` / ``reg64``: the register
kernel's blocks of 32 or 64 threads instead of ``REGISTER_THREADS``; ``default``: the
rules as they stand; ``groups1`` / ``groups2``: those with at most one or two groups
of planes per lane block, ``LANE_GROUPS_MAX``: with one, 16-bit 14 x 14 planes fall
back to one thread a plane within the partials' bound, with two they keep two;
``blocked``: the default rules with the weights-only plane kernel's correlations on
register blocks, ``BLOCKED_WEIGHTS``, at the planes the lane kernel does not take:
the 56 x 56 and 28 x 28 stages; ``planes1``: the default rules with one plane a block
in the 28 x 28 stage's split tile, whose rule takes four; ``onestream``: the default
rules with the backward's two parts on one stream, ``TWO_STREAMS`` off) for
``--rounds`` rounds, plan
and program caches cleared at every switch, kernels compiled beforehand, and prints in
us the median over ``--repeats`` calls with rotating inputs of ``fwd`` and ``step``
(events around one forward, or one forward and backward, after the GPU went
idle), ``fwd b2b`` and ``step b2b`` (back to back, per call), and ``bwd`` =
``step b2b - fwd b2b``. Every setting's ``y``, ``dx`` and gradients are
compared with the ``plane`` setting's first. Inputs are random normal, never
zeros.

    python benchmarks/lanes_ab.py --shapes 64x384x14x14:3 32x384x14x14:3 \\
        64x768x7x7:2 --dtypes fp32 bf16 --json lanes_ab.json

``--compile-only`` compiles the variants it would launch, for the H200's
limits, without a GPU (``scripts/build_ptx_cache.sh lanes`` carries them).
"""

from __future__ import annotations

import argparse
import json

from wtconv_cuda.kernels import launch
from wtconv_cuda.kernels.compiler import distinct
from wtconv_cuda.kernels.launch import Problem, planned_specs
from wtconv_cuda.kernels.warmup import compile_all

from split_threshold import (
    DTYPES, add_common_options, layer_calls, make_inputs, parse_shape, time_round,
)
#: setting -> (LANES_MAX_PIXELS, LANES_DEFAULT, LANES_FORWARD_MAX_PIXELS,
#: LANES_FORWARD_DEFAULT, REGISTER_MAX_PIXELS, REGISTER_THREADS, LANE_GROUPS_MAX,
#: BLOCKED_WEIGHTS):
#: the weight gradients on the lane kernel (lanes1, lanes2), the forwards too (all1,
#: all2; all4: the forwards with four threads a plane), the default rules with the
#: register kernel off (noreg*; larger planes keep their kernels, so no 28 x 28 lane
#: variant is built), the register kernel's smaller blocks (reg32, reg64), and the
#: default rules as they stand (default) and with at most one or two groups of planes
#: per lane block (groups1: 16-bit 14 x 14 planes then take one thread a plane;
#: groups2: they keep two), and the default rules with the weights-only plane kernel on
#: register blocks (blocked; BLOCKED_WEIGHTS).
_ALL = launch.LANES_FORCE_MAX_PIXELS
_REG, _REG_THREADS = launch.REGISTER_MAX_PIXELS, launch.REGISTER_THREADS
_LANES, _LANES_FWD = launch.LANES_MAX_PIXELS, launch.LANES_FORWARD_MAX_PIXELS
_DEFAULT = (_LANES, launch.LANES_DEFAULT, _LANES_FWD, launch.LANES_FORWARD_DEFAULT, _REG,
            _REG_THREADS, launch.LANE_GROUPS_MAX, launch.BLOCKED_WEIGHTS)
SETTINGS = {"plane": (0, 2, 0, 2, _REG, _REG_THREADS, 1, False),
            "lanes1": (_ALL, 1, 0, 2, _REG, _REG_THREADS, 1, False),
            "lanes2": (_ALL, 2, 0, 2, _REG, _REG_THREADS, 1, False),
            "all1": (_ALL, 1, _ALL, 1, _REG, _REG_THREADS, 1, False),
            "all2": (_ALL, 2, _ALL, 2, _REG, _REG_THREADS, 1, False),
            "all4": (_ALL, 2, _ALL, 4, _REG, _REG_THREADS, 1, False),
            "noreg1": (_LANES, 2, _LANES_FWD, 1, 0, _REG_THREADS, 1, False),
            "noreg2": (_LANES, 2, _LANES_FWD, 2, 0, _REG_THREADS, 1, False),
            "noreg4": (_LANES, 2, _LANES_FWD, 4, 0, _REG_THREADS, 1, False),
            "reg32": (0, 2, 0, 2, _REG, 32, 1, False),
            "reg64": (0, 2, 0, 2, _REG, 64, 1, False),
            "default": _DEFAULT, "groups1": _DEFAULT[:-2] + (1, _DEFAULT[-1]),
            "groups2": _DEFAULT[:-2] + (2, _DEFAULT[-1]),
            "blocked": _DEFAULT[:-1] + (True,)}
#: Every setting keeps the small-plane split rules as they stand (SPLIT_SMALL_TILES)
#: and the backward's two streams (TWO_STREAMS), but planes1: the default rules with
#: one plane a block in the whole-plane forward tiles (the 28 x 28 stage's rule takes
#: four), and onestream: the default rules with the backward's dx part and weight
#: gradients one after the other on the caller's stream.
SETTINGS = {name: rules + (launch.SPLIT_SMALL_TILES, launch.TWO_STREAMS)
            for name, rules in SETTINGS.items()}
SETTINGS["planes1"] = _DEFAULT + ({edge: rule._replace(planes=1)
                                   for edge, rule in launch.SPLIT_SMALL_TILES.items()},
                                  launch.TWO_STREAMS)
SETTINGS["onestream"] = _DEFAULT + (launch.SPLIT_SMALL_TILES, False)
_RULES = ("LANES_MAX_PIXELS", "LANES_DEFAULT", "LANES_FORWARD_MAX_PIXELS",
          "LANES_FORWARD_DEFAULT", "REGISTER_MAX_PIXELS", "REGISTER_THREADS",
          "LANE_GROUPS_MAX", "BLOCKED_WEIGHTS", "SPLIT_SMALL_TILES", "TWO_STREAMS")
#: The H200 backend's limits (CupyBackend: opt-in shared memory less 1 KB, two slots
#: per multiprocessor), for --compile-only.
H200_LIMITS = (227 * 1024 - 1024, 2 * 132)


def use(setting: str) -> None:
    """Switch the planner's lane rule and forget every plan (and recorded program)."""
    for name, value in zip(_RULES, SETTINGS[setting]):
        setattr(launch, name, value)
    launch.clear_plan_caches()
    try:
        from wtconv_cuda import gpu
        gpu._program.cache_clear()
    except ImportError:  # no CuPy: nothing recorded
        pass


def variants(problem: Problem, settings, limits, log=None) -> list:
    """The specs a forward and a backward of ``problem`` launch under each setting."""
    specs = []
    for setting in settings:
        use(setting)
        backward = planned_specs(problem, True, *limits)
        specs += backward + planned_specs(problem, False, *limits)
        if log:
            log(f"{setting} backward: " + ", ".join(type(s).__name__ for s in backward))
    return distinct(specs)


def gradients(step, inputs) -> list:
    """``dx`` and every weight gradient of one step, as float64 CuPy arrays."""
    import cupy
    dx, dw = step(*inputs)
    return [dx.astype(cupy.float64)] + [a.astype(cupy.float64) for a in dw if a is not None]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", required=True, help="BxCxHxW:L, stride 1")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    add_common_options(parser)
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the variants for sm_90 and the H200's limits, then stop")
    args = parser.parse_args(argv)
    settings = ["plane"] + [s for s in args.settings if s != "plane"]
    problems = []
    for text in args.shapes:
        shape, levels = parse_shape(text)
        problems += [(text, dtype_name, Problem(*shape, args.kernel_size, levels, 1,
                                                DTYPES[dtype_name], True))
                     for dtype_name in args.dtypes]
    saved = {name: getattr(launch, name) for name in _RULES}
    if args.compile_only:
        try:
            specs = distinct([s for _, _, p in problems
                              for s in variants(p, settings, H200_LIMITS)])
        finally:
            use("plane")
            for name, value in saved.items():
                setattr(launch, name, value)
        compile_all(specs, (9, 0), args.jobs)
        print(f"compiled {len(specs)} variants")
        return 0

    import cupy

    from wtconv_cuda import gpu
    from wtconv_cuda.kernels.compiler import parse_compute_capability

    backend = gpu._backend(0)
    cc = parse_compute_capability(cupy.cuda.Device(0).compute_capability)
    rows = []
    try:
        for text, dtype_name, problem in problems:
            rows += measure(f"{text} {dtype_name}", problem, settings, args,
                            (backend.shared_limit, backend.max_slots), cc)
    finally:
        use("plane")
        for name, value in saved.items():
            setattr(launch, name, value)
        launch.clear_plan_caches()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"rows": rows}, handle, indent=1)
    return 0


def measure(name: str, problem: Problem, settings: list, args, limits, cc) -> list:
    """Compile, compare and time one problem under every setting; its JSON rows."""
    import cupy

    compile_all(variants(problem, settings, limits,
                         lambda line: print(f"{name} {line}", flush=True)), cc, args.jobs)
    inputs, _held = make_inputs(tuple(problem[:4]), problem.levels, problem.kernel_size,
                                problem.storage)
    fwd, step = layer_calls(problem.levels)

    ref = None
    for setting in settings:
        use(setting)
        got = [fwd(*inputs[0]).astype(cupy.float64)] + gradients(step, inputs[0])
        ref = got if ref is None else ref
        diff = max(float(cupy.abs(a - b).max() / cupy.abs(b).max()) for a, b in zip(got, ref))
        print(f"{name} {setting}: max over y, dx and the gradients of "
              f"max |g - g_plane| / max |g_plane| {diff:.2e}", flush=True)
    del ref, got
    results = {s: {"fwd": [], "fwd b2b": [], "step": [], "step b2b": [], "bwd": []}
               for s in settings}
    for _ in range(args.rounds):
        for setting in settings:
            use(setting)
            r = results[setting]
            time_round(fwd, step, inputs, args.repeats, r)
            r["bwd"].append(r["step b2b"][-1] - r["fwd b2b"][-1])
    rows = []
    for setting in settings:
        cells = "  ".join(f"{key} " + "/".join(f"{v:.1f}" for v in values)
                          for key, values in results[setting].items())
        print(f"{name} {setting}: {cells}", flush=True)
        rows.append({"problem": name, "setting": setting, **results[setting]})
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
