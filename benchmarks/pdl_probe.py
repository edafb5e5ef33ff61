"""Programmatic dependent launch (PDL) of the recorded programs against plain launches: a probe.

On Hopper a kernel launched with the programmatic-stream-serialization attribute may
be scheduled before the kernel ahead of it on the stream has finished. It waits at
``griddepcontrol.wait`` until that kernel has finished and its writes are visible,
and the kernel ahead lets it be scheduled with ``griddepcontrol.launch_dependents``
(once every block of the grid has issued it or exited). The 28 x 28 forward, the
inference target's weakest stage, is three kernels in a row (pre-pass, coarse
problem, tiles); each boundary costs a launch and a drain and fill of the SMs.

Here every kernel of a recorded program gets both instructions as the first of its
body (:func:`with_grid_dependency`, on a copy of its cached PTX; nothing else in the
kernels changes), and every launch goes through ``cuLaunchKernelEx`` with the
attribute (:class:`PdlLauncher`, ``ctypes`` on ``libcuda``). Each kernel still waits
at its first instruction, so the results are those of plain launches, bit for bit;
what this can save is the launch latency and the fill of each kernel behind the tail
of the one before. Work before the wait (a tile's load of ``x`` and its finer levels,
which do not read the coarse problem) would need the wait placed in the generated
source: not done here.

For each ConvNeXt-T stage (56, 28, 14, 7) and dtype: the forward and the backward
program on one stream, plain and PDL, alternating rounds, medians of 30 calls (CUDA
events, three rotating input sets), and whether PDL gives the plain launches' bits.

    python benchmarks/pdl_probe.py --storage float32 bfloat16 --json pdl.json
"""

from __future__ import annotations

import ctypes
import re
import tempfile
from pathlib import Path

from wtconv_cuda.kernels import compiler, driver
from wtconv_cuda.kernels.program import record

# CuPy, and the stage helpers that import it, load in the functions that launch: the
# PTX patch and the launch structures are tested on machines without it.

STAGES = [(64, 96, 56, 56, 5), (64, 192, 28, 28, 4), (64, 384, 14, 14, 3), (64, 768, 7, 7, 2)]
#: The instructions put first in every kernel body.
PROLOGUE = ("\tgriddepcontrol.launch_dependents;", "\tgriddepcontrol.wait;")
#: ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` (cuda.h).
PROGRAMMATIC_STREAM_SERIALIZATION = 6
ROUNDS = 3

_ENTRY = re.compile(r"^\s*(?:\.visible\s+)?\.entry\s")
_DECLARATION = re.compile(r"^\s*(?:\.(?:reg|local|shared|param)\b|//|$)")


def with_grid_dependency(ptx: str) -> str:
    """``ptx`` with `PROLOGUE` before the first instruction of its (one) kernel entry.

    The entry's body starts after the first ``{`` that follows the entry line;
    its declarations (``.reg``, ``.local``, ``.shared``, ``.param``), comments and
    blank lines stay ahead of the prologue.

    Parameters
    ----------
    ptx : str
        PTX of one kernel (ISA 7.8 or later, ``sm_90`` or later).

    Returns
    -------
    str

    Raises
    ------
    ValueError
        No kernel entry, or one entry body without an instruction.
    """
    lines = ptx.splitlines()
    entry = next((i for i, line in enumerate(lines) if _ENTRY.match(line)), None)
    if entry is None:
        raise ValueError("no kernel entry in the PTX")
    body = next(i for i in range(entry, len(lines)) if lines[i].strip() == "{") + 1
    first = next((i for i in range(body, len(lines)) if not _DECLARATION.match(lines[i])), None)
    if first is None or lines[first].strip() == "}":
        raise ValueError("the kernel entry has no instruction")
    return "\n".join(lines[:first] + list(PROLOGUE) + lines[first:]) + "\n"


class _AttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("flag", ctypes.c_int)]


class _Attribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttributeValue)]


class _Config(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attribute)), ("numAttrs", ctypes.c_uint)]


