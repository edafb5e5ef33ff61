"""A materialising PyTorch implementation of WTConv2d (SPEC.md), for benchmarks.

This mirrors the published layer (Finder et al., ECCV 2024) op for op with
stock PyTorch operators, so that the benchmark can compare the fused kernels
against what a user of the published code runs:

1. per level, a zero pad of odd sizes, the Haar analysis as a ``conv2d``
   with stride 2 and the four 2x2 filters (``groups=C``), a depthwise
   ``conv2d`` over the ``4C`` subband channels and a scale multiply;
2. the synthesis loop from the deepest level up: add the coarser result to
   the LL band, ``torch.cat`` the bands, ``conv_transpose2d`` with stride 2
   (``groups=C``) and a crop;
3. the base path: a depthwise ``conv2d`` with bias, times the base scale,
   plus the wavelet path;
4. for ``stride > 1``, a ``conv2d`` with a ``(C, 1, 1, 1)`` filter of ones
   and that stride (the same as ``y[:, :, ::s, ::s]``).

Every intermediate tensor is materialised in memory and autograd keeps what
the backward needs, which is exactly what the fused kernels avoid. It was
written for this project from SPEC.md (it shares no code with the published
layer) and uses the exact Haar taps ``+-0.5``. It is a benchmark baseline,
not a feature: it lives in ``benchmarks/`` and is not shipped with the
package. ``python -m wtconv_cuda.bench`` imports it from the repository
checkout when present.

Two forms are provided: :func:`materialising_wtconv2d` takes the weights in
the :class:`wtconv_cuda.WTConvWeights` layouts (any of whose tensors may
require gradients), and :class:`MaterialisingWTConv2d` is an ``nn.Module``
with the published constructor, parameter names and shapes, so it can load
the state dict of :class:`wtconv_cuda.bindings.torch.WTConv2d` or of the
published layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "HAAR_TAPS",
    "haar_filters",
    "wavelet_transform",
    "inverse_wavelet_transform",
    "materialising_forward",
    "materialising_wtconv2d",
    "MaterialisingWTConv2d",
]

#: The 2x2 Haar taps of subbands LL, LH, HL, HH (SPEC.md), as nested lists.
HAAR_TAPS = (
    ((0.5, 0.5), (0.5, 0.5)),  # LL
    ((0.5, 0.5), (-0.5, -0.5)),  # LH: top row minus bottom row
    ((0.5, -0.5), (0.5, -0.5)),  # HL: left column minus right column
    ((0.5, -0.5), (-0.5, 0.5)),  # HH
)


def haar_filters(channels, dtype=None, device=None):
    """The published layer's ``wt_filter``/``iwt_filter`` tensor.

    Parameters
    ----------
    channels : int
        Number of channels ``C``.
    dtype : torch.dtype, optional
        Default: PyTorch's default dtype.
    device : torch.device or str, optional
        Default: the CPU.

    Returns
    -------
    torch.Tensor, shape (4C, 1, 2, 2)
        Row ``4*c + k`` holds the filter of subband ``k`` (LL, LH, HL, HH).
    """
    taps = torch.tensor(HAAR_TAPS, dtype=dtype, device=device)
    return taps.repeat(channels, 1, 1).reshape(4 * channels, 1, 2, 2)


def wavelet_transform(x, filters):
    """One Haar analysis step of even-sized planes: ``conv2d`` with stride 2.

    Parameters
    ----------
    x : torch.Tensor, shape (B, C, H, W)
        ``H`` and ``W`` even (pad first).
    filters : torch.Tensor, shape (4C, 1, 2, 2)
        :func:`haar_filters` in ``x``'s dtype and device.

    Returns
    -------
    torch.Tensor, shape (B, C, 4, H/2, W/2)
        Subbands LL, LH, HL, HH of each channel.
    """
    b, c, h, w = x.shape
    return F.conv2d(x, filters, stride=2, groups=c).reshape(b, c, 4, h // 2, w // 2)


def inverse_wavelet_transform(u, filters):
    """One Haar synthesis step: ``conv_transpose2d`` with stride 2 (no crop).

    Parameters
    ----------
    u : torch.Tensor, shape (B, C, 4, H2, W2)
        Subbands LL, LH, HL, HH of each channel.
    filters : torch.Tensor, shape (4C, 1, 2, 2)
        :func:`haar_filters` in ``u``'s dtype and device.

    Returns
    -------
    torch.Tensor, shape (B, C, 2*H2, 2*W2)
    """
    b, c, _, h2, w2 = u.shape
    return F.conv_transpose2d(u.reshape(b, 4 * c, h2, w2), filters, stride=2, groups=c)


def materialising_forward(x, base_conv_weight, base_conv_bias, base_scale, wavelet_weights,
                          wavelet_scales, wt_filter, iwt_filter, stride=1, stride_filter=None):
    """The published layer's forward, op for op, on weights in the published layouts.

    Parameters
    ----------
    x : torch.Tensor, shape (B, C, H, W)
    base_conv_weight : torch.Tensor, shape (C, 1, K, K)
        Odd ``K``.
    base_conv_bias : torch.Tensor of shape (C,), or None
    base_scale : torch.Tensor, shape (1, C, 1, 1)
    wavelet_weights : sequence of torch.Tensor, each of shape (4C, 1, K, K)
        One per level, level 1 first; row ``4*c + k`` is channel ``c``,
        subband ``k``.
    wavelet_scales : sequence of torch.Tensor, each of shape (1, 4C, 1, 1)
        One per level.
    wt_filter, iwt_filter : torch.Tensor, shape (4C, 1, 2, 2)
        The analysis and synthesis filters (:func:`haar_filters`).
    stride : int, default 1
        Output subsampling factor.
    stride_filter : torch.Tensor of shape (C, 1, 1, 1), optional
        Ones; built on the fly when ``stride > 1`` and not given.

    Returns
    -------
    torch.Tensor, shape (B, C, ceil(H/stride), ceil(W/stride))
    """
    c = x.shape[1]
    k = base_conv_weight.shape[-1]
    low_bands, high_bands, shapes = [], [], []
    current = x
    for weight, scale in zip(wavelet_weights, wavelet_scales):
        shape = current.shape
        shapes.append(shape)
        if shape[2] % 2 or shape[3] % 2:
            current = F.pad(current, (0, shape[3] % 2, 0, shape[2] % 2))
        bands = wavelet_transform(current, wt_filter)
        current = bands[:, :, 0, :, :]  # the raw LL feeds the next level
        b, _, _, h2, w2 = bands.shape
        z = F.conv2d(bands.reshape(b, 4 * c, h2, w2), weight, padding=k // 2, groups=4 * c)
        z = (z * scale).reshape(b, c, 4, h2, w2)
        low_bands.append(z[:, :, 0, :, :])
        high_bands.append(z[:, :, 1:4, :, :])

    coarse = 0
    while low_bands:
        low = low_bands.pop() + coarse
        shape = shapes.pop()
        u = torch.cat([low.unsqueeze(2), high_bands.pop()], dim=2)
        coarse = inverse_wavelet_transform(u, iwt_filter)[:, :, :shape[2], :shape[3]]

    y = F.conv2d(x, base_conv_weight, base_conv_bias, padding=k // 2, groups=c) * base_scale
    y = y + coarse
    if stride > 1:
        if stride_filter is None:
            stride_filter = torch.ones(c, 1, 1, 1, dtype=x.dtype, device=x.device)
        y = F.conv2d(y, stride_filter, stride=stride, groups=c)
    return y


def materialising_wtconv2d(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale,
                           stride=1):
    """The materialising forward on weights in the ``WTConvWeights`` layouts.

    Differentiable in every tensor argument through PyTorch's autograd.

    Parameters
    ----------
    x : torch.Tensor, shape (B, C, H, W)
    base_weight : torch.Tensor, shape (C, K, K)
    base_bias : torch.Tensor of shape (C,), or None
    base_scale : torch.Tensor, shape (C,)
    wavelet_weight : torch.Tensor, shape (L, C, 4, K, K)
    wavelet_scale : torch.Tensor, shape (L, C, 4)
    stride : int, default 1

    Returns
    -------
    torch.Tensor, shape (B, C, ceil(H/stride), ceil(W/stride))
        Equal to :func:`wtconv_cuda.reference.forward` up to rounding.

    Examples
    --------
    >>> import torch
    >>> w = (torch.randn(3, 5, 5), torch.randn(3), torch.ones(3),
    ...      torch.randn(2, 3, 4, 5, 5), torch.full((2, 3, 4), 0.1))
    >>> materialising_wtconv2d(torch.randn(1, 3, 9, 7), *w, stride=2).shape
    torch.Size([1, 3, 5, 4])
    """
    c, k = base_weight.shape[0], base_weight.shape[-1]
    levels = wavelet_weight.shape[0]
    filters = haar_filters(c, dtype=x.dtype, device=x.device)
    return materialising_forward(
        x, base_weight.reshape(c, 1, k, k), base_bias, base_scale.reshape(1, c, 1, 1),
        [wavelet_weight[j].reshape(4 * c, 1, k, k) for j in range(levels)],
        [wavelet_scale[j].reshape(1, 4 * c, 1, 1) for j in range(levels)],
        filters, filters, stride)


class _Scale(nn.Module):
    """A learned scale in the published layout: ``forward(x) = x * weight``.

    Parameters
    ----------
    dims : tuple of int
        Shape of ``weight``.
    init_scale : float
        Initial value of every entry.
    device, dtype : optional
        Factory arguments of the parameter.
    """

    def __init__(self, dims, init_scale, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.full(dims, float(init_scale), device=device,
                                              dtype=dtype))

    def forward(self, x):
        """``x * weight``."""
        return x * self.weight


class MaterialisingWTConv2d(nn.Module):
    """The published ``WTConv2d`` layer's structure as a module (Haar wavelet only).

    Same constructor, parameter names and shapes as
    :class:`wtconv_cuda.bindings.torch.WTConv2d` (and the published layer):
    ``base_conv`` (a depthwise ``nn.Conv2d`` with ``padding='same'``),
    ``base_scale.weight (1, C, 1, 1)``, ``wavelet_convs.{i}`` (depthwise
    ``nn.Conv2d`` over ``4C`` channels, no bias), ``wavelet_scale.{i}.weight
    (1, 4C, 1, 1)`` and the buffers ``wt_filter``, ``iwt_filter``
    ``(4C, 1, 2, 2)`` and (``stride > 1``) ``stride_filter (C, 1, 1, 1)``.

    Parameters
    ----------
    in_channels, out_channels : int
        ``C`` (the layer is depthwise: they must be equal).
    kernel_size : int, default 5
        Odd ``K``.
    stride : int, default 1
    bias : bool, default True
    wt_levels : int, default 1
    wt_type : str, default 'db1'
        Only ``'db1'`` (alias ``'haar'``).
    device, dtype : optional
        Factory arguments of the parameters and buffers.

    Raises
    ------
    ValueError
        ``in_channels != out_channels``, another wavelet, an even kernel size.
    """

    def __init__(self, in_channels, out_channels, kernel_size=5, stride=1, bias=True, wt_levels=1,
                 wt_type="db1", *, device=None, dtype=None):
        super().__init__()
        if in_channels != out_channels:
            raise ValueError("the layer is depthwise: out_channels must equal in_channels")
        if wt_type not in ("db1", "haar"):
            raise ValueError(f"only the Haar wavelet is implemented, got {wt_type!r}")
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        c = in_channels
        factory = {"device": device, "dtype": dtype}
        self.in_channels = self.out_channels = c
        self.kernel_size, self.stride, self.wt_levels = kernel_size, stride, wt_levels
        self.base_conv = nn.Conv2d(c, c, kernel_size, padding="same", groups=c, bias=bias,
                                   **factory)
        self.base_scale = _Scale((1, c, 1, 1), 1.0, **factory)
        self.wavelet_convs = nn.ModuleList(
            nn.Conv2d(4 * c, 4 * c, kernel_size, padding="same", groups=4 * c, bias=False,
                      **factory)
            for _ in range(wt_levels))
        self.wavelet_scale = nn.ModuleList(
            _Scale((1, 4 * c, 1, 1), 0.1, **factory) for _ in range(wt_levels))
        filters = haar_filters(c, dtype=dtype or torch.get_default_dtype(), device=device)
        self.register_buffer("wt_filter", filters.clone())
        self.register_buffer("iwt_filter", filters.clone())
        if stride > 1:
            self.register_buffer("stride_filter", torch.ones(c, 1, 1, 1, **factory))

    def forward(self, x):
        """Apply the layer.

        Parameters
        ----------
        x : torch.Tensor, shape (B, C, H, W)

        Returns
        -------
        torch.Tensor, shape (B, C, ceil(H/stride), ceil(W/stride))
        """
        return materialising_forward(
            x, self.base_conv.weight, self.base_conv.bias, self.base_scale.weight,
            [m.weight for m in self.wavelet_convs], [m.weight for m in self.wavelet_scale],
            self.wt_filter, self.iwt_filter, self.stride,
            self.stride_filter if self.stride > 1 else None)

    @classmethod
    def from_weights(cls, weights, stride=1, *, device=None, dtype=None):
        """Build a layer holding ``weights``.

        Parameters
        ----------
        weights : WTConvWeights
            NumPy arrays or tensors in the :class:`wtconv_cuda.WTConvWeights`
            layouts.
        stride : int, default 1
        device, dtype : optional
            Of the new layer (default: PyTorch's defaults).

        Returns
        -------
        MaterialisingWTConv2d
        """
        def tensor(a):
            return torch.as_tensor(a.detach() if torch.is_tensor(a) else a)

        base_weight = weights.base_weight
        c, k = int(base_weight.shape[0]), int(base_weight.shape[-1])
        levels = int(weights.wavelet_weight.shape[0])
        layer = cls(c, c, k, stride=stride, bias=weights.base_bias is not None,
                    wt_levels=levels, device=device, dtype=dtype)
        with torch.no_grad():
            layer.base_conv.weight.copy_(tensor(base_weight).reshape(c, 1, k, k))
            if weights.base_bias is not None:
                layer.base_conv.bias.copy_(tensor(weights.base_bias))
            layer.base_scale.weight.copy_(tensor(weights.base_scale).reshape(1, c, 1, 1))
            for j in range(levels):
                layer.wavelet_convs[j].weight.copy_(
                    tensor(weights.wavelet_weight[j]).reshape(4 * c, 1, k, k))
                layer.wavelet_scale[j].weight.copy_(
                    tensor(weights.wavelet_scale[j]).reshape(1, 4 * c, 1, 1))
        return layer

    @classmethod
    def from_layer(cls, layer):
        """A materialising copy of a ``WTConv2d`` (same parameters, device and dtype).

        Parameters
        ----------
        layer : torch.nn.Module
            A :class:`wtconv_cuda.bindings.torch.WTConv2d` or a published
            ``WTConv2d`` with the Haar wavelet (attributes ``in_channels``,
            ``stride``, ``wt_levels`` and the published parameter names).

        Returns
        -------
        MaterialisingWTConv2d
            Its parameters are copies: training one does not change the
            other.
        """
        weight = layer.base_conv.weight
        copy = cls(layer.in_channels, layer.in_channels, weight.shape[-1], stride=layer.stride,
                   bias=layer.base_conv.bias is not None, wt_levels=len(layer.wavelet_convs),
                   device=weight.device, dtype=weight.dtype)
        copy.load_state_dict(layer.state_dict(), strict=True)
        return copy
