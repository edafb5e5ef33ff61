"""Static SASS of kernel variants on a CPU machine, and the difference between two trees.

The PTX tier (:mod:`wtconv_cuda.kernels.ptxas`) reports registers and spills
without a GPU; this goes one step further: it links each variant's PTX for
``sm_90`` with nvJitLink and disassembles the cubin with ``nvdisasm``
(``pip install nvidia-cuda-nvdisasm``, or one on ``PATH``), then counts the
instructions by opcode. Static counts are not executed counts (a loop body
counts once), so they compare two versions of one kernel's code, for example
an index computation made cheaper, before device time is spent on timing it.

    python benchmarks/sass_static.py --stage 14 --backward
    python benchmarks/sass_static.py --stage 56 --tree /tmp/base     # base -> this tree
    python benchmarks/sass_static.py --spec 'TileSpec(5, "float32", 1, 16, 32, 2)'
    python benchmarks/sass_static.py --stage 56 --storage bfloat16 --loads

``--stage`` takes the planner's variants of a ConvNeXt-T stage (B = 64, K 5,
the stage's levels); ``--tree`` a checkout whose variants (of the same
problem) are counted in a subprocess and printed beside this tree's;
``--dump DIR`` writes each variant's SASS text; ``--loads`` prints how many global
loads each variant issues before the first use of each (:func:`loads_in_flight`).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: ConvNeXt-T stages: plane edge -> (batch, channels, levels).
STAGES = {56: (64, 96, 5), 28: (64, 192, 4), 14: (64, 384, 3), 7: (64, 768, 2)}
#: Opcode families printed as columns (the rest are summed under "other").
COLUMNS = ("FFMA", "FADD", "LDS", "STS", "IMAD", "IADD3", "ISETP", "LEA", "SEL", "LDG")
_OPCODE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def nvdisasm_path() -> str:
    """``nvdisasm`` from the ``nvidia-cuda-nvdisasm`` wheel, else from ``PATH``."""
    try:
        import nvidia
        for root in nvidia.__path__:
            for candidate in sorted(Path(root).glob("cu*/bin/nvdisasm")):
                return str(candidate)
    except ImportError:
        pass
    found = shutil.which("nvdisasm")
    if found is None:
        raise SystemExit("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    return found


def cubin(ptx: str, cc: tuple[int, int]) -> bytes:
    """``ptx`` linked for ``sm_{cc}`` by nvJitLink."""
    from cuda.bindings import nvjitlink

    data = ptx.encode()
    handle = nvjitlink.create(1, [f"-arch=sm_{cc[0]}{cc[1]}"])
    try:
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel")
        nvjitlink.complete(handle)
        out = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, out)
        return bytes(out)
    finally:
        nvjitlink.destroy(handle)


def disassemble(binary: bytes) -> str:
    """SASS text of a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as handle:
        handle.write(binary)
    try:
        return subprocess.run([nvdisasm_path(), "-c", handle.name], check=True,
                              capture_output=True, text=True).stdout
    finally:
        os.unlink(handle.name)


def opcode_counts(sass: str) -> collections.Counter:
    """Instructions by opcode (modifiers dropped: ``IMAD.MOV.U32`` counts as ``IMAD``)."""
    counts: collections.Counter = collections.Counter()
    for line in sass.splitlines():
        match = _OPCODE.match(line)
        if match:
            counts[match.group(1)] += 1
    return counts


_INSTRUCTION = re.compile(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?)\s*;")


def loads_in_flight(sass: str, window: int = 400) -> list[int]:
    """For each global load (``LDG``) in program order, how many further global loads
    are issued before the first instruction that reads its destination register
    (within ``window`` instructions; a load whose register is not read there is left
    out).

    A load's value is waited for at its first use, so a loop that issues ``n``
    loads before using any shares one memory latency among them; a count of 0
    means its first use follows before the next load. Static: a loop body counts
    once, and predicated instructions count as if taken.
    """
    ins = [(m.group(1), m.group(2)) for m in map(_INSTRUCTION.search, sass.splitlines())
           if m]
    found = []
    for i, (op, operands) in enumerate(ins):
        if not op.startswith("LDG"):
            continue
        dest = re.compile(rf"\b{operands.split(',')[0].strip()}\b")
        later = 0
        for op2, operands2 in ins[i + 1:i + 1 + window]:
            sources = operands2.split(",")[0 if op2.startswith("ST") else 1:]
            if any(dest.search(part) for part in sources):
                found.append(later)
                break
            later += op2.startswith("LDG")
    return found


