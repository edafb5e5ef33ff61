"""A/B of a small-plane split rule through the CuPy path, every setting in one process.

``SPLIT_SMALL_TILES[edge]`` decides how a forward on planes of at most
``edge`` pixels splits: from which problem size (``min_pixels``) it runs a
pooling pre-pass, the coarse problem and the tiles (three launches) instead
of the plane kernel (one), or the tile alone with the coarse levels in its
block (``inner``). The backward's ``dx`` forward follows it too
(:func:`~wtconv_cuda.kernels.launch.dx_forward_plan`). For each shape this
script alternates the current rule and each ``--rule`` (fields of
:class:`~wtconv_cuda.kernels.launch.SmallTileSplit` replaced, e.g.
``inner=1,min_pixels=0``; ``--min-pixels N`` is ``--rule min_pixels=N``)
for ``--rounds`` rounds (plan and program caches cleared at every switch,
kernels compiled beforehand), and prints, in us, the median over
``--repeats`` calls with rotating inputs of:

- ``fwd``: CUDA events around one ``wtconv_cuda.forward`` call after the GPU
  went idle (host time included, as in the user benchmark);
- ``fwd b2b``: events around ``--repeats`` back-to-back forwards, per call
  (the GPU never waits for the host: kernel time);
- ``step``: events around one forward and one backward (a training step);
- ``step b2b``: back to back, per step.

It also prints which launches each setting plans. Inputs are random normal
(PyTorch makes them on the GPU), never zeros.

    python benchmarks/split_threshold.py --min-pixels 2097152 \\
        --shapes 28x384x14x14:3 32x384x14x14:3 64x192x14x14:3 64x384x14x14:3
    python benchmarks/split_threshold.py --rule inner=1,min_pixels=0 \\
        --shapes 64x384x14x14:3 32x384x14x14:3
    python benchmarks/split_threshold.py --edge 32 --max-read 4.5 --rule level=3 \\
        --shapes 64x192x28x28:4
    python benchmarks/split_threshold.py --edge 32 --kernel-size 7 \\
        --rule max_registers_k7=152 --shapes 64x192x28x28:4

(From ``K`` 7 up the 28 x 28 rule's register cap is ``max_registers_k7``, not
``max_registers``.)

``--max-read`` sets ``launch.TILE_MAX_READ`` for every setting: the small-plane rule
checks a split level's halo against it, though its tiles cover their plane (at 32
pixels, ``K`` 5, level 3 reads 4.0 by that count and would fall back to the plane
kernel).
"""

from __future__ import annotations

import argparse
import json
import statistics

try:  # lanes_ab.py --compile-only imports this module's helpers on machines without CuPy
    import cupy
except ImportError:  # pragma: no cover - only the timing functions need it
    cupy = None
import wtconv_cuda as wt
from wtconv_cuda import gpu
from wtconv_cuda.kernels import launch
from wtconv_cuda.kernels.compiler import distinct, parse_compute_capability
from wtconv_cuda.kernels.launch import Problem, planned_specs
from wtconv_cuda.kernels.warmup import compile_all

#: The dtypes wtconv_cuda.forward takes on CuPy arrays.
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def parse_rule(current: launch.SmallTileSplit, text: str) -> launch.SmallTileSplit:
    """``current`` with the fields of ``text`` (``field=int,...``) replaced."""
    fields = {}
    for item in text.split(","):
        name, value = item.split("=")
        if name not in launch.SmallTileSplit._fields:
            raise SystemExit(f"unknown SmallTileSplit field {name!r}")
        fields[name] = type(getattr(current, name))(int(value))
    return current._replace(**fields)


def label(current: launch.SmallTileSplit, rule: launch.SmallTileSplit) -> str:
    """The fields where ``rule`` differs from ``current`` ("current" where none)."""
    changed = [f"{name}={getattr(rule, name):d}" for name in rule._fields
               if getattr(rule, name) != getattr(current, name)]
    return ",".join(changed) or "current"


def set_rule(edge: int, rule: launch.SmallTileSplit) -> None:
    """Set the rule and forget every plan and recorded program."""
    launch.SPLIT_SMALL_TILES[edge] = rule
    launch.clear_plan_caches()
    gpu._program.cache_clear()


def event_us(fn, inputs, repeats: int) -> float:
    """Median of events around single calls, the GPU idle before each."""
    times = []
    for i in range(repeats):
        cupy.cuda.Device().synchronize()
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn(*inputs[i % len(inputs)])
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3)
    return statistics.median(times)


def back_to_back_us(fn, inputs, repeats: int) -> float:
    """Events around ``repeats`` calls issued back to back, per call."""
    cupy.cuda.Device().synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for i in range(repeats):
        fn(*inputs[i % len(inputs)])
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) * 1e3 / repeats


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """The A/B scripts' shared options: dtypes, kernel size, rounds, repeats, compile
    processes and the JSON output."""
    parser.add_argument("--dtypes", nargs="+", default=["fp32"], choices=list(DTYPES))
    parser.add_argument("--kernel-size", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=8, help="compile processes")
    parser.add_argument("--json", default=None)


