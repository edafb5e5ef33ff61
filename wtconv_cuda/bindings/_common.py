"""Framework-neutral pieces shared by the bindings.

* :func:`check_layer` validates the shapes of one call from plain shape tuples,
  so that every binding raises the same errors (it also works on PyTorch's
  symbolic sizes while tracing).
* :class:`PointerLauncher` is a *backend* for
  :func:`wtconv_cuda.kernels.launch.run_forward` /
  :func:`~wtconv_cuda.kernels.launch.run_backward` that launches the compiled
  kernels with raw device pointers, on a stream chosen by the caller, and takes
  its float32 work buffers from a caller-supplied allocator. The kernel
  variants and the device limits come from one
  :class:`~wtconv_cuda.kernels.launch.CupyBackend` per device, so every
  binding plans exactly the launches :mod:`wtconv_cuda.gpu` plans (and gets
  bit-identical results).

Nothing here imports CuPy, PyTorch or JAX at module level.
"""

from __future__ import annotations

import threading
from typing import Callable, NamedTuple

import numpy as np

from ..kernels.driver import DeviceScope, driver_launch
from ..kernels.launch import ITEMSIZE
from ..kernels.program import record

__all__ = [
    "WAVELETS",
    "LayerSizes",
    "check_layer",
    "out_hw",
    "DeviceKernels",
    "device_kernels",
    "stream_handle",
    "PointerLauncher",
    "DeviceScope",
    "driver_launch",
]

#: Wavelet names accepted by the layers: the Haar wavelet under both of
#: PyWavelets' names.
WAVELETS = ("db1", "haar")


class LayerSizes(NamedTuple):
    """Sizes of one checked call.

    Attributes
    ----------
    batch, channels, height, width : int
        ``B, C, H, W`` of the input.
    kernel_size : int
        Odd ``K``.
    levels : int
        Wavelet levels ``L``.
    """

    batch: int
    channels: int
    height: int
    width: int
    kernel_size: int
    levels: int


def out_hw(height, width, stride):
    """Output grid of the operator.

    Parameters
    ----------
    height, width : int
        Input grid (plain or symbolic ints).
    stride : int
        Subsampling factor ``>= 1``.

    Returns
    -------
    tuple
        ``(ceil(height / stride), ceil(width / stride))``.
    """
    return (height + stride - 1) // stride, (width + stride - 1) // stride


def _shape_error(name: str, expected: str, got) -> ValueError:
    return ValueError(f"{name} must have shape {expected}, got {tuple(got)}")


