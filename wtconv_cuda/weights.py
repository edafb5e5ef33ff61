"""The learnable parameters of one WTConv layer, their initialisation, and the
conversion to and from the published layer's state dict."""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import numpy as np

from . import _arrays
from ._haar import HAAR_FILTERS

__all__ = [
    "WTConvWeights",
    "init_weights",
    "weights_from_state_dict",
    "weights_to_state_dict",
]

#: Floating dtypes accepted for inputs, weights and output gradients.
SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


class WTConvWeights(NamedTuple):
    """Parameters of one WTConv layer (immutable; a JAX pytree as a NamedTuple).

    All fields are arrays of one library (NumPy, CuPy, ...). ``C`` is the
    number of channels, ``K`` the odd kernel size, ``L`` the number of
    wavelet levels. The same container holds gradients in
    :func:`wtconv_cuda.backward`.

    Attributes
    ----------
    base_weight : array, shape (C, K, K)
        Depthwise kernel of the base path.
    base_bias : array of shape (C,), or None
        Bias of the base path (scaled by ``base_scale`` like the convolution);
        ``None`` for a layer without bias.
    base_scale : array, shape (C,)
        Per-channel scale of the base path.
    wavelet_weight : array, shape (L, C, 4, K, K)
        ``wavelet_weight[j - 1, c, k]`` is the kernel of level ``j``, channel
        ``c``, subband ``k`` (0..3 = LL, LH, HL, HH).
    wavelet_scale : array, shape (L, C, 4)
        Per-subband scale of each level.

    Examples
    --------
    >>> import numpy as np
    >>> from wtconv_cuda import WTConvWeights
    >>> C, K, L = 3, 5, 2
    >>> w = WTConvWeights(
    ...     base_weight=np.zeros((C, K, K)), base_bias=None, base_scale=np.ones(C),
    ...     wavelet_weight=np.zeros((L, C, 4, K, K)), wavelet_scale=np.full((L, C, 4), 0.1))
    >>> w.channels, w.kernel_size, w.levels
    (3, 5, 2)
    >>> w._replace(base_bias=np.zeros(C)).base_bias.shape
    (3,)
    """

    base_weight: Any
    base_bias: Any
    base_scale: Any
    wavelet_weight: Any
    wavelet_scale: Any

    @property
    def channels(self) -> int:
        """Number of channels ``C`` (an int)."""
        return int(self.base_weight.shape[0])

    @property
    def kernel_size(self) -> int:
        """Kernel size ``K`` (an int)."""
        return int(self.base_weight.shape[-1])

    @property
    def levels(self) -> int:
        """Number of wavelet levels ``L`` (an int)."""
        return int(self.wavelet_weight.shape[0])


def _require_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def init_weights(channels, kernel_size=5, levels=1, bias=True, dtype=np.float32, seed=None):
    """Initialise a layer's parameters like the published layer does.

    Convolution weights and the bias are drawn uniformly from
    ``[-1/K, 1/K]``: PyTorch's default ``Conv2d`` initialisation for a
    depthwise convolution, whose fan-in is ``K * K``. The base scale is 1.0
    and every wavelet scale 0.1.

    Parameters
    ----------
    channels : int
        Number of channels ``C >= 1``.
    kernel_size : int, default 5
        Odd kernel size ``K >= 1``.
    levels : int, default 1
        Number of wavelet levels ``L >= 0``.
    bias : bool, default True
        Whether the base path has a bias.
    dtype : numpy dtype, default numpy.float32
        float16, float32 or float64.
    seed : int, numpy.random.Generator or None
        Seed for :func:`numpy.random.default_rng`.

    Returns
    -------
    WTConvWeights
        NumPy arrays of ``dtype``: ``base_weight (C, K, K)``, ``base_bias
        (C,)`` or ``None``, ``base_scale (C,)``, ``wavelet_weight
        (L, C, 4, K, K)``, ``wavelet_scale (L, C, 4)``.

    Raises
    ------
    TypeError
        A size is not an int, or ``dtype`` is not a supported float dtype.
    ValueError
        ``channels < 1``, ``kernel_size < 1`` or even, ``levels < 0``.

    Examples
    --------
    >>> import numpy as np
    >>> import wtconv_cuda as wt
    >>> w = wt.init_weights(channels=8, kernel_size=5, levels=3, seed=0)
    >>> w.wavelet_weight.shape, w.wavelet_weight.dtype
    ((3, 8, 4, 5, 5), dtype('float32'))
    >>> float(w.base_scale[0]), float(w.wavelet_scale[0, 0, 0])
    (1.0, 0.10000000149011612)
    >>> wt.init_weights(8, bias=False, dtype=np.float16).base_bias is None
    True
    """
    c = _require_int("channels", channels, 1)
    k = _require_int("kernel_size", kernel_size, 1)
    n_levels = _require_int("levels", levels, 0)
    if k % 2 == 0:
        raise ValueError(f"kernel_size must be odd, got {k}")
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype must be float16, float32 or float64, got {dtype}")

    rng = np.random.default_rng(seed)
    bound = 1.0 / k

    def uniform(*shape):
        return rng.uniform(-bound, bound, size=shape).astype(dtype)

    return WTConvWeights(
        base_weight=uniform(c, k, k),
        base_bias=uniform(c) if bias else None,
        base_scale=np.ones(c, dtype=dtype),
        wavelet_weight=uniform(n_levels, c, 4, k, k),
        wavelet_scale=np.full((n_levels, c, 4), 0.1, dtype=dtype),
    )


