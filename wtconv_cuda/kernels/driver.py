"""Raw ``cuLaunchKernel`` launches of the compiled kernels.

CuPy's ``RawKernel`` call dispatches on the type of every argument, which
costs more host time (about 17 us for the plane kernel's 23 parameters on an
H200 host) than a fused kernel takes on a small problem. Every parameter of
the kernels of :mod:`wtconv_cuda.kernels` is 8 bytes wide (device addresses
and sizes), so :func:`driver_launch` hands the driver one packed array
instead. :class:`DeviceScope` makes sure the calling thread has the device's
context current, which ``cuLaunchKernel`` needs. :func:`side_stream` gives a
thread a second stream of a device, forked from and joined to the caller's
stream with events, for launches that may overlap (see
:mod:`wtconv_cuda.kernels.program`).

Nothing here imports CuPy at module level.
"""

from __future__ import annotations

import threading
from array import array

__all__ = ["DeviceScope", "SideStream", "driver_launch", "launch_packed", "side_stream"]


class DeviceScope:
    """Make ``device_id`` CuPy's (and the CUDA runtime's) current device for a block.

    The device is always set on entry, which also binds its primary context to
    the calling thread: ``cuLaunchKernel`` needs a current context, and a
    thread that has only asked for the current device (PyTorch's autograd
    threads skip ``cudaSetDevice`` when the device already matches) has none.
    The previous device is restored on exit when it differed. Kernel modules
    are loaded per device, and the launch picks the module of the current
    device.

    Parameters
    ----------
    device_id : int
        CUDA device ordinal.
    """

    __slots__ = ("_device_id", "_previous")

    def __init__(self, device_id: int):
        self._device_id = device_id
        self._previous = None

    def __enter__(self):
        runtime = _cuda_runtime()
        current = runtime.getDevice()
        if current != self._device_id:
            self._previous = current
        runtime.setDevice(self._device_id)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            _cuda_runtime().setDevice(self._previous)
            self._previous = None
        return False


_runtime = None


def _cuda_runtime():
    """``cupy.cuda.runtime``, imported on first use (a ``from`` import on every call
    costs about half a microsecond of host time)."""
    global _runtime
    if _runtime is None:
        from cupy.cuda import runtime

        _runtime = runtime
    return _runtime


def _cu_launch_kernel(*args):
    from cupy.cuda import driver

    global _cu_launch_kernel
    _cu_launch_kernel = driver.launchKernel
    return _cu_launch_kernel(*args)


def driver_launch(function: int, grid: int, block: int, shared_bytes: int, stream: int,
                  args) -> None:
    """Queue a 1-D launch with ``cuLaunchKernel``, every parameter 8 bytes wide.

    The kernels of :mod:`wtconv_cuda.kernels` take only 64-bit parameters
    (device addresses and sizes), so their parameter block is one array of
    unsigned 64-bit values plus the array of their addresses that
    ``cuLaunchKernel`` reads (and copies) before it returns. This skips
    CuPy's per-argument type dispatch, which costs more host time than the
    fused kernels themselves on small problems.

    Parameters
    ----------
    function : int
        ``CUfunction`` handle, loaded in the current device's context.
    grid, block : int
        One-dimensional grid and block sizes.
    shared_bytes : int
        Dynamic shared memory per block.
    stream : int
        ``CUstream`` handle (``0``: the legacy default stream).
    args : sequence of int-like
        Non-negative parameter values (``numpy.uint64``/``int64`` or int).

    Raises
    ------
    OverflowError
        A negative or wider-than-64-bit value.
    cupy.cuda.driver.CUDADriverError
        The launch was refused.
    """
    launch_packed(function, grid, block, shared_bytes, stream, array("Q", args))


def launch_packed(function: int, grid: int, block: int, shared_bytes: int, stream: int,
                  values: array) -> None:
    """Queue a 1-D launch whose 8-byte parameters are already packed in ``values``.

    Parameters
    ----------
    function, grid, block, shared_bytes, stream : int
        As for :func:`driver_launch`.
    values : array.array of 'Q'
        The parameters, in order; read (and copied by the driver) before the
        call returns.
    """
    first = values.buffer_info()[0]
    params = array("Q", range(first, first + 8 * len(values), 8))
    _cu_launch_kernel(function, grid, 1, 1, block, 1, 1, shared_bytes, stream,
                      params.buffer_info()[0], 0)


class SideStream:
    """A non-blocking stream of the current device and two events, to fork and join it.

    :meth:`fork` makes the side stream wait for the work queued so far on a
    main stream; :meth:`join` makes the main stream wait for the work queued
    so far on the side stream. Both are event records and waits, so they are
    legal inside CUDA-graph stream capture (the side stream then joins the
    capture). The stream is non-blocking: it does not synchronise with the
    legacy default stream, which is often the main one. One object serves one
    host thread (see :func:`side_stream`): its events are re-recorded by every
    fork and join.
    """

    __slots__ = ("handle", "_stream", "_forked", "_joined", "_runtime")

    def __init__(self):
        import cupy

        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._forked = cupy.cuda.Event(block=False, disable_timing=True)
        self._joined = cupy.cuda.Event(block=False, disable_timing=True)
        self._runtime = _cuda_runtime()
        #: ``CUstream`` handle of the side stream.
        self.handle = int(self._stream.ptr)

    def fork(self, main: int) -> None:
        """Make the side stream wait for everything queued on ``main`` so far.

        Parameters
        ----------
        main : int
            ``CUstream`` handle of the main stream (``0``: the legacy default).
        """
        event = self._forked.ptr
        self._runtime.eventRecord(event, main)
        self._runtime.streamWaitEvent(self.handle, event, 0)

    def join(self, main: int) -> None:
        """Make ``main`` wait for everything queued on the side stream so far.

        Parameters
        ----------
        main : int
            ``CUstream`` handle of the main stream.
        """
        event = self._joined.ptr
        self._runtime.eventRecord(event, self.handle)
        self._runtime.streamWaitEvent(main, event, 0)


_thread_state = threading.local()


def side_stream(device_id: int) -> SideStream:
    """The calling thread's :class:`SideStream` on ``device_id`` (made on first use).

    Per thread, because a fork records an event that the side stream then
    waits for: two threads sharing one could each wait on the other's event.
    Make it outside CUDA-graph capture (the first call of a problem, which
    records its program, does).

    Parameters
    ----------
    device_id : int
        CUDA device ordinal.

    Returns
    -------
    SideStream
    """
    streams = getattr(_thread_state, "side_streams", None)
    if streams is None:
        streams = _thread_state.side_streams = {}
    side = streams.get(device_id)
    if side is None:
        import cupy

        with cupy.cuda.Device(device_id):
            side = streams[device_id] = SideStream()
    return side