def check_layer(x_shape, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale,
                levels, stride) -> LayerSizes:
    """Check the shapes of one call in the :class:`~wtconv_cuda.WTConvWeights` layouts.

    Parameters
    ----------
    x_shape : sequence of int
        Shape of the input, expected ``(B, C, H, W)`` with ``H, W >= 1``.
    base_weight : sequence of int
        Expected ``(C, K, K)`` with an odd ``K``.
    base_bias : sequence of int or None
        Shape ``(C,)``, or ``None`` for a layer without bias.
    base_scale : sequence of int
        Expected ``(C,)``.
    wavelet_weight : sequence of int
        Expected ``(L, C, 4, K, K)``.
    wavelet_scale : sequence of int
        Expected ``(L, C, 4)``.
    levels : int or None
        ``None`` takes ``L`` from ``wavelet_weight``; an int must equal it.
    stride : int
        Expected ``>= 1``.

    Returns
    -------
    LayerSizes
        The sizes of the call, ``levels`` resolved.

    Raises
    ------
    TypeError
        ``levels`` or ``stride`` is not an int.
    ValueError
        Any shape is inconsistent, ``K`` is even, ``levels`` does not match
        the weights, ``stride < 1``.
    """
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)):
        raise TypeError(f"stride must be an int, got {type(stride).__name__}")
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if len(x_shape) != 4:
        raise ValueError(f"x must be 4-D (B, C, H, W), got shape {tuple(x_shape)}")
    b, c, h, w = x_shape
    if h < 1 or w < 1:
        raise ValueError(f"x must have non-zero height and width, got shape {tuple(x_shape)}")
    if len(base_weight) != 3 or base_weight[1] != base_weight[2]:
        raise _shape_error("base_weight", "(C, K, K)", base_weight)
    k = base_weight[1]
    if k % 2 == 0:
        raise ValueError(f"kernel size K must be odd, got K = {k} from base_weight")
    if base_weight[0] != c:
        raise ValueError(
            f"the weights have C = {base_weight[0]} channels (base_weight.shape[0]) but x has "
            f"{c} channels (x.shape[1])"
        )
    if base_bias is not None and tuple(base_bias) != (c,):
        raise _shape_error("base_bias", f"(C,) = ({c},)", base_bias)
    if tuple(base_scale) != (c,):
        raise _shape_error("base_scale", f"(C,) = ({c},)", base_scale)
    if len(wavelet_weight) != 5:
        raise _shape_error("wavelet_weight", "(L, C, 4, K, K)", wavelet_weight)
    n_levels = wavelet_weight[0]
    if tuple(wavelet_weight[1:]) != (c, 4, k, k):
        raise _shape_error("wavelet_weight", f"(L, C, 4, K, K) = (L, {c}, 4, {k}, {k})",
                           wavelet_weight)
    if tuple(wavelet_scale) != (n_levels, c, 4):
        raise _shape_error("wavelet_scale", f"(L, C, 4) = ({n_levels}, {c}, 4)", wavelet_scale)
    if levels is not None:
        if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)):
            raise TypeError(f"levels must be an int or None, got {type(levels).__name__}")
        if levels != n_levels:
            raise ValueError(
                f"levels = {levels} but the weights hold {n_levels} wavelet levels "
                "(wavelet_weight.shape[0])"
            )
    return LayerSizes(b, c, h, w, k, n_levels)


# ---------------------------------------------------------------------------
# Raw-pointer launches
# ---------------------------------------------------------------------------


