"""The float64 NumPy oracle: SPEC.md's operator and its exact gradients.

Everything here is written plainly and vectorised over batch, channels and
pixels; it is the executable form of the specification that every faster
implementation is tested against. All functions compute in float64 whatever
the input dtype, return float64 arrays, and never modify their inputs.

The wavelet path is ``synthesis chain o level convolutions o analysis chain``.
Its adjoint has the same structure (the Haar matrix is orthogonal and
symmetric, pads and crops swap roles), so :func:`backward` reuses the forward
building blocks: the gradient of the level-``j`` convolution outputs is the
analysis chain applied to the output gradient, and the input gradient is the
synthesis chain applied to the subband gradients.
"""

from __future__ import annotations

import numpy as np

from . import _validate
from ._arrays import array_library
from ._haar import HAAR_FILTERS
from .weights import WTConvWeights

__all__ = [
    "haar_analysis",
    "haar_synthesis",
    "analysis_chain",
    "synthesis_chain",
    "closed_form_synthesis",
    "depthwise_conv_same",
    "depthwise_conv_same_adjoint",
    "depthwise_conv_same_weight_grad",
    "forward",
    "backward",
]


def _f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def _require_plane(name: str, v: np.ndarray) -> None:
    if v.ndim < 2 or 0 in v.shape[-2:]:
        raise ValueError(f"{name} must have shape (..., H, W) with H, W >= 1, got {v.shape}")


def _check_conv(x: np.ndarray, w: np.ndarray) -> None:
    if x.ndim != 4:
        raise ValueError(f"x must have shape (B, C, H, W), got {x.shape}")
    if w.ndim != 3 or w.shape[1] != w.shape[2] or w.shape[1] % 2 == 0:
        raise ValueError(f"w must have shape (C, K, K) with K odd, got {w.shape}")
    if w.shape[0] != x.shape[1]:
        raise ValueError(f"w has {w.shape[0]} channels but x has {x.shape[1]}")


# ---------------------------------------------------------------------------
# Haar transform
# ---------------------------------------------------------------------------


def haar_analysis(v):
    """One Haar analysis step over the last two axes.

    An odd height (width) is first padded with one zero row at the bottom
    (column at the right).

    Parameters
    ----------
    v : array_like, shape (..., H, W)
        Real values, ``H, W >= 1``.

    Returns
    -------
    numpy.ndarray, shape (..., 4, ceil(H/2), ceil(W/2)), float64
        Subbands in the order LL, LH, HL, HH.

    Raises
    ------
    ValueError
        ``v`` has fewer than two axes, or ``H`` or ``W`` is zero.
    """
    v = _f64(v)
    _require_plane("v", v)
    h, w = v.shape[-2:]
    if h % 2 or w % 2:
        v = np.pad(v, [(0, 0)] * (v.ndim - 2) + [(0, h % 2), (0, w % 2)])
    h2, w2 = v.shape[-2] // 2, v.shape[-1] // 2
    blocks = v.reshape(*v.shape[:-2], h2, 2, w2, 2)
    return np.einsum("kyx,...iyjx->...kij", HAAR_FILTERS, blocks)


