"""CuPy binding: the native GPU path, and DLPack helpers for any other producer.

:func:`forward` and :func:`backward` are thin wrappers over
:func:`wtconv_cuda.forward` / :func:`wtconv_cuda.backward` for CuPy arrays:
kernels run on CuPy's current stream of the device holding ``x``, outputs
come from CuPy's memory pool, nothing synchronises with the host.

:func:`forward_dlpack` and :func:`backward_dlpack` accept any object that
implements the DLPack protocol (``__dlpack__`` / ``__dlpack_device__``: PyTorch
tensors, JAX arrays, NumPy-compatible GPU arrays, CuPy arrays) and import them
zero-copy with :func:`cupy.from_dlpack`. CuPy asks the producer to make its
data ready on CuPy's current stream (the DLPack ``stream`` argument), so work
that the producer queued before the call is respected without a host
synchronisation; the kernels then run on CuPy's current stream. To run on a
producer's stream instead, make it CuPy's current stream, for example
``with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):``.
Results are CuPy arrays (hand them back with the producer's own
``from_dlpack``). Keep the producer's arrays alive until the queued work is
done, as with any cross-library stream sharing.

Importing this module does not import CuPy; the functions do.
"""

from __future__ import annotations

from .. import api
from ..weights import WTConvWeights

__all__ = ["forward", "backward", "forward_dlpack", "backward_dlpack", "Tape", "Saved"]

Tape = api.Tape
Saved = api.Saved


def _require_cupy(x, name="x"):
    import cupy

    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"{name} must be a cupy.ndarray, got {type(x).__module__}."
                        f"{type(x).__qualname__} (use forward_dlpack for other producers)")
    return cupy


def forward(x, w, levels=None, stride=1, tape=None):
    """Fused forward of CuPy arrays on the GPU.

    Parameters
    ----------
    x : cupy.ndarray, shape (B, C, H, W)
        Input: float32, float16 or bfloat16 (the GPU dtypes of
        :func:`wtconv_cuda.forward`).
    w : WTConvWeights
        CuPy arrays of ``x``'s dtype on ``x``'s device.
    levels : int or None, default None
        ``None`` takes ``L`` from the weights; an int must equal it.
    stride : int, default 1
        Output subsampling factor ``s >= 1``.
    tape : wtconv_cuda.Tape or None
        Records the call for :func:`backward` / ``tape.backward``.

    Returns
    -------
    cupy.ndarray, shape (B, C, ceil(H/s), ceil(W/s))
        ``x``'s dtype, allocated from CuPy's pool on ``x``'s device.

    Raises
    ------
    TypeError
        ``x`` is not a CuPy array; mismatched or unsupported dtypes.
    ValueError
        Inconsistent shapes (see :func:`wtconv_cuda.forward`).
    """
    cupy = _require_cupy(x)
    with cupy.cuda.Device(x.device.id):
        return api.forward(x, w, levels, stride, tape)


def backward(saved, dy):
    """Fused backward of a recorded CuPy forward call.

    Parameters
    ----------
    saved : wtconv_cuda.Saved
        ``tape.saved`` of a :func:`forward` call (or built by hand).
    dy : cupy.ndarray, shape (B, C, ceil(H/s), ceil(W/s))
        Gradient of the output, ``x``'s dtype.

    Returns
    -------
    dx : cupy.ndarray, shape (B, C, H, W)
        Gradient of ``x``.
    dw : WTConvWeights
        CuPy gradients in the weights' layouts; ``base_bias`` is None for a
        layer without bias.

    Raises
    ------
    TypeError, ValueError
        As for :func:`wtconv_cuda.backward`.
    """
    cupy = _require_cupy(saved.x, "saved.x")
    with cupy.cuda.Device(saved.x.device.id):
        return api.backward(saved, dy)


def _import(a, name):
    import cupy

    if isinstance(a, cupy.ndarray):
        return a
    if not hasattr(a, "__dlpack__"):
        raise TypeError(f"{name} must implement the DLPack protocol (__dlpack__), got "
                        f"{type(a).__module__}.{type(a).__qualname__}")
    return cupy.from_dlpack(a)


def _import_weights(w) -> WTConvWeights:
    if not isinstance(w, WTConvWeights):
        raise TypeError(f"w must be a WTConvWeights, got {type(w).__name__}")
    return WTConvWeights(*(None if a is None else _import(a, f"w.{name}")
                           for name, a in w._asdict().items()))


def forward_dlpack(x, w, levels=None, stride=1):
    """Forward of arrays from any DLPack producer, zero-copy.

    Parameters
    ----------
    x : object with ``__dlpack__``, shape (B, C, H, W)
        A GPU array (PyTorch, JAX, CuPy, ...) of float32, float16 or bfloat16.
    w : WTConvWeights
        DLPack producers (may differ from ``x``'s library) of ``x``'s dtype,
        on ``x``'s device.
    levels : int or None, default None
        ``None`` takes ``L`` from the weights; an int must equal it.
    stride : int, default 1
        Output subsampling factor ``s >= 1``.

    Returns
    -------
    cupy.ndarray, shape (B, C, ceil(H/s), ceil(W/s))
        Allocated from CuPy's pool; queued on CuPy's current stream.

    Raises
    ------
    TypeError
        An argument does not implement DLPack; dtype errors as for
        :func:`forward`.
    ValueError
        Shape errors as for :func:`forward`.
    BufferError
        The producer cannot export (for example a CPU array on a GPU-only
        path, or an unsupported dtype).
    """
    xc = _import(x, "x")
    with xc.device:
        return api.forward(xc, _import_weights(w), levels, stride)


def backward_dlpack(x, w, dy, levels=None, stride=1):
    """Backward of arrays from any DLPack producer, zero-copy.

    Parameters
    ----------
    x : object with ``__dlpack__``, shape (B, C, H, W)
        The forward input.
    w : WTConvWeights
        The forward weights (DLPack producers).
    dy : object with ``__dlpack__``, shape (B, C, ceil(H/s), ceil(W/s))
        Gradient of the output.
    levels : int or None, default None
        ``None`` takes ``L`` from the weights; an int must equal it.
    stride : int, default 1
        Output subsampling factor ``s >= 1``.

    Returns
    -------
    dx : cupy.ndarray, shape (B, C, H, W)
        Gradient of ``x``.
    dw : WTConvWeights
        CuPy gradients; ``base_bias`` is None for a layer without bias.

    Raises
    ------
    TypeError, ValueError, BufferError
        As for :func:`forward_dlpack`, and for a ``dy`` of the wrong shape.
    """
    xc = _import(x, "x")
    with xc.device:
        weights = _import_weights(w)
        levels = weights.levels if levels is None else levels
        return api.backward(api.Saved(xc, weights, levels, stride), _import(dy, "dy"))