class DeviceKernels:
    """Kernel variants, launch limits and geometry tables of one GPU.

    One instance per device (see :func:`device_kernels`); shared by every
    binding and thread. Tables are small read-only int64 arrays, created once
    per distinct value and kept for the life of the process.

    Parameters
    ----------
    device_id : int
        CUDA device ordinal.
    backend : object, optional
        Source of ``shared_limit``, ``max_slots`` and ``kernel(spec)``;
        default a new :class:`~wtconv_cuda.kernels.launch.CupyBackend` of
        ``device_id`` (tests pass a stand-in).

    Attributes
    ----------
    device_id : int
    shared_limit : int
        Bytes of shared memory a block may use (from the kernels' backend).
    max_slots : int
        Persistent blocks of the global-scratch kernel variant.
    """

    def __init__(self, device_id: int, backend=None):
        if backend is None:
            from ..kernels.launch import CupyBackend

            backend = CupyBackend(int(device_id))
        self.device_id = int(device_id)
        self._backend = backend
        self.shared_limit = self._backend.shared_limit
        self.max_slots = self._backend.max_slots
        self._tables: dict = {}
        self._handles: dict = {}
        self._programs: dict = {}
        self._lock = threading.Lock()

    def kernel(self, spec):
        """The loaded kernel of ``spec`` on this device (compiled on first use)."""
        return self._backend.kernel(spec)

    def driver_handle(self, kernel):
        """The ``CUfunction`` of ``kernel`` as an int, or None to launch through ``kernel``.

        Asked of the backend once per kernel (``backend.driver_handle(kernel)``;
        a backend without that method, such as a test stand-in, gets None).
        """
        handle = self._handles.get(kernel, self)
        if handle is self:
            query = getattr(self._backend, "driver_handle", None)
            handle = self._handles[kernel] = None if query is None else query(kernel)
        return handle

    def table(self, values: np.ndarray, make: Callable):
        """Device pointer of a table holding ``values``.

        Parameters
        ----------
        values : numpy.ndarray
            int64 table values.
        make : callable
            ``make(values) -> (owner, pointer)`` creates the device copy on a
            miss; ``owner`` keeps the memory alive, and the copy must be
            complete (host-synchronised) when ``make`` returns, because the
            table may next be read on any stream.

        Returns
        -------
        numpy.uint64
            The table's device address.
        """
        key = values.tobytes()
        entry = self._tables.get(key)
        if entry is None:
            with self._lock:
                entry = self._tables.get(key)
                if entry is None:
                    owner, pointer = make(values)
                    entry = self._tables[key] = (owner, np.uint64(pointer))
        return entry[1]

    def program(self, problem, backward: bool, make_table: Callable):
        """The recorded launches of one call on this device, or None.

        See :mod:`wtconv_cuda.kernels.program`. The first call for a problem
        compiles or loads its kernels and makes its tables (with ``make``,
        as for :meth:`table`).

        Parameters
        ----------
        problem : wtconv_cuda.kernels.launch.Problem
            The layer call.
        backward : bool
            The backward instead of the forward.
        make_table : callable
            As ``make`` for :meth:`table`.

        Returns
        -------
        wtconv_cuda.kernels.program.Program or None
            None where a kernel has no driver handle: launch through a
            :class:`PointerLauncher` then.
        """
        key = (problem, backward)
        program = self._programs.get(key, self)
        if program is self:
            program = record(problem, backward, self.shared_limit, self.max_slots,
                             lambda spec: self.driver_handle(self.kernel(spec)),
                             lambda values: int(self.table(values, make_table)))
            if len(self._programs) >= _MAX_PROGRAMS:
                self._programs.clear()
            self._programs[key] = program
        return program


#: Recorded programs kept per device (all are dropped when it fills).
_MAX_PROGRAMS = 1024
_devices: dict = {}
_devices_lock = threading.Lock()


def device_kernels(device_id: int) -> DeviceKernels:
    """The process-wide :class:`DeviceKernels` of ``device_id`` (created on first use).

    Parameters
    ----------
    device_id : int
        CUDA device ordinal.

    Returns
    -------
    DeviceKernels
        Shared by all callers for that device.
    """
    state = _devices.get(device_id)
    if state is None:
        with _devices_lock:
            state = _devices.get(device_id)
            if state is None:
                state = _devices[device_id] = DeviceKernels(device_id)
    return state


_streams: dict = {}
_MAX_STREAMS = 4096


def stream_handle(device_id: int, pointer: int):
    """A cached :class:`cupy.cuda.ExternalStream` wrapping a foreign stream handle.

    The object only carries the handle (it does not own the stream); it is
    passed to the kernel launch as its stream.

    Parameters
    ----------
    device_id : int
        Device the stream belongs to.
    pointer : int
        ``cudaStream_t`` as an int (``0`` is the legacy default stream).

    Returns
    -------
    cupy.cuda.ExternalStream
        A handle on ``pointer``; the same object for the same arguments.
    """
    key = (device_id, pointer)
    stream = _streams.get(key)
    if stream is None:
        import cupy

        if len(_streams) >= _MAX_STREAMS:
            _streams.clear()
        try:
            stream = cupy.cuda.ExternalStream(pointer, device_id)
        except TypeError:  # CuPy without the device argument
            stream = cupy.cuda.ExternalStream(pointer)
        _streams[key] = stream
    return stream


