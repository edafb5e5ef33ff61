"""Registers and spills of kernel variants, from ptxas, on a machine without a GPU.

The driver reports a loaded kernel's registers and local memory
(``benchmarks/tile_bench.py`` prints them), but only on a GPU. ptxas says the
same when it assembles the PTX, and nvJitLink (``nvidia-nvjitlink``, which
``numba-cuda[cu13]`` installs) runs ptxas in-process: this module links each
variant's cached PTX for a target and reads ptxas's ``-v`` report. A spill
(local memory) in a hot kernel costs several times its time (a 5x5
depthwise convolution on an H200: 701 us with 104 B of local memory per
thread, 130 us without), so the CPU suite checks the variants it compiles.

    python -m wtconv_cuda.kernels.ptxas --kernel-sizes 3 5 7 9 --planes 512x512 56x56

prints one line per variant the planner picks for those options (compiling
what the PTX cache lacks), and with ``--json PATH`` writes them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import NamedTuple


class PtxasUsage(NamedTuple):
    """What ptxas reports for one kernel entry.

    Attributes
    ----------
    registers : int
        Registers per thread.
    stack_bytes : int
        Stack frame per thread (local memory the code addresses).
    spill_store_bytes, spill_load_bytes : int
        Bytes of register spills per thread, stored and loaded.
    """

    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int

    @property
    def local_bytes(self) -> int:
        """Local memory per thread that the code touches: stack frame or spills."""
        return max(self.stack_bytes, self.spill_store_bytes)


_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")


def parse_report(log: str) -> PtxasUsage:
    """The :class:`PtxasUsage` of the single entry in a ptxas ``-v`` report.

    Raises
    ------
    ValueError
        The report does not hold exactly one entry's frame and register lines.
    """
    frames, registers = _FRAME.findall(log), _REGISTERS.findall(log)
    if len(frames) != 1 or len(registers) != 1:
        raise ValueError(f"expected one kernel entry in the ptxas report, got:\n{log}")
    stack, stores, loads = (int(v) for v in frames[0])
    return PtxasUsage(int(registers[0]), stack, stores, loads)


def ptxas_usage(ptx: str, cc: tuple[int, int] = (9, 0)) -> PtxasUsage:
    """Assemble ``ptx`` for ``sm_{cc}`` with nvJitLink and return ptxas's report.

    Parameters
    ----------
    ptx : str
        PTX text with one kernel entry (as :func:`~wtconv_cuda.kernels.compiler.cached_ptx`
        writes it, ``.maxnreg`` and ``.maxntid`` included).
    cc : tuple of int, default (9, 0)
        Target compute capability.

    Returns
    -------
    PtxasUsage

    Raises
    ------
    ImportError
        ``cuda.bindings.nvjitlink`` is not installed (``pip install "numba-cuda[cu13]"``).
    RuntimeError
        nvJitLink rejected the PTX; the message holds its error log.
    """
    from cuda.bindings import nvjitlink

    data = ptx.encode()
    handle = nvjitlink.create(2, [f"-arch=sm_{cc[0]}{cc[1]}", "-Xptxas=-v"])
    try:
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel")
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as exc:
            raise RuntimeError(f"nvJitLink: {exc}\n{_log(nvjitlink, handle, error=True)}") from exc
        return parse_report(_log(nvjitlink, handle))
    finally:
        nvjitlink.destroy(handle)


def _log(nvjitlink, handle, error: bool = False) -> str:
    """nvJitLink's info (or error) log of ``handle``."""
    size = (nvjitlink.get_error_log_size if error else nvjitlink.get_info_log_size)(handle)
    buffer = bytearray(size)
    (nvjitlink.get_error_log if error else nvjitlink.get_info_log)(handle, buffer)
    return buffer.decode(errors="replace").rstrip("\x00")


def report(specs, cc: tuple[int, int] = (9, 0), jobs: int = 1) -> dict:
    """Compile (or take from the PTX cache) every spec and assemble it.

    Parameters
    ----------
    specs : iterable of PlaneSpec, TileSpec or FinalizeSpec
        The variants.
    cc : tuple of int, default (9, 0)
        Target compute capability.
    jobs : int, default 1
        Processes compiling what the cache lacks.

    Returns
    -------
    dict
        ``{repr(spec): PtxasUsage}`` in the order of ``specs``.
    """
    from .compiler import cached_ptx, distinct
    from .warmup import compile_all

    specs = distinct(specs)
    compile_all(specs, cc, jobs)
    return {repr(spec): ptxas_usage(cached_ptx(spec, cc)[0].read_text(), cc) for spec in specs}


def main(argv=None) -> int:
    """Command line: the planner's variants for the options given, their registers and spills.

    Exits 1 when any variant spills or keeps a stack frame.
    """
    from .warmup import variants

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel-sizes", type=int, nargs="+", default=[3, 5, 7, 9])
    parser.add_argument("--storages", nargs="+", default=["float32", "float16", "bfloat16"])
    parser.add_argument("--strides", type=int, nargs="+", default=[1])
    parser.add_argument("--planes", nargs="+", default=["56x56", "28x28", "14x14", "7x7",
                                                        "128x128", "512x512"])
    parser.add_argument("--levels", type=int, nargs="+", default=list(range(7)))
    parser.add_argument("--cc", default="9.0")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    planes = [tuple(int(v) for v in p.split("x")) for p in args.planes]
    cc = tuple(int(v) for v in args.cc.split("."))
    specs = variants(args.kernel_sizes, args.storages, args.strides, planes, args.levels)
    usage = report(specs, cc, args.jobs)
    bad = 0
    for name, u in usage.items():
        flag = "" if u.local_bytes == 0 else "   <-- local memory"
        bad += bool(flag)
        print(f"{u.registers:4d} regs {u.stack_bytes:5d} B stack {u.spill_store_bytes:5d} B spill  "
              f"{name}{flag}")
    print(f"{len(usage)} variants, {bad} with local memory")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({name: u._asdict() for name, u in usage.items()}, handle, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
