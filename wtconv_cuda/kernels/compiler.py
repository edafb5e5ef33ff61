"""Compile generated kernels once, cache them on disk, launch them cheaply.

Numba's dispatcher re-inspects every argument on every launch (about 100 us
for a handful of arrays). Here a kernel is compiled ahead of use with
``numba.cuda.compile_ptx`` for raw-pointer arguments, the PTX is cached on disk
(keyed by source, signature, architecture and toolchain versions) and loaded
into a CuPy ``RawKernel``; a launch is then one driver call with a tuple of
pointers and integers.

Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the same generated source
is wrapped with ``cuda.jit`` instead, and launched on NumPy arrays.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from pathlib import Path

from . import coarse, codegen, flip, lanes, registers, tiles

#: Bump when the kernel ABI or generated code changes in a way the source
#: hash alone would not capture.
ABI_VERSION = 1

_lock = threading.Lock()
_loaded: dict = {}


class CompileError(RuntimeError):
    """A kernel variant could not be compiled or loaded."""


def simulator_enabled() -> bool:
    """Whether numba runs kernels in its CUDA simulator.

    Returns
    -------
    bool
        ``True`` when ``NUMBA_ENABLE_CUDASIM`` is ``"1"`` in the environment
        (it takes effect only if set before numba is imported).
    """
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


def cache_dir() -> Path:
    """Folder of cached PTX (``$WTCONV_CUDA_CACHE`` or ``~/.cache/wtconv_cuda``).

    Returns
    -------
    pathlib.Path
        ``$WTCONV_CUDA_CACHE`` if set and non-empty, else
        ``$XDG_CACHE_HOME/wtconv_cuda`` (``~/.cache/wtconv_cuda`` when
        ``XDG_CACHE_HOME`` is unset). The folder is not created here.
    """
    root = os.environ.get("WTCONV_CUDA_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "wtconv_cuda"


def _storage_type(storage: str):
    from . import _numba_compat  # noqa: F401  (the NumPy shim must precede numba)
    from numba import types
    return {"float32": types.float32, "float16": types.float16,
            "bfloat16": types.uint16}[storage]


def plane_signature(storage: str, fused_finalize: bool = False) -> tuple:
    """Argument types of ``wtconv_plane``: raw pointers, then the header scalars.

    Parameters
    ----------
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (passed as ``uint16``).
    fused_finalize : bool, default False
        A backward variant that writes the parameter gradients itself
        (:class:`~wtconv_cuda.kernels.codegen.PlaneSpec`): five more pointers
        to the storage type, ``gw0, gb0, gs0, gww, gws``, after ``geo``.

    Returns
    -------
    tuple of numba types
        Pointers to the storage type for ``src, out, xsrc, w0, b0, s0, ww,
        ws``, to float32 for ``part, scratch`` and to int64 for ``geo``, the
        gradient pointers of a fused variant, then one int64 per header field
        (:data:`wtconv_cuda.kernels.layout.HEADER_FIELDS`).

    Raises
    ------
    KeyError
        ``storage`` is not one of the three names above.
    """
    from numba import types
    st = types.CPointer(_storage_type(storage))
    f32 = types.CPointer(types.float32)
    i64 = types.CPointer(types.int64)
    from .layout import HEADER_FIELDS
    #       src out xsrc w0  b0  s0  ww  ws  part scratch geo
    grads = (st,) * 5 if fused_finalize else ()
    return ((st, st, st, st, st, st, st, st, f32, f32, i64) + grads
            + (types.int64,) * len(HEADER_FIELDS))


def finalize_signature(storage: str) -> tuple:
    """Argument types of ``wtconv_finalize`` (all raw pointers).

    Parameters
    ----------
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (passed as ``uint16``).

    Returns
    -------
    tuple of numba types
        A float32 pointer for ``part``, ten pointers to the storage type for
        the five weights and the five gradients, and an int64 pointer for
        ``dims``.

    Raises
    ------
    KeyError
        ``storage`` is not one of the three names above.
    """
    from numba import types
    st = types.CPointer(_storage_type(storage))
    #       part                            w0..ws (5)  grads (5)  dims
    return (types.CPointer(types.float32),) + (st,) * 10 + (types.CPointer(types.int64),)


def tile_signature(storage: str, backward: bool = False, with_coarse: bool = False) -> tuple:
    """Argument types of ``wtconv_tile`` (see :mod:`wtconv_cuda.kernels.tiles`).

    Parameters
    ----------
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (passed as ``uint16``).
    backward : bool, default False
        The backward variant's arguments instead.
    with_coarse : bool, default False
        A variant fed by a coarse pre-pass (``TileSpec.coarse``): a float32
        pointer ``coarse`` and int64 ``Hc, Wc`` at the end.

    Returns
    -------
    tuple of numba types
        Forward: pointers to the storage type for ``x, y, w0, b0, s0, ww,
        ws``, then int64 ``H, W, C, has_bias, tiles_x, ntiles``. Backward:
        pointers to the storage type for ``dy, dx, x, w0, b0, s0, ww, ws``
        (named ``grad_out, grad_in, x, ...`` in the kernel), a
        float32 pointer for ``part``, then int64 ``H, W, C, has_bias,
        tiles_x, ntiles, B``.

    Raises
    ------
    KeyError
        ``storage`` is not one of the three names above.
    """
    from numba import types
    st = types.CPointer(_storage_type(storage))
    extra = (types.CPointer(types.float32), types.int64, types.int64) if with_coarse else ()
    if backward:
        return (st,) * 8 + (types.CPointer(types.float32),) + (types.int64,) * 7 + extra
    return (st,) * 7 + (types.int64,) * 6 + extra


def coarse_in_signature(storage: str, pooled: int = 1) -> tuple:
    """Argument types of ``wtconv_coarse_in`` (see :mod:`wtconv_cuda.kernels.coarse`).

    Parameters
    ----------
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (passed as ``uint16``).
    pooled : int, default 1
        Arrays pooled (1: ``x``; 2: ``x`` and ``dy``).

    Returns
    -------
    tuple of numba types
        Pointers to the storage type for the pooled arrays, ``ww`` and
        ``ws``, float32 pointers for ``pooled`` and ``keep``, then eight int64
        scalars.
    """
    from numba import types
    st = types.CPointer(_storage_type(storage))
    return (st,) * (pooled + 2) + (types.CPointer(types.float32),) * 2 + (types.int64,) * 8


def coarse_out_signature(storage: str) -> tuple:
    """Argument types of ``wtconv_coarse_out`` (see :mod:`wtconv_cuda.kernels.coarse`).

    Parameters
    ----------
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (passed as ``uint16``).

    Returns
    -------
    tuple of numba types
        A float32 pointer for ``grads``, pointers to the storage type for
        ``gww`` and ``gws``, then six int64 scalars.
    """
    from numba import types
    st = types.CPointer(_storage_type(storage))
    return (types.CPointer(types.float32), st, st) + (types.int64,) * 6


def partial_sum_signature() -> tuple:
    """Argument types of ``wtconv_partial_sum`` (see :mod:`wtconv_cuda.kernels.coarse`).

    Returns
    -------
    tuple of numba types
        Two float32 pointers (``part``, ``sums``), then four int64 scalars.
    """
    from numba import types
    return (types.CPointer(types.float32),) * 2 + (types.int64,) * 4


def register_signature(storage: str, backward: bool = False) -> tuple:
    """Argument types of ``wtconv_registers`` (see :mod:`wtconv_cuda.kernels.registers`).

    Parameters
    ----------
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (passed as ``uint16``).
    backward : bool, default False
        The backward variant's arguments instead.

    Returns
    -------
    tuple of numba types
        Forward: pointers to the storage type for ``x, y, w0, b0, s0, ww,
        ws``, then int64 ``B, C, has_bias``. Backward: pointers for ``dy, dx,
        x``, the five weights and the five gradients, then int64 ``B, C,
        has_bias``.
    """
    from numba import types
    st = types.CPointer(_storage_type(storage))
    return (st,) * (13 if backward else 7) + (types.int64,) * 3


def lane_signature(storage: str, forward: bool = False) -> tuple:
    """Argument types of ``wtconv_lanes`` and ``wtconv_lanes_forward`` (see
    :mod:`wtconv_cuda.kernels.lanes`).

    Parameters
    ----------
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (passed as ``uint16``).
    forward : bool, default False
        The forward kernel's arguments instead.

    Returns
    -------
    tuple of numba types
        ``wtconv_lanes``: pointers to the storage type for ``dy`` and ``x``, a
        float32 pointer for ``part``, then int64 ``B, C``. The forward:
        pointers to the storage type for ``x, y, w0, bias, s0, ww, ws``, then
        int64 ``B, C, has_bias``.
    """
    from numba import types
    st = types.CPointer(_storage_type(storage))
    if forward:
        return (st,) * 7 + (types.int64,) * 3
    return (st, st, types.CPointer(types.float32), types.int64, types.int64)


def flip_signature(storage: str) -> tuple:
    """Argument types of ``wtconv_flip`` (see :mod:`wtconv_cuda.kernels.flip`).

    Parameters
    ----------
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (passed as ``uint16``).

    Returns
    -------
    tuple of numba types
        Four pointers to the storage type (``w0, ww, f0, fw``), then int64
        ``n0, nw``.
    """
    from numba import types
    st = types.CPointer(_storage_type(storage))
    return (st,) * 4 + (types.int64,) * 2


def distinct(specs) -> list:
    """``specs`` without repeats, in first-seen order.

    Kernel specs are named tuples, and tuples of different types compare equal
    when their fields do (a ``FlipSpec`` with the fields of a
    ``FinalizeSpec`` once did), so repeats are found by type and value.

    Parameters
    ----------
    specs : iterable of kernel specs

    Returns
    -------
    list
        The first of each group of equal specs of one type.
    """
    return list({(type(spec), spec): spec for spec in specs}.values())


def spec_from_repr(text: str):
    """The kernel spec whose ``repr`` is ``text`` (any spec type :func:`compile_ptx` takes).

    Reports and caches name variants by ``repr``; this reads such a name back.

    Parameters
    ----------
    text : str
        E.g. ``"TileSpec(kernel_size=5, storage='float32', levels=1, tile=16)"``.

    Returns
    -------
    PlaneSpec, FinalizeSpec, TileSpec, CoarseSpec, CoarseOutSpec, PartialSumSpec,
    RegisterSpec, FlipSpec, LaneSpec or LaneForwardSpec
    """
    names = {cls.__name__: cls for cls in (
        codegen.PlaneSpec, codegen.FinalizeSpec, tiles.TileSpec, coarse.CoarseSpec,
        coarse.CoarseOutSpec, coarse.PartialSumSpec, registers.RegisterSpec, flip.FlipSpec,
        lanes.LaneSpec, lanes.LaneForwardSpec)}
    return eval(text, {"__builtins__": {}}, names)


def _source_for(spec) -> tuple[str, str, tuple]:
    if isinstance(spec, flip.FlipSpec):
        return flip.flip_kernel_source(spec), "wtconv_flip", flip_signature(spec.storage)
    if isinstance(spec, lanes.LaneSpec):
        return lanes.lane_kernel_source(spec), "wtconv_lanes", lane_signature(spec.storage)
    if isinstance(spec, lanes.LaneForwardSpec):
        return (lanes.lane_forward_source(spec), "wtconv_lanes_forward",
                lane_signature(spec.storage, forward=True))
    if isinstance(spec, registers.RegisterSpec):
        return (registers.register_kernel_source(spec), "wtconv_registers",
                register_signature(spec.storage, spec.backward))
    if isinstance(spec, tiles.TileSpec):
        return (tiles.tile_kernel_source(spec), "wtconv_tile",
                tile_signature(spec.storage, spec.backward, spec.coarse))
    if isinstance(spec, coarse.CoarseOutSpec):
        return (coarse.coarse_out_source(spec), "wtconv_coarse_out",
                coarse_out_signature(spec.storage))
    if isinstance(spec, coarse.PartialSumSpec):
        return (coarse.partial_sum_source(spec), "wtconv_partial_sum",
                partial_sum_signature())
    if isinstance(spec, coarse.CoarseSpec):
        return (coarse.coarse_in_source(spec), "wtconv_coarse_in",
                coarse_in_signature(spec.storage, spec.pooled))
    if isinstance(spec, codegen.PlaneSpec):
        source = codegen.plane_kernel_source(spec)  # validates the spec first
        return source, "wtconv_plane", plane_signature(spec.storage, spec.fused_finalize)
    if isinstance(spec, codegen.FinalizeSpec):
        return codegen.finalize_kernel_source(spec), "wtconv_finalize", finalize_signature(spec.storage)
    raise TypeError(f"unknown kernel spec {spec!r}")


def compile_ptx(spec, cc: tuple[int, int] = (9, 0)) -> tuple[str, str]:
    """Compile ``spec`` to PTX for compute capability ``cc``.

    The entry gets a ``.maxntid`` directive (the block size,
    :func:`block_threads`) and, when the spec's
    ``max_registers`` is non-zero, a ``.maxnreg`` one. Nothing is cached here
    (see :func:`cached_ptx`).

    Parameters
    ----------
    spec : PlaneSpec, TileSpec or FinalizeSpec
        The kernel variant.
    cc : tuple of int, optional
        Target ``(major, minor)``; default ``(9, 0)`` (Hopper).

    Returns
    -------
    ptx : str
        The PTX text.
    entry : str
        The mangled name of its kernel entry.

    Raises
    ------
    CompileError
        numba could not compile the generated source, or the PTX has no
        kernel entry.
    TypeError
        ``spec`` is not a `PlaneSpec`, `TileSpec` or `FinalizeSpec`.
    ValueError
        A `PlaneSpec` or `TileSpec` with an even kernel size, an unknown
        storage or a bad shape (see
        :func:`wtconv_cuda.kernels.codegen.plane_kernel_source` and
        :func:`wtconv_cuda.kernels.tiles.tile_kernel_source`).
    """
    from ._numba_compat import cuda
    source, name, signature = _source_for(spec)
    function = codegen.build(source, name)
    try:
        ptx, _ = cuda.compile_ptx(function, signature, cc=cc)
    except Exception as exc:  # numba raises a zoo of typing/lowering errors
        raise CompileError(f"compiling {spec!r} for sm_{cc[0]}{cc[1]} failed: {exc}") from exc
    ptx = _with_tuning_directives(ptx, block_threads(spec), getattr(spec, "max_registers", 0))
    return ptx, _entry_name(ptx)


def block_threads(spec) -> int:
    """Threads per block of every launch of ``spec``: the ``.maxntid`` its PTX gets.

    Parameters
    ----------
    spec : NamedTuple
        A kernel variant (`PlaneSpec`, `TileSpec`, ...).

    Returns
    -------
    int
        ``spec.threads`` times the planes a block runs side by side
        (``planes_per_block`` of a `PlaneSpec`, ``planes`` of a `TileSpec`); 0
        for a spec without ``threads`` (no directive).
    """
    return (getattr(spec, "threads", 0) * getattr(spec, "planes_per_block", 1)
            * getattr(spec, "planes", 1))


def _with_tuning_directives(ptx: str, threads: int, max_registers: int) -> str:
    """Add ``.maxntid`` (block size) and ``.maxnreg`` to the kernel entry.

    PTX places performance-tuning directives between an entry's parameter list
    and its body; numba has no option for them.
    """
    directives = []
    if threads:
        directives.append(f".maxntid {threads}, 1, 1")
    if max_registers:
        directives.append(f".maxnreg {max_registers}")
    if not directives:
        return ptx
    start = ptx.index(".entry")
    close = ptx.index(")", start)
    return ptx[:close + 1] + "\n" + "\n".join(directives) + ptx[close + 1:]


def _entry_name(ptx: str) -> str:
    for line in ptx.splitlines():
        line = line.strip()
        if line.startswith(".visible .entry") or line.startswith(".entry"):
            return line.split(".entry", 1)[1].strip().rstrip("(").strip()
    raise CompileError("no kernel entry in generated PTX")


def _cache_key(spec, cc) -> str:
    import numba
    try:
        from importlib.metadata import version
        numba_cuda = version("numba-cuda")
    except Exception:  # pragma: no cover - metadata missing in odd installs
        numba_cuda = "unknown"
    source, name, signature = _source_for(spec)
    text = "\n".join([str(ABI_VERSION), repr(spec), name, repr(signature), f"{cc}",
                      numba.__version__, numba_cuda, source])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_ptx(spec, cc: tuple[int, int]) -> tuple[Path, str]:
    """Path of ``spec``'s PTX for ``cc`` (compiled and written on first use) and its entry.

    The cache key hashes the ABI version, the spec, the generated source, the
    signature, ``cc`` and the numba and numba-cuda versions. Files are written
    atomically, so concurrent processes may share the folder. A cached file
    that does not declare its recorded entry (corrupted or truncated by
    something else) is compiled and written again.

    Parameters
    ----------
    spec : PlaneSpec, TileSpec or FinalizeSpec
        The kernel variant.
    cc : tuple of int
        Target ``(major, minor)``.

    Returns
    -------
    path : pathlib.Path
        The ``.ptx`` file in :func:`cache_dir`.
    entry : str
        The mangled name of its kernel entry.

    Raises
    ------
    CompileError
        The PTX was not cached and compiling it failed (see :func:`compile_ptx`).
    """
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    key = _cache_key(spec, cc)
    path = folder / f"{key}.ptx"
    entry_path = folder / f"{key}.entry"
    if path.exists() and entry_path.exists():
        entry = entry_path.read_text().strip()
        try:
            intact = bool(entry) and f".entry {entry}" in path.read_text(errors="replace")
        except OSError:
            intact = False
        if intact:
            return path, entry
    ptx, entry = compile_ptx(spec, cc)
    # Write atomically so concurrent processes never read a torn file.
    for target, text in ((path, ptx), (entry_path, entry)):
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, target)
    return path, entry


def parse_compute_capability(text: str) -> tuple[int, int]:
    """``(major, minor)`` of CuPy's compute-capability string.

    Parameters
    ----------
    text : str
        Major and minor digits run together, as CuPy reports them: ``"90"``
        for sm_90, ``"100"`` for sm_100, ``"120"`` for sm_120.

    Returns
    -------
    tuple of int
        ``(9, 0)``, ``(10, 0)``, ``(12, 0)``: the minor version is the last digit.
    """
    text = str(text)
    return int(text[:-1]), int(text[-1])


def gpu_kernel(spec, device_id: int):
    """A CuPy ``RawKernel`` for ``spec`` on device ``device_id`` (cached per process).

    The PTX comes from :func:`cached_ptx` for the device's compute capability.
    The kernel may use all the device's opt-in dynamic shared memory (less its
    static shared memory).

    Parameters
    ----------
    spec : PlaneSpec, TileSpec or FinalizeSpec
        The kernel variant.
    device_id : int
        CUDA device ordinal.

    Returns
    -------
    cupy.RawKernel
        The loaded kernel; launch it with raw pointers and integers.

    Raises
    ------
    CompileError
        The variant could not be compiled, or CuPy could not load it.
    """
    key = ("gpu", type(spec), spec, device_id)  # specs are tuples: equal across types
    kernel = _loaded.get(key)
    if kernel is not None:
        return kernel
    with _lock:
        kernel = _loaded.get(key)
        if kernel is None:
            import cupy
            with cupy.cuda.Device(device_id) as device:
                path, entry = cached_ptx(spec, parse_compute_capability(device.compute_capability))
                try:
                    kernel = load_kernel(path, entry, device)
                except Exception as exc:
                    raise CompileError(f"loading {spec!r} on device {device_id} failed: {exc}") from exc
            _loaded[key] = kernel
    return kernel


def load_kernel(path, entry: str, device):
    """Load entry ``entry`` of the PTX file ``path`` on ``device`` as a CuPy ``RawKernel``
    allowed all the device's opt-in dynamic shared memory (less its static shared memory).

    Parameters
    ----------
    path : str or pathlib.Path
        A PTX file.
    entry : str
        The mangled kernel name.
    device : cupy.cuda.Device
        The current device.

    Returns
    -------
    cupy.RawKernel
    """
    import cupy
    kernel = cupy.RawModule(path=str(path)).get_function(entry)
    optin = device.attributes["MaxSharedMemoryPerBlockOptin"]
    kernel.max_dynamic_shared_size_bytes = optin - kernel.attributes["shared_size_bytes"]
    return kernel


def sim_kernel(spec):
    """A simulator-dispatched kernel for ``spec`` (requires ``NUMBA_ENABLE_CUDASIM=1``).

    Parameters
    ----------
    spec : PlaneSpec, TileSpec or FinalizeSpec
        The kernel variant.

    Returns
    -------
    numba.cuda dispatcher
        The generated function wrapped with ``cuda.jit`` (cached per process);
        launch it as ``kernel[grid, block, 0, shared_bytes](*arrays)`` on
        NumPy arrays.

    Raises
    ------
    RuntimeError
        The simulator is not enabled (:func:`simulator_enabled` is false).
    """
    if not simulator_enabled():
        raise RuntimeError("sim_kernel needs NUMBA_ENABLE_CUDASIM=1 set before numba is imported")
    key = ("sim", type(spec), spec)
    kernel = _loaded.get(key)
    if kernel is None:
        from ._numba_compat import cuda
        source, name, _ = _source_for(spec)
        kernel = cuda.jit(codegen.build(source, name))
        _loaded[key] = kernel
    return kernel
