"""GPU path of the public API: CuPy arrays in, CuPy arrays out.

:func:`wtconv_cuda.forward` and :func:`wtconv_cuda.backward` call these after
validating their arguments. Work is queued on CuPy's current stream of the
device that holds ``x``; outputs are allocated from CuPy's memory pool; no
call synchronises with the host. Each problem's launches are planned once and
then replayed with the call's addresses (:mod:`wtconv_cuda.kernels.program`).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ._validate import output_shape
from .kernels.driver import DeviceScope, side_stream
from .kernels.launch import CupyBackend, Problem, Weights
from .kernels.program import record, run_direct
from .weights import WTConvWeights

_backends: dict = {}
#: dtype -> storage name, filled on first use (``numpy.dtype(...).name`` costs
#: a few microseconds per call).
_STORAGE_OF: dict = {}


def storage_of(dtype) -> str:
    """Kernel storage name of a GPU dtype.

    Parameters
    ----------
    dtype : numpy.dtype-like
        ``float32``, ``float16`` or ``bfloat16`` (e.g. ``ml_dtypes.bfloat16``).

    Returns
    -------
    str
        ``"float32"``, ``"float16"`` or ``"bfloat16"``.

    Raises
    ------
    TypeError
        Any other dtype (float64 and integers included: the kernels compute
        in float32 and would silently lose float64 precision).
    """
    name = _STORAGE_OF.get(dtype)
    if name is not None:
        return name
    name = np.dtype(dtype).name
    if name in ("float32", "float16", "bfloat16"):
        _STORAGE_OF[dtype] = name
        return name
    raise TypeError(
        f"x has dtype {name}; the GPU kernels support float32, float16 and bfloat16 "
        "(use NumPy arrays for the float64 CPU path)"
    )


def _backend(device_id: int):
    backend = _backends.get(device_id)
    if backend is None:
        backend = _backends[device_id] = CupyBackend(device_id)
    return backend


@lru_cache(maxsize=1024)
def _program(device_id: int, problem: Problem, backward: bool):
    """The recorded launches of ``problem`` on a device (:mod:`wtconv_cuda.kernels.program`),
    or None where a kernel has no driver handle (the planner launches then). The first
    call for a problem compiles or loads its kernels and uploads its tables."""
    backend = _backend(device_id)
    return record(problem, backward, backend.shared_limit, backend.max_slots,
                  lambda spec: backend.driver_handle(backend.kernel(spec)),
                  lambda values: backend.table(values).data.ptr)


def _allocate(n: int):
    """A float32 work buffer from CuPy's pool on the current device, and its address."""
    import cupy
    buffer = cupy.empty(n, dtype=cupy.float32)
    return buffer, buffer.data.ptr


def _launch(device_id: int, problem: Problem, backward: bool, arrays: tuple) -> None:
    """Queue one call's launches on CuPy's current stream; ``arrays`` in the slot order
    of :func:`~wtconv_cuda.kernels.program.run_direct`."""
    import cupy
    program = _program(device_id, problem, backward)
    if program is None:
        run_direct(_backend(device_id), problem, backward, arrays)
    else:
        program.run([a.data.ptr for a in arrays], _allocate,
                    cupy.cuda.get_current_stream().ptr,
                    side_stream(device_id) if program.forks else None)


def _problem(x, w: WTConvWeights, levels: int, stride: int):
    b, c, h, width = x.shape
    return Problem(b, c, h, width, w.base_weight.shape[-1], levels, stride,
                   storage_of(x.dtype), w.base_bias is not None)


def _kernel_weights(w: WTConvWeights, cupy):
    arrays = [cupy.ascontiguousarray(a) for a in (w.base_weight, w.base_scale,
                                                 w.wavelet_weight, w.wavelet_scale)]
    base_weight, base_scale, wavelet_weight, wavelet_scale = arrays
    bias = base_scale if w.base_bias is None else cupy.ascontiguousarray(w.base_bias)
    return Weights(base_weight, bias, base_scale, wavelet_weight, wavelet_scale)


#: Byte offset between consecutive weight gradients in their one allocation (CuPy's
#: pool rounds its blocks to 512 bytes too).
GRADIENT_ALIGN = 512