class PdlLauncher:
    """A stand-in for ``cuLaunchKernel`` (``driver._cu_launch_kernel``'s arguments) that
    launches with ``cuLaunchKernelEx`` and programmatic stream serialization allowed.
    One launch configuration is kept per grid, block, shared memory and stream."""

    def __init__(self):
        self._launch = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
        self._launch.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_void_p]
        self._launch.restype = ctypes.c_int
        self._attribute = _Attribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
        self._attribute.value.flag = 1
        self._configs: dict = {}

    def __call__(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        key = (gx, gy, gz, bx, by, bz, shared, stream)
        config = self._configs.get(key)
        if config is None:
            config = self._configs[key] = _Config(
                gx, gy, gz, bx, by, bz, shared, stream or None,
                ctypes.pointer(self._attribute), 1)
        status = self._launch(ctypes.byref(config), function, params, extra or None)
        if status:
            raise RuntimeError(f"cuLaunchKernelEx returned CUresult {status}")


class PdlKernels:
    """``function_of(spec)`` for :func:`record`: each spec's kernel loaded from its cached
    PTX with :func:`with_grid_dependency` applied, and its ``CUfunction`` handle."""

    def __init__(self, backend, folder: Path):
        self._backend = backend
        self._folder = folder
        self._kernels: dict = {}

    def __call__(self, spec):
        import cupy

        kernel = self._kernels.get(spec)
        if kernel is None:
            device = cupy.cuda.Device(self._backend.device_id)
            path, entry = compiler.cached_ptx(
                spec, compiler.parse_compute_capability(device.compute_capability))
            patched = self._folder / f"{path.stem}.pdl.ptx"
            patched.write_text(with_grid_dependency(path.read_text()))
            kernel = cupy.RawModule(path=str(patched)).get_function(entry)
            kernel.max_dynamic_shared_size_bytes = (
                device.attributes["MaxSharedMemoryPerBlockOptin"]
                - kernel.attributes["shared_size_bytes"])
            self._kernels[spec] = kernel
        return self._backend.driver_handle(kernel)


def _programs(backend, problem, pdl_kernels):
    """``{(pass, mode): Program}``: the forward and backward, plain and PDL."""
    def plain(spec):
        return backend.driver_handle(backend.kernel(spec))

    def table(values):
        return backend.table(values).data.ptr

    return {(name, mode): record(problem, backward, backend.shared_limit, backend.max_slots,
                                 function_of, table)
            for name, backward in (("forward", False), ("backward", True))
            for mode, function_of in (("plain", plain), ("pdl", pdl_kernels))}


def _poison(a, storage):
    a.fill(0x7FC0 if storage == "bfloat16" else float("nan"))  # bfloat16: raw NaN bits


def bench_stage(stage, storage, backend, launcher=None, folder=None):
    """One stage's row: times (ms, one median a round) and bit equality of each pass, plain
    and PDL, the two modes alternating round by round."""
    import cupy

    from dx_forward_bench import stage_inputs
    from wtconv_cuda import gpu
    from wtconv_cuda._bench.core import CupyEventTimer, time_median

    problem, weights, sets = stage_inputs(stage, storage)
    launcher = launcher or PdlLauncher()
    folder = folder or Path(tempfile.mkdtemp(prefix="pdl_ptx_"))
    programs = _programs(backend, problem, PdlKernels(backend, folder))
    row = dict(shape=list(stage[:4]), levels=stage[4], storage=storage)
    plain_launch = driver._cu_launch_kernel
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for name in ("forward", "backward"):
            out = cupy.empty_like(sets[0][0])  # y, or dx
            grads = [cupy.empty_like(a) for a in weights]
            written = [out] + (grads if name == "backward" else [])
            outputs = {}
            for _ in range(ROUNDS):
                for mode in ("plain", "pdl"):
                    program = programs[(name, mode)]

                    def call(x, dy, program=program, backward=name == "backward"):
                        arrays = (x, dy, out, *weights, *grads) if backward else (x, out, *weights)
                        program.run([a.data.ptr for a in arrays], gpu._allocate, stream.ptr)

                    driver._cu_launch_kernel = launcher if mode == "pdl" else plain_launch
                    try:
                        for a in written:
                            _poison(a, storage)
                        ms = time_median(call, sets, CupyEventTimer(cupy), 30, 3).median_ms
                        for a in written:
                            _poison(a, storage)
                        call(*sets[0])
                        stream.synchronize()
                    finally:
                        driver._cu_launch_kernel = plain_launch
                    row.setdefault(f"{name} {mode} ms", []).append(ms)
                    outputs.setdefault(mode, [a.copy() for a in written])
            row[f"{name} same bits"] = all(bool(cupy.array_equal(a, b))
                                           for a, b in zip(outputs["plain"], outputs["pdl"]))
    return row


def describe(row):
    return "  ".join(
        f"{name}: plain {min(row[name + ' plain ms']):.4f} pdl {min(row[name + ' pdl ms']):.4f} ms"
        f"{'' if row[name + ' same bits'] else ' (OTHER BITS)'}"
        for name in ("forward", "backward"))


def main():
    from dx_forward_bench import stage_cli

    stage_cli(__doc__.splitlines()[0], STAGES, bench_stage, describe)


if __name__ == "__main__":
    main()