class PointerLauncher:
    """A launch backend for one call: raw pointers, a given stream, a given allocator.

    It implements the backend interface that
    :func:`~wtconv_cuda.kernels.launch.run_forward` and
    :func:`~wtconv_cuda.kernels.launch.run_backward` use (``shared_limit``,
    ``max_slots``, ``kernel``, ``call``, ``table``, ``float32``). Arrays are
    passed to those functions as ``numpy.uint64`` device addresses. Create one
    per call (it is cheap): it keeps the call's work buffers alive until it is
    dropped, which must be after the launches were queued. Work buffers freed
    then are reused by stream-ordered allocators (PyTorch, CuPy, XLA) only
    after the queued kernels on the same stream.

    Parameters
    ----------
    device : DeviceKernels
        Kernels of the device that holds every array.
    stream : object with a ``ptr`` attribute
        The stream to launch on (e.g. from :func:`stream_handle`).
    allocate : callable
        ``allocate(n) -> (owner, pointer)``: ``n`` float32 elements of device
        memory usable on ``stream``.
    make_table : callable
        ``make_table(values) -> (owner, pointer)``, see
        :meth:`DeviceKernels.table`.
    """

    simulate = False
    __slots__ = ("_device", "_stream", "_allocate", "_make_table", "keep", "_pointers",
                 "shared_limit", "max_slots")

    def __init__(self, device: DeviceKernels, stream, allocate: Callable, make_table: Callable):
        self._device = device
        self._stream = stream
        self._allocate = allocate
        self._make_table = make_table
        self.keep: list = []
        self._pointers: list = []
        self.shared_limit = device.shared_limit
        self.max_slots = device.max_slots

    def kernel(self, spec):
        """The compiled kernel of ``spec`` on this launcher's device."""
        return self._device.kernel(spec)

    def call(self, kernel, grid, block, args, shared_bytes):
        """Queue one launch on this launcher's stream.

        Kernels with a driver handle (:meth:`DeviceKernels.driver_handle`)
        go straight to ``cuLaunchKernel`` (:func:`driver_launch`); others are
        called as ``kernel(grid, block, args, shared_mem=, stream=)``.

        Parameters
        ----------
        kernel : cupy.RawKernel
        grid, block : int
            One-dimensional grid and block sizes.
        args : tuple
            Kernel arguments: ``numpy.uint64`` device addresses and
            non-negative ``numpy.int64`` sizes, all 8-byte parameters.
        shared_bytes : int
            Dynamic shared memory per block.
        """
        handle = self._device.driver_handle(kernel)
        if handle is None:
            kernel((grid,), (block,), args, shared_mem=shared_bytes, stream=self._stream)
        else:
            driver_launch(handle, grid, block, shared_bytes, self._stream.ptr, args)

    def table(self, values: np.ndarray):
        """Device address of a cached copy of the int64 table ``values``."""
        return self._device.table(values, self._make_table)

    def float32(self, n: int):
        """Device address of ``max(n, 1)`` float32 work elements, kept alive by this launcher."""
        owner, pointer = self._allocate(max(int(n), 1))
        self.keep.append(owner)
        self._pointers.append(int(pointer))
        return np.uint64(pointer)

    def entries(self, array, start: int, count: int, storage: str):
        """Device address of element ``start`` of a layer array of ``storage`` type."""
        return np.uint64(int(array) + ITEMSIZE[storage] * int(start))

    def view(self, buffer, start: int, count: int):
        """Device address of element ``start`` of a work buffer from :meth:`float32`."""
        return np.uint64(int(buffer) + 4 * int(start))

    def typed_view(self, buffer, start: int, count: int, storage: str):
        """Device address of element ``start`` of a work buffer, to be read as ``count``
        elements of ``storage`` type (the address does not depend on the type)."""
        return self.view(buffer, start, count)

    def release(self, buffer) -> None:
        """Drop this launcher's hold on a work buffer from :meth:`float32` (its memory may
        then serve later allocations on this launcher's stream, after the launches
        already queued)."""
        pointer = int(buffer)
        for i, owner_pointer in enumerate(self._pointers):
            if owner_pointer == pointer:
                del self.keep[i], self._pointers[i]
                return
