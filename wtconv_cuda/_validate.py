"""Input checks shared by the public entry points.

Every check raises with a message that names the argument and states what was
expected and what was found. Nothing here copies or modifies an array.
"""

from __future__ import annotations

import numbers

import numpy as np

from ._arrays import array_library
from .weights import SUPPORTED_DTYPES, WTConvWeights

__all__ = [
    "output_shape",
    "check_forward",
    "check_dy",
]


def output_shape(x_shape, stride: int) -> tuple[int, int, int, int]:
    """Shape of the operator's output for an input of shape ``x_shape``.

    Parameters
    ----------
    x_shape : tuple of int
        ``(B, C, H, W)``.
    stride : int
        Output subsampling factor, ``>= 1``.

    Returns
    -------
    tuple of int
        ``(B, C, ceil(H / stride), ceil(W / stride))``.
    """
    b, c, h, w = x_shape
    return (b, c, -(-h // stride), -(-w // stride))


def _check_library(name: str, arr, library: str) -> None:
    found = array_library(arr)
    if found != library:
        found_name = found if found is not None else type(arr).__name__
        raise TypeError(f"{name} must be a {library} array like x, got {found_name}")


def _device_id(arr):
    """CUDA device ordinal of a CuPy(-like) array, or None when it has none.

    A ``cupy.ndarray``'s memory pointer holds the ordinal
    (``arr.data.device_id``); ``arr.device`` builds a ``Device`` object on
    every access, which the per-call checks would pay once per array.
    """
    try:
        return arr.data.device_id
    except AttributeError:
        device = getattr(arr, "device", None)
        return getattr(device, "id", None)


def _check_same_device(name: str, arr, want) -> None:
    """CuPy arrays only: ``arr`` must live on x's GPU (the kernels read raw pointers).

    ``want`` is ``_device_id(x)``, looked up once per call by the caller.
    """
    found = _device_id(arr)
    if want is not None and found is not None and int(want) != int(found):
        raise ValueError(
            f"{name} is on CUDA device {found} but x is on CUDA device {want}; "
            "all arrays of one call must be on x's device"
        )


#: Dtypes that passed :func:`_check_dtype`: the supported ones, and each bfloat16
#: dtype once seen (``dtype.name`` costs microseconds; a set lookup does not).
_ACCEPTED_DTYPES = set(SUPPORTED_DTYPES)


def _check_dtype(name: str, arr) -> None:
    if arr.dtype in _ACCEPTED_DTYPES:
        return
    dtype = np.dtype(arr.dtype)
    if dtype not in SUPPORTED_DTYPES and dtype.name != "bfloat16":
        raise TypeError(f"{name} must have dtype float16, bfloat16, float32 or float64, "
                        f"got {dtype}")
    _ACCEPTED_DTYPES.add(dtype)


def _check_same_dtype(name: str, arr, x) -> None:
    if np.dtype(arr.dtype) != np.dtype(x.dtype):
        raise TypeError(
            f"{name} has dtype {np.dtype(arr.dtype)} but x has dtype "
            f"{np.dtype(x.dtype)}; on this path they must match"
        )


def _check_shape(name: str, arr, expected: tuple, meaning: str) -> None:
    shape = arr.shape
    if shape != expected and tuple(shape) != expected:  # tuple(): a list or torch.Size
        raise ValueError(f"{name} must have shape {meaning} = {expected}, got {tuple(arr.shape)}")


def _check_x(x) -> None:
    if x.ndim != 4:
        raise ValueError(
            f"x must be a 4-D array (B, C, H, W), got {x.ndim}-D shape {tuple(x.shape)}"
        )
    _check_dtype("x", x)
    if x.shape[2] == 0 or x.shape[3] == 0:
        raise ValueError(f"x must have non-zero height and width, got shape {tuple(x.shape)}")


def _check_weights(weights, x, library: str, same_dtype: bool) -> None:
    if not isinstance(weights, WTConvWeights):
        raise TypeError(f"weights must be a WTConvWeights, got {type(weights).__name__}")
    base, bias, scale, wavelet, wavelet_scale = weights
    if base is None or scale is None or wavelet is None or wavelet_scale is None:
        for name, arr in zip(WTConvWeights._fields, weights):
            if arr is None and name != "base_bias":
                raise TypeError(f"weights.{name} must be an array (only weights.base_bias "
                                "may be None), got None")
    # This runs on every call, so the common case costs a few attribute reads
    # per array: an array of x's own type is of x's library, one of x's dtype
    # has a supported dtype (x's was checked), and argument names are only
    # formatted for a message.
    x_type, x_dtype = type(x), x.dtype
    x_device = _device_id(x) if library == "cupy" else None
    for name, arr in zip(WTConvWeights._fields, weights):
        if arr is None:
            continue
        if type(arr) is not x_type:
            _check_library(f"weights.{name}", arr, library)
        if x_device is not None:
            found = _device_id(arr)
            if found is not None and found != x_device:
                _check_same_device(f"weights.{name}", arr, x_device)
        if same_dtype and arr.dtype == x_dtype:
            continue
        _check_dtype(f"weights.{name}", arr)
        if same_dtype:
            _check_same_dtype(f"weights.{name}", arr, x)

    if base.ndim != 3 or base.shape[1] != base.shape[2]:
        raise ValueError(
            "weights.base_weight must have shape (C, K, K), got " f"{tuple(base.shape)}"
        )
    c, k = base.shape[0], base.shape[1]
    if k % 2 == 0:
        raise ValueError(f"kernel size K must be odd, got K = {k} from weights.base_weight")
    if c != x.shape[1]:
        raise ValueError(
            f"weights have C = {c} channels (weights.base_weight.shape[0]) but x has "
            f"{x.shape[1]} channels (x.shape[1])"
        )
    if bias is not None:
        _check_shape("weights.base_bias", bias, (c,), "(C,)")
    _check_shape("weights.base_scale", scale, (c,), "(C,)")
    if wavelet.ndim != 5:
        raise ValueError(
            "weights.wavelet_weight must have shape (L, C, 4, K, K), got " f"{tuple(wavelet.shape)}"
        )
    levels = wavelet.shape[0]
    _check_shape("weights.wavelet_weight", wavelet, (levels, c, 4, k, k), "(L, C, 4, K, K)")
    _check_shape("weights.wavelet_scale", wavelet_scale, (levels, c, 4), "(L, C, 4)")


def _resolve_levels(levels, weights: WTConvWeights) -> int:
    stored = weights.wavelet_weight.shape[0]
    if levels is None:
        return stored
    if isinstance(levels, bool) or not isinstance(levels, numbers.Integral):
        raise TypeError(
            f"levels must be an int or None, got {type(levels).__name__} {levels!r}"
        )
    if levels < 0:
        raise ValueError(f"levels must be >= 0, got {levels}")
    if levels != stored:
        raise ValueError(
            f"levels = {levels} but the weights hold {stored} wavelet levels "
            "(weights.wavelet_weight.shape[0]); pass levels=None to use the weights' count"
        )
    return int(levels)


def _check_stride(stride) -> int:
    if type(stride) is int and stride >= 1:  # the common case, without the ABC check below
        return stride
    if isinstance(stride, bool) or not isinstance(stride, numbers.Integral):
        raise TypeError(f"stride must be an int, got {type(stride).__name__} {stride!r}")
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    return int(stride)


def check_forward(x, weights, levels, stride, *, same_dtype: bool,
                  library: str | None = None) -> tuple[int, int]:
    """Check the arguments of a forward call and resolve ``levels``.

    Parameters
    ----------
    x : array
        Input, expected ``(B, C, H, W)`` with ``H, W >= 1`` and a dtype in
        :data:`SUPPORTED_DTYPES`. ``B = 0`` is allowed.
    weights : WTConvWeights
        Expected to hold arrays of ``x``'s library with consistent shapes
        and an odd kernel size ``K``.
    levels : int or None
        ``None`` means ``len(weights.wavelet_weight)``; an int must equal it.
    stride : int
        Expected ``>= 1``.
    same_dtype : bool
        If true, every weight array must have ``x``'s dtype (the GPU path);
        otherwise any supported float dtype is accepted (the CPU path).
    library : str or None, default None
        ``x``'s library (:func:`~wtconv_cuda._arrays.array_library`) where
        the caller has looked it up already; None looks it up.

    Returns
    -------
    levels : int
        The resolved number of wavelet levels.
    stride : int
        ``stride`` as a Python int.

    Raises
    ------
    TypeError
        ``weights`` is not a :class:`WTConvWeights`; an array of another
        library than ``x``; an unsupported dtype; a dtype mismatch when
        ``same_dtype``; ``levels`` or ``stride`` not an int.
    ValueError
        Wrong rank, zero height or width, inconsistent weight shapes, even
        ``K``, channel mismatch, ``levels`` negative or not matching the
        weights, ``stride < 1``; (CuPy) a weight on another GPU than ``x``.
    """
    _check_x(x)
    _check_weights(weights, x, array_library(x) if library is None else library, same_dtype)
    return _resolve_levels(levels, weights), _check_stride(stride)


def check_dy(dy, x, stride: int, *, same_dtype: bool, library: str | None = None) -> None:
    """Check an output gradient against the input it belongs to.

    Parameters
    ----------
    dy : array
        Expected of ``x``'s library, shape ``output_shape(x.shape, stride)``
        and a supported float dtype.
    x : array
        The (already checked) forward input.
    stride : int
        The (already checked) forward stride.
    same_dtype : bool
        If true, ``dy`` must have ``x``'s dtype.
    library : str or None, default None
        ``x``'s library where the caller has looked it up already; None
        looks it up.

    Raises
    ------
    TypeError
        ``dy`` of another library than ``x``, unsupported dtype, or dtype
        mismatch when ``same_dtype``.
    ValueError
        ``dy`` has the wrong shape, or (CuPy) is on another GPU than ``x``.
    """
    if library is None:
        library = array_library(x)
    if type(dy) is not type(x):
        _check_library("dy", dy, library)
    if library == "cupy":
        _check_same_device("dy", dy, _device_id(x))
    if not (same_dtype and dy.dtype == x.dtype):
        _check_dtype("dy", dy)
        if same_dtype:
            _check_same_dtype("dy", dy, x)
    expected = output_shape(tuple(x.shape), stride)
    if dy.shape != expected:  # the message is formatted only for an error
        _check_shape("dy", dy, expected,
                     f"(B, C, ceil(H/{stride}), ceil(W/{stride})) of the output")

