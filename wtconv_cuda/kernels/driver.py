"""Raw ``cuLaunchKernel`` launches of the compiled kernels.

CuPy's ``RawKernel`` call dispatches on the type of every argument, which
costs more host time (about 17 us for the plane kernel's 23 parameters on an
H200 host) than a fused kernel takes on a small problem. Every parameter of
the kernels of :mod:`wtconv_cuda.kernels` is 8 bytes wide (device addresses
and sizes), so :func:`driver_launch` hands the driver one packed array
instead. :class:`DeviceScope` makes sure the calling thread has the device's
context current, which ``cuLaunchKernel`` needs.

Nothing here imports CuPy at module level.
"""

from __future__ import annotations

from array import array

__all__ = ["DeviceScope", "driver_launch", "launch_packed"]


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