def stage_specs(edge: int, storage: str, backward: bool) -> list:
    """The kernel variants the planner launches for a ConvNeXt-T stage."""
    from wtconv_cuda.kernels.launch import Problem, planned_specs

    batch, channels, levels = STAGES[edge]
    problem = Problem(batch, channels, edge, edge, 5, levels, 1, storage, True)
    return planned_specs(problem, backward, 232448, 1 << 30)


def count_specs(specs: list, cc: tuple[int, int], dump: str | None,
                loads: dict | None = None) -> dict:
    """``{repr(spec): {opcode: count}}``, compiling what the PTX cache lacks; with a
    ``loads`` dict, also ``loads[repr(spec)] =`` :func:`loads_in_flight` of it."""
    from wtconv_cuda.kernels.compiler import cached_ptx, distinct
    from wtconv_cuda.kernels.warmup import compile_all

    specs = distinct(specs)
    compile_all(specs, cc, 2)
    result = {}
    for number, spec in enumerate(specs):
        sass = disassemble(cubin(cached_ptx(spec, cc)[0].read_text(), cc))
        if dump:
            Path(dump).mkdir(parents=True, exist_ok=True)
            Path(dump, f"{number:02d}_{type(spec).__name__}.sass").write_text(sass)
        result[repr(spec)] = dict(opcode_counts(sass))
        if loads is not None:
            loads[repr(spec)] = loads_in_flight(sass)
    return result


def _row(name: str, counts: dict) -> str:
    total = sum(counts.values())
    cells = [counts.get(op, 0) for op in COLUMNS]
    other = total - sum(cells)
    return f"{total:6d} " + " ".join(f"{c:5d}" for c in cells) + f" {other:5d}  {name}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", type=int, choices=sorted(STAGES), default=None)
    parser.add_argument("--backward", action="store_true", help="with --stage: its backward")
    parser.add_argument("--storage", default="float32")
    parser.add_argument("--spec", action="append", default=[], help="a spec's repr (repeatable)")
    parser.add_argument("--tree", default=None, help="another checkout to compare with")
    parser.add_argument("--cc", default="9.0")
    parser.add_argument("--dump", default=None, help="folder for the SASS texts")
    parser.add_argument("--json", default=None, help="write the counts here")
    parser.add_argument("--loads", action="store_true",
                        help="also print each variant's global loads in flight at their "
                             "first use (see loads_in_flight)")
    args = parser.parse_args(argv)
    cc = tuple(int(v) for v in args.cc.split("."))

    from wtconv_cuda.kernels.compiler import spec_from_repr

    specs = [spec_from_repr(text) for text in args.spec]
    if args.stage:
        specs += stage_specs(args.stage, args.storage, args.backward)
    if not specs:
        parser.error("give --stage or --spec")
    in_flight = {} if args.loads else None
    counts = count_specs(specs, cc, args.dump, in_flight)
    base = None
    if args.tree:
        forwarded = list(argv if argv is not None else sys.argv[1:])
        for option in ("--tree", "--dump", "--json"):
            if option in forwarded:
                cut = forwarded.index(option)
                del forwarded[cut:cut + 2]
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder, "base.json")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                [args.tree] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                               if p]))
            # this script, importing the other tree's package (its PYTHONPATH entry
            # comes before an installed one)
            subprocess.run([sys.executable, str(Path(__file__).resolve()), *forwarded,
                            "--json", str(out)], check=True, env=env, cwd=args.tree,
                           stdout=subprocess.DEVNULL)
            base = json.loads(out.read_text())
    print(f"{'total':>6s} " + " ".join(f"{op:>5s}" for op in COLUMNS) + f" {'other':>5s}  variant")
    for name, mine in counts.items():
        if base is not None:
            theirs = base.get(name)
            print(_row("  base" if theirs else "  base: not planned there", theirs or {}))
        print(_row(name, mine))
    if base is not None:
        shared = [n for n in counts if n in base]
        before = sum(sum(base[n].values()) for n in shared)
        after = sum(sum(counts[n].values()) for n in shared)
        print(f"variants in both trees: {len(shared)}; static instructions {before} -> {after}")
    for name, found in (in_flight or {}).items():
        mean = sum(found) / len(found) if found else 0.0
        print(f"loads {len(found):4d}, further loads before first use: mean {mean:5.1f}, "
              f"max {max(found, default=0):3d}, none {found.count(0):3d}  {name}")
    if args.json:
        Path(args.json).write_text(json.dumps(counts, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