def time_round(fwd, step, inputs, repeats: int, results: dict) -> None:
    """Warm ``fwd`` and ``step`` (programs recorded, buffers pooled), then append one
    round's ``fwd``, ``fwd b2b``, ``step`` and ``step b2b`` (us) to ``results``."""
    for fn in (fwd, step):
        for i in range(3):
            fn(*inputs[i])
    for key, fn, timer in (("fwd", fwd, event_us), ("fwd b2b", fwd, back_to_back_us),
                           ("step", step, event_us), ("step b2b", step, back_to_back_us)):
        results[key].append(timer(fn, inputs, repeats))


def layer_calls(levels: int):
    """``fwd(x, w, dy)``, a forward, and ``step(x, w, dy)``, a forward with a
    ``Tape`` and its backward (``(dx, gradients)``), through ``wtconv_cuda``."""
    def fwd(x, w, dy):
        return wt.forward(x, w, levels=levels)

    def step(x, w, dy):
        tape = wt.Tape()
        wt.forward(x, w, levels=levels, tape=tape)
        return tape.backward(dy)

    return fwd, step


def parse_shape(text: str):
    dims, levels = text.split(":")
    return tuple(int(v) for v in dims.split("x")), int(levels)


def make_inputs(shape, levels, k, dtype, rotations=3):
    """``rotations`` (x, w, dy) triples of random normal values in ``dtype``, a storage
    name (made by PyTorch on the GPU and shared with CuPy through DLPack)."""
    import torch

    c = shape[1]
    gen = torch.Generator(device="cuda").manual_seed(0)
    held = []

    def draw(*s, scale=1.0):
        t = (torch.randn(s, generator=gen, device="cuda") * scale).to(getattr(torch, dtype))
        held.append(t)
        return cupy.from_dlpack(t)

    out = []
    for _ in range(rotations):
        weights = wt.WTConvWeights(draw(c, k, k, scale=0.2), draw(c), draw(c),
                                   draw(levels, c, 4, k, k, scale=0.2), draw(levels, c, 4))
        out.append((draw(*shape), weights, draw(*shape)))
    return out, held


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", required=True, help="BxCxHxW:L, stride 1")
    parser.add_argument("--edge", type=int, default=16, help="the rule's tile edge")
    parser.add_argument("--rule", action="append", default=[],
                        help="fields replaced, e.g. inner=1,min_pixels=0 (repeatable)")
    parser.add_argument("--min-pixels", type=int, help="shorthand of --rule min_pixels=N")
    parser.add_argument("--max-read", type=float,
                        help="launch.TILE_MAX_READ for every setting (a rule's deeper split "
                             "level is refused above it and falls back to the plane kernel)")
    add_common_options(parser)
    args = parser.parse_args(argv)
    if args.max_read is not None:
        launch.TILE_MAX_READ = args.max_read

    current = launch.SPLIT_SMALL_TILES[args.edge]
    texts = args.rule + ([f"min_pixels={args.min_pixels}"] if args.min_pixels is not None else [])
    if not texts:
        parser.error("give --rule or --min-pixels")
    rules = [current] + [parse_rule(current, text) for text in texts]
    settings = [label(current, rule) for rule in rules]
    rule_of = dict(zip(settings, rules))
    backend = gpu._backend(0)
    cc = parse_compute_capability(cupy.cuda.Device(0).compute_capability)
    rows = []
    for text in args.shapes:
        shape, levels = parse_shape(text)
        for dtype_name in args.dtypes:
            storage = DTYPES[dtype_name]
            problem = Problem(*shape, args.kernel_size, levels, 1, storage, True)
            specs = []
            for setting in settings:
                set_rule(args.edge, rule_of[setting])
                for backward in (False, True):
                    plan = planned_specs(problem, backward, backend.shared_limit,
                                         backend.max_slots)
                    specs += plan
                    print(f"{text} {dtype_name} {setting} "
                          f"{'backward' if backward else 'forward'}: "
                          + ", ".join(type(s).__name__ for s in plan), flush=True)
            compile_all(distinct(specs), cc, args.jobs)
            inputs, _held = make_inputs(shape, levels, args.kernel_size,
                                        storage)

            fwd, step = layer_calls(levels)

            # every setting's y and dx against the current rule's (validated by the tests)
            ref = None
            for setting in settings:
                set_rule(args.edge, rule_of[setting])
                got = (fwd(*inputs[0]).astype(cupy.float64),
                       step(*inputs[0])[0].astype(cupy.float64))
                ref = got if ref is None else ref
                diff = [float(cupy.abs(a - b).max() / cupy.abs(b).max())
                        for a, b in zip(got, ref)]
                print(f"{text} {dtype_name} {setting}: max |y - y_current| / max |y_current| "
                      f"{diff[0]:.2e}, dx {diff[1]:.2e}", flush=True)
            del ref, got
            results = {setting: {"fwd": [], "fwd b2b": [], "step": [], "step b2b": []}
                       for setting in settings}
            for _ in range(args.rounds):
                for setting in settings:
                    set_rule(args.edge, rule_of[setting])
                    time_round(fwd, step, inputs, args.repeats, results[setting])
            set_rule(args.edge, current)
            for setting in settings:
                cells = "  ".join(f"{name} " + "/".join(f"{v:.1f}" for v in values)
                                  for name, values in results[setting].items())
                print(f"{text} {dtype_name} {setting}: {cells}", flush=True)
                rows.append({"shape": text, "dtype": dtype_name, "rule": setting,
                             **rule_of[setting]._asdict(), **results[setting]})
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"edge": args.edge, "rows": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
