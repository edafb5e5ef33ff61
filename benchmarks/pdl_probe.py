"""Programmatic dependent launch (PDL) of the recorded programs against plain launches: a probe.

On Hopper a kernel launched with the programmatic-stream-serialization attribute may
be scheduled before the kernel ahead of it on the stream has finished. It waits at
``griddepcontrol.wait`` until that kernel has finished and its writes are visible,
and the kernel ahead lets it be scheduled with ``griddepcontrol.launch_dependents``
(once every block of the grid has issued it or exited).

Modes, each a recorded program (:func:`~wtconv_cuda.kernels.program.record`):

- ``plain``: the default program, plain launches;
- ``pdl``: the same kernels with `PROLOGUE` (wait, then trigger) as the first
  instructions of their bodies (:func:`with_grid_dependency`, on a copy of the cached
  PTX), every launch through ``cuLaunchKernelEx`` with the attribute
  (:class:`PdlLauncher`, ``ctypes`` on ``libcuda``): what launch latency and the fill
  behind the kernel ahead cost, with no work overlapped;
- ``pdl wait``: as ``pdl`` with only the wait (no kernel triggers: each is scheduled
  when the one ahead has finished, nothing resident early that would take the room
  of the later waves of the grid ahead).

All modes give the plain launches' bits. For each ConvNeXt-T stage (28, 56, 14, 7) and
dtype: the forward and the backward on one stream, the modes alternating round by
round, medians of 30 calls (CUDA events, three rotating input sets), and whether each
mode gives ``plain``'s bits.

On the H100 (``results/h100-2026-12-06h/``) neither mode gained more than noise but in
the 28 x 28 backward (about 6 us of 339, 1.8%). The probe at ``22c3a80`` also had split
tiles that waited for the coarse problem only before their syntheses (removed from the
package after it measured them): the 28 x 28 forward took 0.1251-0.1259 ms with them
against 0.1252-0.1253 plain.

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

#: The ConvNeXt-T stages, the 28 x 28 one (the inference target's miss) first.
STAGES = [(64, 192, 28, 28, 4), (64, 96, 56, 56, 5), (64, 384, 14, 14, 3), (64, 768, 7, 7, 2)]
#: The instructions put first in every kernel body.
PROLOGUE = ("\tgriddepcontrol.wait;", "\tgriddepcontrol.launch_dependents;")
#: ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` (cuda.h).
PROGRAMMATIC_STREAM_SERIALIZATION = 6
ROUNDS = 3

_ENTRY = re.compile(r"^\s*(?:\.visible\s+)?\.entry\s")
_DECLARATION = re.compile(r"^\s*(?:\.(?:reg|local|shared|param)\b|//|$)")


def with_grid_dependency(ptx: str, trigger: bool = True) -> str:
    """``ptx`` with `PROLOGUE` before the first instruction of its (one) kernel entry.

    The entry's body starts after the first ``{`` that follows the entry line;
    its declarations (``.reg``, ``.local``, ``.shared``, ``.param``), comments and
    blank lines stay ahead of the prologue.

    Parameters
    ----------
    ptx : str
        PTX of one kernel (ISA 7.8 or later, ``sm_90`` or later).
    trigger : bool, optional
        Put the prologue's trigger after its wait (else the wait only).

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
    prologue = list(PROLOGUE if trigger else PROLOGUE[:1])
    return "\n".join(lines[:first] + prologue + lines[first:]) + "\n"


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
    PTX with :func:`with_grid_dependency` applied (``trigger`` as there), and its
    ``CUfunction`` handle."""

    def __init__(self, backend, folder: Path, trigger: bool = True):
        self._backend = backend
        self._folder = folder
        self._trigger = trigger
        self._kernels: dict = {}

    def __call__(self, spec):
        import cupy

        kernel = self._kernels.get(spec)
        if kernel is None:
            device = cupy.cuda.Device(self._backend.device_id)
            path, entry = compiler.cached_ptx(
                spec, compiler.parse_compute_capability(device.compute_capability))
            patched = self._folder / f"{path.stem}.{'pdl' if self._trigger else 'wait'}.ptx"
            patched.write_text(with_grid_dependency(path.read_text(), self._trigger))
            with device:
                kernel = self._kernels[spec] = compiler.load_kernel(patched, entry, device)
        return self._backend.driver_handle(kernel)


def _programs(backend, problem, folder: Path) -> dict:
    """``{(pass, mode): (Program, PDL launches)}`` of the modes this problem has."""

    def plain(spec):
        return backend.driver_handle(backend.kernel(spec))

    def table(values):
        return backend.table(values).data.ptr

    def program(backward, function_of):
        return record(problem, backward, backend.shared_limit, backend.max_slots,
                      function_of, table)

    out = {}
    for name, backward in (("forward", False), ("backward", True)):
        out[(name, "plain")] = program(backward, plain), False
        out[(name, "pdl")] = program(backward, PdlKernels(backend, folder)), True
        out[(name, "pdl wait")] = program(backward, PdlKernels(backend, folder, False)), True
    return out


def _poison(a, storage):
    a.fill(0x7FC0 if storage == "bfloat16" else float("nan"))  # bfloat16: raw NaN bits


def bench_stage(stage, storage, backend, launcher=None, folder=None):
    """One stage's row: times (ms, one median a round) of each pass in each mode, the
    modes alternating round by round, and whether each gives ``plain``'s bits."""
    import cupy

    from dx_forward_bench import stage_inputs
    from wtconv_cuda import gpu
    from wtconv_cuda._bench.core import CupyEventTimer, time_median

    problem, weights, sets = stage_inputs(stage, storage)
    launcher = launcher or PdlLauncher()
    programs = _programs(backend, problem, folder or Path(tempfile.mkdtemp(prefix="pdl_ptx_")))
    row = dict(shape=list(stage[:4]), levels=stage[4], storage=storage)
    plain_launch = driver._cu_launch_kernel
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for name in ("forward", "backward"):
            modes = [mode for (pass_, mode) in programs if pass_ == name]
            out = cupy.empty_like(sets[0][0])  # y, or dx
            grads = [cupy.empty_like(a) for a in weights]
            written = [out] + (grads if name == "backward" else [])
            outputs = {}
            for _ in range(ROUNDS):
                for mode in modes:
                    program, pdl = programs[(name, mode)]

                    def call(x, dy, program=program, backward=name == "backward"):
                        arrays = (x, dy, out, *weights, *grads) if backward else (x, out, *weights)
                        program.run([a.data.ptr for a in arrays], gpu._allocate, stream.ptr)

                    driver._cu_launch_kernel = launcher if pdl else plain_launch
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
            for mode in modes[1:]:
                row[f"{name} {mode} same bits"] = all(
                    bool(cupy.array_equal(a, b)) for a, b in zip(outputs["plain"], outputs[mode]))
    return row


def describe(row):
    parts = []
    for key, times in row.items():
        if key.endswith(" ms"):
            mode = key[:-3]
            same = row.get(f"{mode} same bits", True)
            parts.append(f"{mode} {min(times):.4f}{'' if same else ' (OTHER BITS)'}")
    return "  ".join(parts) + " (ms, least of the rounds' medians)"


def main(argv=None):
    from dx_forward_bench import stage_cli

    stage_cli(__doc__.splitlines()[0], STAGES, bench_stage, describe, argv)


if __name__ == "__main__":
    main()