# ---------------------------------------------------------------------------
# The published layer's state dict
# ---------------------------------------------------------------------------

#: Largest deviation from +-0.5 accepted in stored Haar filters. The published
#: layer stores float32(1/sqrt(2))**2 = 0.49999997.
HAAR_FILTER_TOLERANCE = 1e-6


def _key_prefix(prefix: str) -> str:
    if prefix and not prefix.endswith("."):
        return prefix + "."
    return prefix


def haar_filter_tensor(channels: int) -> np.ndarray:
    """The published layer's fixed ``wt_filter``/``iwt_filter`` values.

    Parameters
    ----------
    channels : int
        Number of channels ``C``.

    Returns
    -------
    numpy.ndarray, shape (4C, 1, 2, 2), float64
        Row ``4*c + k`` holds the 2x2 filter of subband ``k`` (LL, LH, HL,
        HH), entries exactly +-0.5.
    """
    return np.tile(HAAR_FILTERS[:, None], (channels, 1, 1, 1))


def _get(state_dict, key: str):
    try:
        return state_dict[key]
    except KeyError:
        raise KeyError(f"state dict has no entry {key!r}") from None


def _require_shape(key: str, arr, expected: tuple) -> None:
    if tuple(arr.shape) != expected:
        raise ValueError(f"{key} must have shape {expected}, got {tuple(arr.shape)}")


def _check_fixed_filter(key: str, arr, expected: np.ndarray) -> None:
    _require_shape(key, arr, expected.shape)
    deviation = np.max(np.abs(_arrays.to_numpy(arr).astype(np.float64) - expected))
    if not deviation <= HAAR_FILTER_TOLERANCE:
        raise ValueError(
            f"{key} is not the Haar (db1) filter bank in the published layout "
            f"(largest deviation {deviation:.3g} > {HAAR_FILTER_TOLERANCE:g}); only "
            "the Haar wavelet is supported"
        )


def weights_from_state_dict(state_dict, prefix=""):
    """Read one published ``WTConv2d`` layer's parameters from a state dict.

    Parameters
    ----------
    state_dict : mapping of str to array
        Holds, for ``P = prefix``: ``P.base_conv.weight (C, 1, K, K)``,
        optionally ``P.base_conv.bias (C,)``, ``P.base_scale.weight
        (1, C, 1, 1)``, and for ``i = 0 .. L-1`` ``P.wavelet_convs.{i}.weight
        (4C, 1, K, K)`` and ``P.wavelet_scale.{i}.weight (1, 4C, 1, 1)``.
        The fixed tensors ``P.wt_filter`` and ``P.iwt_filter`` ``(4C, 1, 2,
        2)`` and (for a strided layer) ``P.stride_filter (C, 1, 1, 1)`` may be
        present; they are checked but hold no state. Arrays of any supported
        library (NumPy, CuPy, PyTorch, JAX).
    prefix : str, default ""
        The layer's name in the state dict, with or without the trailing dot
        (``"stages.0.blocks.1.dwconv"``). Entries not starting with it are
        ignored, so with the default ``""`` the state dict must hold this
        layer's entries only.

    Returns
    -------
    WTConvWeights
        Arrays of the state dict's library and dtype, reshaped to the
        :class:`WTConvWeights` layouts (they may share memory with the state
        dict's arrays).

    Raises
    ------
    KeyError
        A required entry is missing.
    ValueError
        An entry has the wrong shape, a fixed filter has the wrong values
        (only the Haar wavelet is supported), or an unknown entry starts with
        the prefix (for instance a gap in the level numbering).

    See Also
    --------
    weights_to_state_dict : the inverse conversion.

    Examples
    --------
    >>> import wtconv_cuda as wt
    >>> sd = wt.weights_to_state_dict(wt.init_weights(4, 5, 2, seed=0), prefix="dwconv")
    >>> sd["dwconv.wavelet_convs.1.weight"].shape
    (16, 1, 5, 5)
    >>> w = wt.weights_from_state_dict(sd, prefix="dwconv")
    >>> w.channels, w.kernel_size, w.levels
    (4, 5, 2)
    """
    p = _key_prefix(prefix)
    base_key = f"{p}base_conv.weight"
    base = _get(state_dict, base_key)
    if base.ndim != 4 or base.shape[1] != 1 or base.shape[2] != base.shape[3]:
        raise ValueError(f"{base_key} must have shape (C, 1, K, K), got {tuple(base.shape)}")
    c, k = int(base.shape[0]), int(base.shape[2])
    used = {base_key}

    def take(name, expected):
        key = f"{p}{name}"
        arr = _get(state_dict, key)
        _require_shape(key, arr, expected)
        used.add(key)
        return arr

    bias = take("base_conv.bias", (c,)) if f"{p}base_conv.bias" in state_dict else None
    base_scale = take("base_scale.weight", (1, c, 1, 1)).reshape(c)

    conv_levels, scale_levels = [], []
    while f"{p}wavelet_convs.{len(conv_levels)}.weight" in state_dict:
        i = len(conv_levels)
        conv_levels.append(take(f"wavelet_convs.{i}.weight", (4 * c, 1, k, k)).reshape(c, 4, k, k))
        scale_levels.append(take(f"wavelet_scale.{i}.weight", (1, 4 * c, 1, 1)).reshape(c, 4))

    filters = haar_filter_tensor(c)
    for name in ("wt_filter", "iwt_filter"):
        key = f"{p}{name}"
        if key in state_dict:
            _check_fixed_filter(key, state_dict[key], filters)
            used.add(key)
    stride_key = f"{p}stride_filter"
    if stride_key in state_dict:
        _check_fixed_filter(stride_key, state_dict[stride_key], np.ones((c, 1, 1, 1)))
        used.add(stride_key)

    unknown = sorted(key for key in state_dict if key.startswith(p) and key not in used)
    if unknown:
        raise ValueError(
            f"unexpected state dict entries for layer {prefix!r}: {unknown} "
            f"(read {len(conv_levels)} consecutive wavelet levels)"
        )

    if conv_levels:
        wavelet_weight = _arrays.stack(conv_levels, like=base)
        wavelet_scale = _arrays.stack(scale_levels, like=base)
    else:
        wavelet_weight = _arrays.asarray_like(np.zeros((0, c, 4, k, k)), like=base)
        wavelet_scale = _arrays.asarray_like(np.zeros((0, c, 4)), like=base)
    return WTConvWeights(
        base_weight=base.reshape(c, k, k),
        base_bias=bias,
        base_scale=base_scale,
        wavelet_weight=wavelet_weight,
        wavelet_scale=wavelet_scale,
    )