def gradient_arrays(w: WTConvWeights, dtype, xp) -> WTConvWeights:
    """Uninitialised arrays for the weight gradients, on one allocation.

    One ``xp.cuda.alloc`` of the five gradients' bytes (each rounded up to
    :data:`GRADIENT_ALIGN`), and one ``xp.ndarray`` per gradient at its
    offset: no slicing or reshaping. On an H100 host this took 9.1-9.4 us,
    five ``cupy.empty`` calls 12.5-12.9 us and one allocation sliced and
    reshaped into five views 17.7 us, all in one process; the (1, 8, 16, 16)
    CuPy training step went from 57.0-59.1 to 54.8-55.8 us
    (``benchmarks/cupy_host_profile.py``,
    ``benchmarks/results/h100-2026-12-06f/alloc_ab/``).

    Parameters
    ----------
    w : WTConvWeights
        The weights (their shapes; ``base_bias`` may be None).
    dtype : numpy.dtype
        The gradients' dtype (on the GPU path, every weight's).
    xp : module
        ``cupy``: its ``cuda.alloc`` (bytes -> a memory pointer that supports
        ``+ offset``) and ``ndarray(shape, dtype, memptr)`` (tests pass a
        stand-in on NumPy).

    Returns
    -------
    WTConvWeights
        Contiguous C-order arrays of the weights' shapes and ``dtype``, none
        overlapping another; ``base_bias`` is None where ``w.base_bias`` is.
    """
    itemsize = dtype.itemsize
    spans = [0 if a is None else -(-a.size * itemsize // GRADIENT_ALIGN) * GRADIENT_ALIGN
             for a in w]
    memory = xp.cuda.alloc(sum(spans))
    arrays, offset = [], 0
    for a, span in zip(w, spans):
        arrays.append(None if a is None else xp.ndarray(a.shape, dtype, memory + offset))
        offset += span
    return WTConvWeights(*arrays)


def forward(x, w: WTConvWeights, levels: int, stride: int):
    """Fused forward on the GPU.

    Parameters
    ----------
    x : cupy.ndarray, shape (B, C, H, W), float32, float16 or bfloat16
        Non-contiguous inputs are copied to a contiguous buffer first.
    w : WTConvWeights
        CuPy arrays of ``x``'s dtype.
    levels : int
        Wavelet levels (already checked against ``w``).
    stride : int
        Output subsampling factor.

    Returns
    -------
    cupy.ndarray, shape (B, C, ceil(H/stride), ceil(W/stride)), x's dtype
        The layer output, on ``x``'s device.

    Raises
    ------
    TypeError
        ``x`` has an unsupported dtype, float64 included (see :func:`storage_of`).
    wtconv_cuda.kernels.compiler.CompileError
        The kernel variant could not be compiled or loaded on ``x``'s device.
    """
    import cupy
    problem = _problem(x, w, levels, stride)
    device_id = x.data.device_id  # x.device would build a Device object
    with DeviceScope(device_id):
        y = cupy.empty(output_shape(x.shape, stride), dtype=x.dtype)
        if x.shape[0] == 0:
            return y
        _launch(device_id, problem, False, (cupy.ascontiguousarray(x), y,
                                            *_kernel_weights(w, cupy)))
    return y


def backward(x, w: WTConvWeights, dy, levels: int, stride: int):
    """Fused backward on the GPU: ``dx`` and every parameter gradient.

    Parameters
    ----------
    x : cupy.ndarray, shape (B, C, H, W), float32, float16 or bfloat16
        The forward input. Non-contiguous ``x`` and ``dy`` are copied to
        contiguous buffers first.
    w : WTConvWeights
        CuPy arrays of ``x``'s dtype.
    dy : cupy.ndarray, shape (B, C, ceil(H/stride), ceil(W/stride)), x's dtype
        Gradient of the forward output.
    levels, stride : int
        As in :func:`forward`.

    Returns
    -------
    dx : cupy.ndarray, shape (B, C, H, W), x's dtype
        Gradient of ``x``.
    dw : WTConvWeights
        Gradients in the weights' layouts and dtype; ``base_bias`` is ``None``
        for a layer without bias. Weight gradients are summed over the batch
        in a fixed order: two calls on the same inputs agree bit for bit.

    Raises
    ------
    TypeError
        ``x`` has an unsupported dtype, float64 included (see :func:`storage_of`).
    wtconv_cuda.kernels.compiler.CompileError
        A kernel variant (plane pass or finalize) could not be compiled or
        loaded on ``x``'s device.
    """
    import cupy
    problem = _problem(x, w, levels, stride)
    device_id = x.data.device_id  # x.device would build a Device object
    with DeviceScope(device_id):
        dx = cupy.empty(x.shape, dtype=x.dtype)
        grads = gradient_arrays(w, x.dtype, cupy)
        if x.shape[0] == 0:  # an empty batch contributes nothing to the weight gradients
            for grad in grads:
                if grad is not None:
                    grad.fill(0)
            return dx, grads
        weights = _kernel_weights(w, cupy)
        grad_bias = grads.base_bias if grads.base_bias is not None else grads.base_scale
        outs = Weights(grads.base_weight, grad_bias, grads.base_scale, grads.wavelet_weight,
                       grads.wavelet_scale)
        _launch(device_id, problem, True, (cupy.ascontiguousarray(x),
                                           cupy.ascontiguousarray(dy), dx, *weights, *outs))
    return dx, grads
