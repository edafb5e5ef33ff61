"""Framework-agnostic entry points: ``forward``, ``backward`` and ``Tape``.

Dispatch is by the array library of ``x``:

- NumPy arrays run on the CPU through the float64 oracle
  (:mod:`wtconv_cuda.reference`). Results are rounded once to ``x``'s dtype
  (gradients of weights to each weight's dtype). Weights and ``dy`` may have
  any supported float dtype: they are promoted to float64 like ``x``.
- CuPy arrays run on the GPU (:mod:`wtconv_cuda.gpu`, imported on first use).
  There ``x``, every weight array and ``dy`` must share one dtype.
- Anything else raises :class:`TypeError`; adapters for other frameworks live
  in :mod:`wtconv_cuda.bindings`.

Inputs are never written to.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _validate, reference
from ._arrays import array_library
from .weights import WTConvWeights

__all__ = ["Saved", "Tape", "forward", "backward"]


class Saved(NamedTuple):
    """What :func:`backward` needs from a forward call, and nothing more.

    The operator is linear in ``x`` and in the weights separately, so no
    intermediate result is kept: the input gradient needs only the weights
    and the weight gradients only ``x``. Fields are references, not copies:
    do not modify ``x`` or the weights in place before calling backward.

    Attributes
    ----------
    x : numpy.ndarray or cupy.ndarray, shape (B, C, H, W)
        The forward input.
    weights : WTConvWeights
        The forward weights.
    levels : int
        The resolved number of wavelet levels.
    stride : int
        The output subsampling factor.
    """

    x: Any
    weights: WTConvWeights
    levels: int
    stride: int


class Tape:
    """Records a forward call so that its backward can be run later.

    Pass a tape to :func:`forward`; it stores a :class:`Saved` record in
    :attr:`saved`. Recording into a tape that already holds a record replaces
    it: a tape always holds the most recent forward call. :meth:`backward`
    can be called any number of times on one record.

    Attributes
    ----------
    saved : Saved or None
        The recorded forward call, ``None`` until one is recorded.

    Examples
    --------
    >>> import numpy as np
    >>> import wtconv_cuda as wt
    >>> w = wt.init_weights(channels=3, kernel_size=3, levels=2, seed=0)
    >>> x = np.random.default_rng(0).standard_normal((2, 3, 8, 8))
    >>> tape = wt.Tape()
    >>> y = wt.forward(x, w, tape=tape)
    >>> tape
    Tape(recorded)
    >>> dx, dw = tape.backward(np.ones_like(y))
    >>> dx.shape == x.shape
    True
    """

    __slots__ = ("saved", "_checked", "_library")

    def __init__(self):
        self.saved = None
        # The record :func:`forward` made and checked, and its x's library; a
        # record assigned to ``saved`` by hand is checked again by :meth:`backward`.
        self._checked = self._library = None

    def _record(self, saved: Saved, library: str) -> None:
        self.saved = self._checked = saved
        self._library = library

    def __repr__(self):
        state = "empty" if self.saved is None else "recorded"
        return f"Tape({state})"

    def backward(self, dy):
        """Gradients of the recorded forward call; see :func:`wtconv_cuda.backward`.

        Parameters
        ----------
        dy : numpy.ndarray or cupy.ndarray, shape (B, C, ceil(H/s), ceil(W/s))
            Gradient of the recorded call's output, of ``x``'s library (on
            the GPU also of ``x``'s dtype).

        Returns
        -------
        dx : numpy.ndarray or cupy.ndarray, shape (B, C, H, W)
            Gradient of ``x``, in ``x``'s library and dtype.
        dw : WTConvWeights
            Gradient of every parameter, in its shape and dtype.

        Raises
        ------
        RuntimeError
            No forward call has been recorded into this tape.
        TypeError, ValueError
            ``dy`` is invalid, as in :func:`wtconv_cuda.backward`.
        """
        saved = self.saved
        if saved is None:
            raise RuntimeError("Tape.backward called before a forward call recorded into this tape")
        if saved is self._checked:  # forward checked these arguments: only dy is new
            return _backward(*saved, dy, self._library)
        return backward(saved, dy)


def _library_of_input(x) -> str:
    library = array_library(x)
    if library not in ("numpy", "cupy"):
        kind = type(x)
        raise TypeError(
            f"x must be a numpy.ndarray (CPU) or a cupy.ndarray (GPU), got "
            f"{kind.__module__}.{kind.__qualname__}"
        )
    return library


def _cast_gradients(dw: WTConvWeights, weights: WTConvWeights) -> WTConvWeights:
    return WTConvWeights(
        *(None if g is None else g.astype(w.dtype, copy=False) for g, w in zip(dw, weights))
    )


def forward(x, w, levels=None, stride=1, tape=None):
    """Apply the WTConv operator of SPEC.md.

    Parameters
    ----------
    x : numpy.ndarray or cupy.ndarray, shape (B, C, H, W)
        ``H, W >= 1``; ``B`` may be 0. NumPy (CPU): float16, bfloat16,
        float32 or float64. CuPy (GPU): float32, float16 or bfloat16
        (``ml_dtypes.bfloat16``, the dtype ``cupy.from_dlpack`` gives a
        bfloat16 tensor).
    w : WTConvWeights
        Arrays of ``x``'s library with ``C`` channels and an odd kernel size
        ``K``. On the CPU any of float16, bfloat16, float32 and float64; on
        the GPU ``x``'s dtype.
    levels : int or None, default None
        Number of wavelet levels. ``None`` means ``w.levels``; any other
        value must equal it.
    stride : int, default 1
        Output subsampling factor ``s >= 1``.
    tape : Tape or None, default None
        If given, records this call (replacing any earlier record).

    Returns
    -------
    y : numpy.ndarray or cupy.ndarray, shape (B, C, ceil(H/s), ceil(W/s))
        Same library and dtype as ``x``. The CPU path computes in float64 and
        rounds once; the GPU path accumulates in float32 and rounds once.

    Raises
    ------
    TypeError
        ``x`` neither a NumPy nor a CuPy array; weights not a
        :class:`WTConvWeights` or of another library; unsupported dtype
        (float64 on the GPU included); dtype mismatch on the GPU;
        ``levels``/``stride`` not an int; ``tape`` not a :class:`Tape`.
    ValueError
        ``x`` not 4-D; ``H`` or ``W`` zero; inconsistent weight shapes;
        even ``K``; channel mismatch; ``levels`` negative or not matching
        the weights; ``stride < 1``; (GPU) a weight on another device than
        ``x``.
    wtconv_cuda.kernels.compiler.CompileError
        GPU only: the kernel variant could not be compiled or loaded.

    See Also
    --------
    backward : the gradients of a recorded call.
    wtconv_cuda.reference.forward : the float64 oracle.

    Examples
    --------
    >>> import numpy as np
    >>> import wtconv_cuda as wt
    >>> w = wt.init_weights(channels=4, kernel_size=5, levels=2, seed=0)
    >>> x = np.ones((1, 4, 9, 12), dtype=np.float32)
    >>> wt.forward(x, w).shape
    (1, 4, 9, 12)
    >>> y = wt.forward(x, w, stride=2)
    >>> y.shape, y.dtype
    ((1, 4, 5, 6), dtype('float32'))
    """
    library = _library_of_input(x)
    if tape is not None and not isinstance(tape, Tape):
        raise TypeError(f"tape must be a Tape or None, got {type(tape).__name__}")
    on_gpu = library == "cupy"
    levels, stride = _validate.check_forward(x, w, levels, stride, same_dtype=on_gpu,
                                             library=library)
    if on_gpu:
        from . import gpu

        y = gpu.forward(x, w, levels, stride)
    else:
        y = reference.forward(x, w, levels, stride).astype(x.dtype, copy=False)
    if tape is not None:
        tape._record(Saved(x, w, levels, stride), library)
    return y


def backward(saved, dy):
    """Gradients of ``<forward(saved.x, saved.weights, ...), dy>``.

    Parameters
    ----------
    saved : Saved
        The forward call (``Tape.saved``, or built by hand).
    dy : numpy.ndarray or cupy.ndarray, shape (B, C, ceil(H/s), ceil(W/s))
        Gradient of the output, of ``x``'s library. On the CPU any of
        float16, bfloat16, float32 and float64; on the GPU ``x``'s dtype.

    Returns
    -------
    dx : numpy.ndarray or cupy.ndarray, shape (B, C, H, W)
        Gradient of ``x``, in ``x``'s library and dtype.
    dw : WTConvWeights
        Gradient of every parameter, each in its parameter's shape and
        dtype; ``dw.base_bias`` is ``None`` for a layer without bias. On the
        GPU the batch is summed in a fixed order: repeated calls return
        bitwise identical results; the gradients are views of one
        allocation there.

    Raises
    ------
    TypeError
        ``saved`` not a :class:`Saved`; ``dy`` of another library than ``x``,
        of an unsupported dtype, or (GPU) of another dtype than ``x``; and
        the errors of :func:`forward` for the saved fields.
    ValueError
        ``dy`` has the wrong shape or (GPU) is on another device than ``x``;
        and the errors of :func:`forward` for the saved fields.
    wtconv_cuda.kernels.compiler.CompileError
        GPU only: a kernel variant could not be compiled or loaded.

    See Also
    --------
    Tape.backward : the same, for the call recorded in a tape.

    Examples
    --------
    >>> import numpy as np
    >>> import wtconv_cuda as wt
    >>> w = wt.init_weights(channels=2, kernel_size=3, levels=1, seed=0)
    >>> x = np.zeros((1, 2, 6, 6), dtype=np.float32)
    >>> dx, dw = wt.backward(wt.Saved(x, w, levels=1, stride=2), np.ones((1, 2, 3, 3)))
    >>> dx.shape, dx.dtype, dw.wavelet_weight.shape
    ((1, 2, 6, 6), dtype('float32'), (1, 2, 4, 3, 3))
    """
    if not isinstance(saved, Saved):
        raise TypeError(f"saved must be a Saved record, got {type(saved).__name__}")
    x, weights, levels, stride = saved
    library = _library_of_input(x)
    levels, stride = _validate.check_forward(x, weights, levels, stride,
                                             same_dtype=library == "cupy", library=library)
    return _backward(x, weights, levels, stride, dy, library)


def _backward(x, weights, levels: int, stride: int, dy, library: str):
    """:func:`backward` of a record whose fields are checked and resolved, ``x`` of
    ``library``: checks ``dy`` and runs."""
    on_gpu = library == "cupy"
    _validate.check_dy(dy, x, stride, same_dtype=on_gpu, library=library)
    if on_gpu:
        from . import gpu

        return gpu.backward(x, weights, dy, levels, stride)
    dx, dw = reference.backward(x, weights, dy, levels, stride)
    return dx.astype(x.dtype, copy=False), _cast_gradients(dw, weights)