def weights_to_state_dict(weights, prefix=""):
    """Write a layer's parameters under the published ``WTConv2d`` names.

    Parameters
    ----------
    weights : WTConvWeights
        Arrays of one library (NumPy, CuPy, PyTorch or JAX).
    prefix : str, default ""
        The layer's name, with or without the trailing dot.

    Returns
    -------
    dict of str to array
        ``P.base_conv.weight (C, 1, K, K)``, ``P.base_conv.bias (C,)`` if
        the layer has a bias, ``P.base_scale.weight (1, C, 1, 1)``,
        ``P.wavelet_convs.{i}.weight (4C, 1, K, K)``,
        ``P.wavelet_scale.{i}.weight (1, 4C, 1, 1)`` for each level, and the
        fixed ``P.wt_filter``, ``P.iwt_filter`` ``(4C, 1, 2, 2)`` with entries
        exactly +-0.5 in ``base_weight``'s dtype. Arrays are of the weights'
        library and may share memory with ``weights``.

    Raises
    ------
    TypeError
        ``weights`` is not a :class:`WTConvWeights`.

    See Also
    --------
    weights_from_state_dict : the inverse conversion.

    Examples
    --------
    >>> import wtconv_cuda as wt
    >>> sd = wt.weights_to_state_dict(wt.init_weights(4, 5, 1, seed=0), prefix="dwconv")
    >>> for name, value in sd.items():
    ...     print(name, value.shape)
    dwconv.base_conv.weight (4, 1, 5, 5)
    dwconv.base_conv.bias (4,)
    dwconv.base_scale.weight (1, 4, 1, 1)
    dwconv.wavelet_convs.0.weight (16, 1, 5, 5)
    dwconv.wavelet_scale.0.weight (1, 16, 1, 1)
    dwconv.wt_filter (16, 1, 2, 2)
    dwconv.iwt_filter (16, 1, 2, 2)
    """
    if not isinstance(weights, WTConvWeights):
        raise TypeError(f"weights must be a WTConvWeights, got {type(weights).__name__}")
    p = _key_prefix(prefix)
    c, k = weights.channels, weights.kernel_size
    state = {f"{p}base_conv.weight": weights.base_weight.reshape(c, 1, k, k)}
    if weights.base_bias is not None:
        state[f"{p}base_conv.bias"] = weights.base_bias
    state[f"{p}base_scale.weight"] = weights.base_scale.reshape(1, c, 1, 1)
    for i in range(weights.levels):
        state[f"{p}wavelet_convs.{i}.weight"] = weights.wavelet_weight[i].reshape(4 * c, 1, k, k)
        state[f"{p}wavelet_scale.{i}.weight"] = weights.wavelet_scale[i].reshape(1, 4 * c, 1, 1)
    filters = haar_filter_tensor(c)
    state[f"{p}wt_filter"] = _arrays.asarray_like(filters, like=weights.base_weight)
    state[f"{p}iwt_filter"] = _arrays.asarray_like(filters, like=weights.base_weight)
    return state