def haar_synthesis(u, out_hw):
    """One Haar synthesis step (the inverse of :func:`haar_analysis`), cropped.

    Parameters
    ----------
    u : array_like, shape (..., 4, H2, W2)
        Subbands in the order LL, LH, HL, HH.
    out_hw : tuple of int
        ``(H, W)`` with ``ceil(H/2) == H2`` and ``ceil(W/2) == W2``; the
        ``(2*H2, 2*W2)`` result is cropped to its top-left ``(H, W)``.

    Returns
    -------
    numpy.ndarray, shape (..., H, W), float64

    Raises
    ------
    ValueError
        ``u`` has no subband axis of length 4, or ``out_hw`` does not halve
        to ``u``'s grid.
    """
    u = _f64(u)
    if u.ndim < 3 or u.shape[-3] != 4:
        raise ValueError(f"u must have shape (..., 4, H2, W2), got {u.shape}")
    h, w = out_hw
    h2, w2 = u.shape[-2:]
    if (-(-h // 2), -(-w // 2)) != (h2, w2):
        raise ValueError(f"out_hw = {tuple(out_hw)} does not halve to the grid {(h2, w2)}")
    blocks = np.einsum("kyx,...kij->...iyjx", HAAR_FILTERS, u)
    return blocks.reshape(*u.shape[:-3], 2 * h2, 2 * w2)[..., :h, :w]


def analysis_chain(v, levels):
    """The multi-level analysis: each level transforms the previous raw LL.

    Parameters
    ----------
    v : array_like, shape (..., H, W)
        Level-0 values.
    levels : int
        Number of levels ``L >= 0``.

    Returns
    -------
    list of numpy.ndarray
        ``L`` float64 arrays; entry ``j - 1`` has shape ``(..., 4, H_j,
        W_j)`` with ``H_j = ceil(H_{j-1} / 2)``, and its subband 0 (LL) is
        the input of level ``j + 1``.

    Raises
    ------
    ValueError
        ``levels < 0``; ``v`` is not ``(..., H, W)`` with ``H, W >= 1``.
    """
    if levels < 0:
        raise ValueError(f"levels must be >= 0, got {levels}")
    _require_plane("v", _f64(v))
    subbands = []
    for _ in range(levels):
        u = haar_analysis(v)
        subbands.append(u)
        v = u[..., 0, :, :]
    return subbands


def synthesis_chain(zs, out_hw):
    """The multi-level synthesis, level by level from the deepest.

    With ``r_{L+1} = 0``, level ``j`` synthesises ``[z_j,LL + r_{j+1},
    z_j,LH, z_j,HL, z_j,HH]`` and crops to the level ``j - 1`` grid.

    Parameters
    ----------
    zs : sequence of array_like
        ``L`` arrays; entry ``j - 1`` has shape ``(..., 4, H_j, W_j)`` with
        the grids of :func:`analysis_chain` for ``out_hw``.
    out_hw : tuple of int
        ``(H, W)``, the level-0 grid.

    Returns
    -------
    numpy.ndarray, shape (..., H, W), float64
        ``r_1``; zeros of shape ``out_hw`` (no leading axes) when ``zs`` is
        empty.

    Raises
    ------
    ValueError
        An entry of ``zs`` has no subband axis of length 4, or its grid is not
        the halving of the previous level's grid (see :func:`haar_synthesis`).
    """
    if not zs:
        return np.zeros(tuple(out_hw))
    grids = [tuple(out_hw)] + [tuple(np.shape(z)[-2:]) for z in zs[:-1]]
    r = 0.0
    for z, grid in zip(reversed(zs), reversed(grids)):
        u = _f64(z).copy()
        u[..., 0, :, :] += r
        r = haar_synthesis(u, grid)
    return r


def closed_form_synthesis(zs, out_hw):
    """The multi-level synthesis in one pass (SPEC.md, closed form).

    ``r_1[p] = sum_j 2^-j (z_j,LL[q] + (-1)^by z_j,LH[q] + (-1)^bx z_j,HL[q]
    + (-1)^(by+bx) z_j,HH[q])`` with ``q = p >> j`` and ``(by, bx)`` bit
    ``j - 1`` of ``p``.

    Parameters
    ----------
    zs : sequence of array_like
        As for :func:`synthesis_chain`; all with the same leading shape.
    out_hw : tuple of int
        ``(H, W)``, the level-0 grid.

    Returns
    -------
    numpy.ndarray, shape (..., H, W), float64
        Equal to ``synthesis_chain(zs, out_hw)`` up to rounding.

    Raises
    ------
    ValueError
        An entry of ``zs`` does not have the level-``j`` grid
        ``(ceil(H / 2^j), ceil(W / 2^j))`` or 4 subbands.
    """
    h, w = out_hw
    py, px = np.arange(h), np.arange(w)
    r = np.zeros(tuple(out_hw))
    for j, z in enumerate(zs, start=1):
        z = _f64(z)
        grid = (-(-h // 2**j), -(-w // 2**j))
        if z.ndim < 3 or z.shape[-3:] != (4, *grid):
            raise ValueError(
                f"zs[{j - 1}] must have shape (..., 4, {grid[0]}, {grid[1]}), got {z.shape}"
            )
        sy = (1 - 2 * ((py >> (j - 1)) & 1))[:, None]
        sx = (1 - 2 * ((px >> (j - 1)) & 1))[None, :]
        zq = z[..., (py >> j)[:, None], (px >> j)[None, :]]  # (..., 4, H, W)
        r = r + 2.0**-j * (
            zq[..., 0, :, :]
            + sy * zq[..., 1, :, :]
            + sx * zq[..., 2, :, :]
            + (sy * sx) * zq[..., 3, :, :]
        )
    return r


# ---------------------------------------------------------------------------
# Depthwise 'same' convolution and its adjoints
# ---------------------------------------------------------------------------


def _taps(k: int, n: int) -> range:
    """Kernel offsets along one axis that touch at least one of ``n`` pixels."""
    r = (k - 1) // 2
    return range(max(0, r - n + 1), min(k, r + n))


def _pad_same(x: np.ndarray, k: int) -> np.ndarray:
    r = (k - 1) // 2
    return np.pad(x, [(0, 0)] * (x.ndim - 2) + [(r, r), (r, r)])


def depthwise_conv_same(x, w):
    """Depthwise cross-correlation with zero 'same' padding.

    ``y[b, c, i, j] = sum_{p, q} x[b, c, i + p - r, j + q - r] * w[c, p, q]``
    with ``r = (K - 1) / 2`` and ``x`` zero outside the image.

    Parameters
    ----------
    x : array_like, shape (B, C, H, W)
        Real values of any dtype.
    w : array_like, shape (C, K, K)
        One kernel per channel, ``K`` odd (may exceed ``H`` or ``W``).

    Returns
    -------
    numpy.ndarray, shape (B, C, H, W), float64

    Raises
    ------
    ValueError
        ``x`` not 4-D, ``w`` not ``(C, K, K)`` with odd ``K``, or channel
        counts that differ.
    """
    x, w = _f64(x), _f64(w)
    _check_conv(x, w)
    k = w.shape[-1]
    h, wd = x.shape[-2:]
    xp = _pad_same(x, k)
    y = np.zeros(x.shape)
    for p in _taps(k, h):
        for q in _taps(k, wd):
            y += w[:, p, q, None, None] * xp[..., p : p + h, q : q + wd]
    return y


def depthwise_conv_same_adjoint(g, w):
    """Adjoint of :func:`depthwise_conv_same` with respect to its input.

    It is the same correlation with each kernel flipped in both axes.

    Parameters
    ----------
    g : array_like, shape (B, C, H, W)
        Gradient of the convolution's output.
    w : array_like, shape (C, K, K)
        The convolution's kernels, ``K`` odd.

    Returns
    -------
    numpy.ndarray, shape (B, C, H, W), float64
        ``dx`` with ``<depthwise_conv_same(x, w), g> == <x, dx>``.

    Raises
    ------
    ValueError
        As for :func:`depthwise_conv_same`.
    """
    return depthwise_conv_same(g, _f64(w)[:, ::-1, ::-1])


def depthwise_conv_same_weight_grad(x, g, kernel_size):
    """Gradient of ``<depthwise_conv_same(x, w), g>`` with respect to ``w``.

    ``dw[c, p, q] = sum_{b, i, j} x[b, c, i + p - r, j + q - r] * g[b, c, i, j]``.

    Parameters
    ----------
    x : array_like, shape (B, C, H, W)
        The convolution's input.
    g : array_like, shape (B, C, H, W)
        Gradient of the convolution's output.
    kernel_size : int
        Odd ``K``.

    Returns
    -------
    numpy.ndarray, shape (C, K, K), float64

    Raises
    ------
    ValueError
        ``x`` not 4-D, ``g`` not of ``x``'s shape, or ``kernel_size`` not a
        positive odd number.
    """
    x, g = _f64(x), _f64(g)
    k = kernel_size
    if x.ndim != 4 or g.shape != x.shape:
        raise ValueError(f"x and g must share one (B, C, H, W) shape, got {x.shape}, {g.shape}")
    if k < 1 or k % 2 == 0:
        raise ValueError(f"kernel_size must be odd and >= 1, got {k}")
    h, wd = x.shape[-2:]
    xp = _pad_same(x, k)
    dw = np.zeros((x.shape[1], k, k))
    for p in _taps(k, h):
        for q in _taps(k, wd):
            dw[:, p, q] = np.einsum("bchw,bchw->c", xp[..., p : p + h, q : q + wd], g)
    return dw


# ---------------------------------------------------------------------------
# The operator
# ---------------------------------------------------------------------------


def _check(x, weights, levels, stride):
    if array_library(x) != "numpy":
        raise TypeError(f"x must be a numpy array, got {type(x).__name__}")
    return _validate.check_forward(x, weights, levels, stride, same_dtype=False)


def _effective_level_kernels(weights: WTConvWeights) -> np.ndarray:
    """``s_j * w_j`` as float64, shape (L, C, 4, K, K)."""
    return _f64(weights.wavelet_scale)[..., None, None] * _f64(weights.wavelet_weight)


def _merge_subbands(u: np.ndarray) -> np.ndarray:
    """``(B, C, 4, h, w) -> (B, 4C, h, w)``: row ``4*c + k`` is channel c, subband k."""
    b, c, _, h, w = u.shape
    return u.reshape(b, 4 * c, h, w)


def _level_conv(u, kernels, conv):
    """Apply ``conv`` to subbands ``u (B, C, 4, h, w)`` with ``kernels (C, 4, K, K)``."""
    k = kernels.shape[-1]
    return conv(_merge_subbands(u), kernels.reshape(-1, k, k)).reshape(u.shape)


def forward(x, weights, levels=None, stride=1):
    """Float64 forward pass of the WTConv operator (SPEC.md, Forward).

    Parameters
    ----------
    x : numpy.ndarray, shape (B, C, H, W)
        float16, bfloat16 (``ml_dtypes``), float32 or float64; ``B`` may be 0.
    weights : WTConvWeights
        NumPy arrays of any supported float dtype, ``C`` channels, odd ``K``.
    levels : int or None, default None
        Number of wavelet levels; ``None`` means ``weights.levels``, and any
        other value must equal it.
    stride : int, default 1
        Output subsampling factor ``s >= 1``.

    Returns
    -------
    numpy.ndarray, shape (B, C, ceil(H/s), ceil(W/s)), float64

    Raises
    ------
    TypeError, ValueError
        Invalid inputs, as in :func:`wtconv_cuda.forward`.
    """
    levels, stride = _check(x, weights, levels, stride)
    x = _f64(x)
    w0 = _f64(weights.base_scale)[:, None, None] * _f64(weights.base_weight)
    y = depthwise_conv_same(x, w0)
    if weights.base_bias is not None:
        y += (_f64(weights.base_scale) * _f64(weights.base_bias))[:, None, None]

    kernels = _effective_level_kernels(weights)
    subbands = analysis_chain(x, levels)
    zs = [_level_conv(u, kernels[j], depthwise_conv_same) for j, u in enumerate(subbands)]
    if zs:
        y += synthesis_chain(zs, x.shape[-2:])
    return np.ascontiguousarray(y[..., ::stride, ::stride])


def backward(x, weights, dy, levels=None, stride=1):
    """Float64 gradients of ``<forward(x, weights), dy>`` (SPEC.md, Gradients).

    Parameters
    ----------
    x : numpy.ndarray, shape (B, C, H, W)
        The forward input (float16, bfloat16, float32 or float64).
    weights : WTConvWeights
        The forward weights (NumPy arrays of any supported float dtype).
    dy : numpy.ndarray, shape (B, C, ceil(H/s), ceil(W/s))
        Gradient of the (strided) output, any supported float dtype.
    levels : int or None, default None
        As for :func:`forward`.
    stride : int, default 1
        As for :func:`forward`.

    Returns
    -------
    dx : numpy.ndarray, shape (B, C, H, W), float64
        Gradient with respect to ``x``.
    dw : WTConvWeights
        float64 gradients of every parameter, in the layouts of ``weights``;
        ``dw.base_bias`` is ``None`` when ``weights.base_bias`` is.

    Raises
    ------
    TypeError, ValueError
        Invalid inputs, as in :func:`wtconv_cuda.backward`.
    """
    levels, stride = _check(x, weights, levels, stride)
    _validate.check_dy(dy, x, stride, same_dtype=False)
    x = _f64(x)
    k = weights.kernel_size

    # Adjoint of the subsampling: zero-filled upsampling of dy.
    g = np.zeros(x.shape)
    g[..., ::stride, ::stride] = dy

    # Base path: y0 = s0 * (conv(x, w0) + b).
    s0, w0 = _f64(weights.base_scale), _f64(weights.base_weight)
    dx = depthwise_conv_same_adjoint(g, s0[:, None, None] * w0)
    d_eff0 = depthwise_conv_same_weight_grad(x, g, k)  # d/d(s0 * w0)
    d_s0 = np.einsum("cpq,cpq->c", w0, d_eff0)
    g_sum = g.sum(axis=(0, 2, 3))
    if weights.base_bias is None:
        d_b = None
    else:
        d_b = s0 * g_sum
        d_s0 += _f64(weights.base_bias) * g_sum

    # Wavelet path: y1 = synthesis_chain(conv_j(analysis_chain(x))).
    kernels = _effective_level_kernels(weights)
    subbands = analysis_chain(x, levels)  # inputs of the level convolutions
    dzs = analysis_chain(g, levels)  # adjoint of the synthesis chain
    d_subbands = []
    d_eff = np.zeros(kernels.shape)
    for j, (u, dz) in enumerate(zip(subbands, dzs)):
        d_eff[j] = depthwise_conv_same_weight_grad(
            _merge_subbands(u), _merge_subbands(dz), k
        ).reshape(d_eff[j].shape)
        d_subbands.append(_level_conv(dz, kernels[j], depthwise_conv_same_adjoint))
    if d_subbands:
        dx += synthesis_chain(d_subbands, x.shape[-2:])  # adjoint of the analysis chain

    w_levels, s_levels = _f64(weights.wavelet_weight), _f64(weights.wavelet_scale)
    dw = WTConvWeights(
        base_weight=s0[:, None, None] * d_eff0,
        base_bias=d_b,
        base_scale=d_s0,
        wavelet_weight=s_levels[..., None, None] * d_eff,
        wavelet_scale=np.einsum("lckpq,lckpq->lck", w_levels, d_eff),
    )
    return dx, dw
