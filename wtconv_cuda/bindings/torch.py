"""PyTorch binding: the ``WTConv2d`` module, a functional form and two custom ops.

Under ``torch.compile`` (and ``torch.export``) the layer runs as two
``torch.library`` custom ops, ``torch.ops.wtconv_cuda.wtconv2d_fwd`` and
``torch.ops.wtconv_cuda.wtconv2d_bwd``, with fake (meta) implementations and a
registered autograd formula, so that ``torch.compile(fullgraph=True)``,
``torch.export`` and ``torch.library.opcheck`` see one opaque,
shape-propagating op per call. In eager mode the functional form and the
module call the same implementations through one ``torch.autograd.Function``
each, which costs far less host time than the op dispatch (bit-identical
results). The module's ``Function`` takes its parameters as they are: no
per-parameter view, stack or autocast-cast nodes (see ``_ModuleWTConv``).

Devices
    CUDA tensors run the fused kernels of :mod:`wtconv_cuda.kernels`
    zero-copy: the kernels receive the tensors' ``data_ptr()`` directly (a
    non-contiguous tensor, e.g. a channels-last one, is first made
    NCHW-contiguous by PyTorch; under autocast that happens in the cast, see
    ``_autocast_input``; outputs are NCHW-contiguous); outputs, weight
    gradient partials and scratch buffers are allocated with ``torch.empty``
    (PyTorch's caching allocator, so CUDA graph capture works); every kernel
    is queued on ``torch.cuda.current_stream(device)`` of the tensors' device
    (``cuda:N`` runs on device N); nothing on the hot path synchronises with
    the host. Storage dtypes float32, float16 and bfloat16 (bfloat16 tensors
    are passed as raw bits); the kernels accumulate in float32 and round once.
    The kernels are loaded through CuPy, so the GPU path needs ``cupy``.
    CPU tensors run the float64 oracle :mod:`wtconv_cuda.reference` through
    NumPy (zero-copy views in, one rounding back to the tensor dtype out);
    float16, bfloat16, float32 and float64 are accepted.

Dtypes
    ``x`` and every weight must share one dtype, like ``torch.nn.functional.conv2d``
    (a float64 CUDA tensor raises :class:`TypeError`: use float32 or the CPU).
    Under ``torch.autocast`` the functional form and the module cast ``x`` and
    the weights to the autocast dtype first, exactly like convolutions do
    (float64 tensors are left alone), so the kernels run in float16 or
    bfloat16 and the output has the autocast dtype; gradients flow back to the
    float32 parameters through the casts (the module casts its parameters
    inside its one autograd node, with the same result). Weight gradients are
    then computed with float32 accumulation and rounded to the autocast dtype
    before the cast back, as for a convolution under autocast.

First call and CUDA graphs
    The first call for a new problem size compiles (or loads) the kernel
    variant and uploads a small geometry table with a host synchronisation.
    Warm up every shape outside capture before recording a CUDA graph (as
    ``torch.cuda.graphs`` requires anyway); a first call inside capture raises
    :class:`RuntimeError`.
"""

import numbers

import numpy as np
import torch
from torch import nn

from .. import reference
from .._arrays import to_numpy
from ..weights import (
    WTConvWeights,
    haar_filter_tensor,
    weights_from_state_dict,
    weights_to_state_dict,
)
from ..kernels.launch import Problem, Weights
from ..kernels.driver import side_stream
from ..kernels.program import run_direct
from . import _common

__all__ = ["WTConv2d", "wtconv2d", "wtconv2d_fwd", "wtconv2d_bwd"]

#: Kernel storage names of the dtypes the GPU path accepts.
GPU_STORAGE = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
#: Dtypes the CPU path accepts.
CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


# ---------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------


def _check_tensors(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale,
                   stride) -> _common.LayerSizes:
    """Shapes, dtypes and devices of one op call (works on fake tensors)."""
    sizes = _common.check_layer(
        tuple(x.shape), tuple(base_weight.shape),
        None if base_bias is None else tuple(base_bias.shape), tuple(base_scale.shape),
        tuple(wavelet_weight.shape), tuple(wavelet_scale.shape), None, stride)
    _check_dtypes_devices(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale)
    return sizes


def _check_dtypes_devices(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale):
    """Every tensor has ``x``'s dtype and device, and the device's path supports the dtype."""
    named = (("base_weight", base_weight), ("base_bias", base_bias), ("base_scale", base_scale),
             ("wavelet_weight", wavelet_weight), ("wavelet_scale", wavelet_scale))
    for name, t in named:
        if t is None:
            continue
        if t.dtype != x.dtype:
            raise TypeError(
                f"{name} has dtype {t.dtype} but x has dtype {x.dtype}; they must match "
                "(use torch.autocast or cast the module)"
            )
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    kind = x.device.type
    if kind == "cuda" and x.dtype not in GPU_STORAGE:
        raise TypeError(
            f"x has dtype {x.dtype}; on CUDA the kernels support float32, float16 and "
            "bfloat16 (use CPU tensors for float64)"
        )
    if kind == "cpu" and x.dtype not in CPU_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; expected a floating dtype")
    if kind not in ("cuda", "cpu", "meta"):
        raise NotImplementedError(f"wtconv2d has no implementation for {kind} tensors")


# ---------------------------------------------------------------------------
# CPU path: the float64 oracle
# ---------------------------------------------------------------------------


def _numpy(t):
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()


def _tensor(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(like.dtype)


def _cpu_weights(bw, bb, bs, ww, ws) -> WTConvWeights:
    return WTConvWeights(_numpy(bw), None if bb is None else _numpy(bb), _numpy(bs), _numpy(ww),
                         _numpy(ws))


def _forward_cpu(x, bw, bb, bs, ww, ws, stride, sizes):
    y = reference.forward(_numpy(x), _cpu_weights(bw, bb, bs, ww, ws), sizes.levels, stride)
    return _tensor(y, x)


def _backward_cpu(dy, x, bw, bb, bs, ww, ws, stride, sizes):
    dx, dw = reference.backward(_numpy(x), _cpu_weights(bw, bb, bs, ww, ws), _numpy(dy),
                                sizes.levels, stride)
    d_bias = bs.new_empty((0,)) if bb is None else _tensor(dw.base_bias, bb)
    return (_tensor(dx, x), _tensor(dw.base_weight, bw), d_bias, _tensor(dw.base_scale, bs),
            _tensor(dw.wavelet_weight, ww), _tensor(dw.wavelet_scale, ws))


# ---------------------------------------------------------------------------
# CUDA path: raw pointers into the fused kernels
# ---------------------------------------------------------------------------

_per_device: dict = {}


def _current_stream(index: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def _make_table(device: torch.device, values: np.ndarray):
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "wtconv2d: the first call for this problem size happened during CUDA graph "
            "capture; it must upload a small table first. Run the layer once with the same "
            "shapes before capturing (warm-up)."
        )
    table = torch.from_numpy(np.array(values, dtype=np.int64)).to(device)
    torch.cuda.current_stream(device).synchronize()  # the table may next be read on any stream
    return table, table.data_ptr()


def _hooks(device: torch.device):
    """``(DeviceKernels, allocate, make_table)`` of a device (made on first use)."""
    index = device.index
    hooks = _per_device.get(index)
    if hooks is None:
        def allocate(n, _device=device):
            buffer = torch.empty(n, dtype=torch.float32, device=_device)
            return buffer, buffer.data_ptr()

        def make_table(values, _device=device):
            return _make_table(_device, values)

        hooks = _per_device[index] = (_common.device_kernels(index), allocate, make_table)
    return hooks


def _launcher(device: torch.device) -> _common.PointerLauncher:
    kernels, allocate, make_table = _hooks(device)
    stream = _common.stream_handle(device.index, _current_stream(device.index))
    return _common.PointerLauncher(kernels, stream, allocate, make_table)


def _launch(device: torch.device, problem: Problem, backward: bool, addresses: tuple) -> None:
    """Queue one call's launches on the device's current stream: its recorded program
    (:mod:`wtconv_cuda.kernels.program`), else through the planner. ``addresses`` in the
    slot order of :func:`~wtconv_cuda.kernels.program.run_direct`."""
    kernels, allocate, make_table = _hooks(device)
    with _common.DeviceScope(device.index):
        program = kernels.program(problem, backward, make_table)
        if program is None:
            run_direct(_launcher(device), problem, backward, addresses)
        else:
            program.run(addresses, allocate, _current_stream(device.index),
                        side_stream(device.index) if program.forks else None)


def _ptr(t) -> int:
    """Device address of ``t``'s first element (a plain int: the launcher packs it)."""
    return t.data_ptr()


def _problem(x, sizes, stride, has_bias):
    return Problem(sizes.batch, sizes.channels, sizes.height, sizes.width, sizes.kernel_size,
                   sizes.levels, stride, GPU_STORAGE[x.dtype], has_bias)


def _kernel_weights(bw, bb, bs, ww, ws):
    return Weights(_ptr(bw), _ptr(bs if bb is None else bb), _ptr(bs), _ptr(ww), _ptr(ws))


def _forward_cuda(x, bw, bb, bs, ww, ws, stride, sizes):
    ho, wo = _common.out_hw(sizes.height, sizes.width, stride)
    y = torch.empty((sizes.batch, sizes.channels, ho, wo), dtype=x.dtype, device=x.device)
    if sizes.batch == 0:
        return y
    x, bw, bs, ww, ws = (t.contiguous() for t in (x, bw, bs, ww, ws))
    bb = None if bb is None else bb.contiguous()
    _launch(x.device, _problem(x, sizes, stride, bb is not None), False,
            (_ptr(x), _ptr(y), *_kernel_weights(bw, bb, bs, ww, ws)))
    return y


def _backward_cuda(dy, x, bw, bb, bs, ww, ws, stride, sizes):
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grads = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (bw, bs, ww, ws)]
    d_bias = bs.new_empty((0,)) if bb is None else torch.empty_like(bb, memory_format=torch.contiguous_format)
    d_bw, d_bs, d_ww, d_ws = grads
    if sizes.batch == 0:  # an empty batch contributes nothing to the weight gradients
        for g in (*grads, d_bias):
            g.zero_()
        return dx, d_bw, d_bias, d_bs, d_ww, d_ws
    dy = dy.to(x.dtype, memory_format=torch.contiguous_format)  # one copy at most
    x, bw, bs, ww, ws = (t.contiguous() for t in (x, bw, bs, ww, ws))
    bb = None if bb is None else bb.contiguous()
    _launch(x.device, _problem(x, sizes, stride, bb is not None), True,
            (_ptr(x), _ptr(dy), _ptr(dx), *_kernel_weights(bw, bb, bs, ww, ws),
             *_kernel_weights(d_bw, None if bb is None else d_bias, d_bs, d_ww, d_ws)))
    return dx, d_bw, d_bias, d_bs, d_ww, d_ws


#: Device type -> (forward, backward) implementation of the ops.
_IMPLS = {"cuda": (_forward_cuda, _backward_cuda), "cpu": (_forward_cpu, _backward_cpu)}


# ---------------------------------------------------------------------------
# Custom ops
# ---------------------------------------------------------------------------

_FWD_SCHEMA = ("(Tensor x, Tensor base_weight, Tensor? base_bias, Tensor base_scale, "
               "Tensor wavelet_weight, Tensor wavelet_scale, int stride) -> Tensor")
_BWD_SCHEMA = ("(Tensor dy, Tensor x, Tensor base_weight, Tensor? base_bias, Tensor base_scale, "
               "Tensor wavelet_weight, Tensor wavelet_scale, int stride) "
               "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")


@torch.library.custom_op("wtconv_cuda::wtconv2d_fwd", mutates_args=(), schema=_FWD_SCHEMA)
def wtconv2d_fwd(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale, stride):
    """The forward custom op ``torch.ops.wtconv_cuda.wtconv2d_fwd``.

    No autocast casting and no argument defaults: use :func:`wtconv2d` or
    :class:`WTConv2d` unless you need the raw op.

    Parameters
    ----------
    x : torch.Tensor, shape (B, C, H, W)
        Input.
    base_weight : torch.Tensor, shape (C, K, K)
        Base kernel (odd ``K``).
    base_bias : torch.Tensor of shape (C,), or None
        Base bias.
    base_scale : torch.Tensor, shape (C,)
        Base scale.
    wavelet_weight : torch.Tensor, shape (L, C, 4, K, K)
        Level kernels.
    wavelet_scale : torch.Tensor, shape (L, C, 4)
        Level scales.
    stride : int
        Output subsampling factor ``>= 1``.

    All tensors share ``x``'s dtype and device.

    Returns
    -------
    torch.Tensor, shape (B, C, ceil(H/stride), ceil(W/stride))
        A new contiguous tensor of ``x``'s dtype and device.

    Raises
    ------
    TypeError
        Mismatched dtypes, or a dtype the device's path does not support.
    ValueError
        Inconsistent shapes, even ``K``, ``stride < 1``, tensors on different
        devices.
    RuntimeError
        The first call for a problem size happens during CUDA graph capture.
    """
    sizes = _check_tensors(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale,
                           stride)
    forward, _ = _IMPLS[x.device.type]
    return forward(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale, stride,
                   sizes)


@torch.library.custom_op("wtconv_cuda::wtconv2d_bwd", mutates_args=(), schema=_BWD_SCHEMA)
def wtconv2d_bwd(dy, x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale,
                 stride):
    """The backward custom op ``torch.ops.wtconv_cuda.wtconv2d_bwd``.

    Parameters
    ----------
    dy : torch.Tensor, shape (B, C, ceil(H/stride), ceil(W/stride))
        Gradient of the forward output.
    x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale, stride
        The forward call's arguments, as for :func:`wtconv2d_fwd`.

    Returns
    -------
    tuple of torch.Tensor
        ``(dx, d_base_weight, d_base_bias, d_base_scale, d_wavelet_weight,
        d_wavelet_scale)``, each shaped and typed like its input;
        ``d_base_bias`` has shape ``(0,)`` when ``base_bias`` is None.

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As for :func:`wtconv2d_fwd`; ``ValueError`` also for a ``dy`` of the
        wrong shape.
    """
    sizes = _check_tensors(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale,
                           stride)
    _check_dy(dy, x, sizes, stride)
    _, backward = _IMPLS[x.device.type]
    return backward(dy, x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale,
                    stride, sizes)


def _check_dy(dy, x, sizes, stride):
    ho, wo = _common.out_hw(sizes.height, sizes.width, stride)
    expected = (sizes.batch, sizes.channels, ho, wo)
    if tuple(dy.shape) != expected:
        raise ValueError(f"dy must have the output's shape {expected}, got {tuple(dy.shape)}")
    if dy.device != x.device:
        raise ValueError(f"dy is on {dy.device} but x is on {x.device}")


@wtconv2d_fwd.register_fake
def _wtconv2d_fwd_fake(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale,
                       stride):
    sizes = _check_tensors(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale,
                           stride)
    ho, wo = _common.out_hw(sizes.height, sizes.width, stride)
    return x.new_empty((sizes.batch, sizes.channels, ho, wo))


@wtconv2d_bwd.register_fake
def _wtconv2d_bwd_fake(dy, x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale,
                       stride):
    sizes = _check_tensors(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale,
                           stride)
    _check_dy(dy, x, sizes, stride)
    d_bias = base_scale.new_empty((0,)) if base_bias is None else base_bias.new_empty(
        base_bias.shape)
    return (x.new_empty(x.shape), base_weight.new_empty(base_weight.shape), d_bias,
            base_scale.new_empty(base_scale.shape), wavelet_weight.new_empty(wavelet_weight.shape),
            wavelet_scale.new_empty(wavelet_scale.shape))


def _setup_context(ctx, inputs, output):
    x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale, stride = inputs
    ctx.save_for_backward(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale)
    ctx.stride = stride


def _backward(ctx, dy):
    x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale = ctx.saved_tensors
    dx, d_bw, d_bb, d_bs, d_ww, d_ws = wtconv2d_bwd(
        dy, x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale, ctx.stride)
    return dx, d_bw, (None if base_bias is None else d_bb), d_bs, d_ww, d_ws, None


wtconv2d_fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerWTConv(torch.autograd.Function):
    """The eager path: the ops' implementations and autograd formula, without op dispatch.

    A ``torch.library`` custom op with a registered autograd formula costs a
    few hundred microseconds of host time per call in eager mode (argument
    normalisation, dispatcher round trips and a generated
    ``autograd.Function`` per call). Outside ``torch.compile`` the functional
    form and the module call this ``Function`` instead: the same checks, the
    same forward and backward implementations (bit-identical results), one
    autograd node. Under compilation, export and tracing they call the ops,
    which the compiler sees as opaque nodes. ``sizes`` is the caller's
    :func:`~wtconv_cuda.bindings._common.check_layer` result.
    """

    @staticmethod
    def forward(ctx, x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale, stride,
                sizes):
        _check_dtypes_devices(x, base_weight, base_bias, base_scale, wavelet_weight,
                              wavelet_scale)
        ctx.save_for_backward(x, base_weight, base_bias, base_scale, wavelet_weight,
                              wavelet_scale)
        ctx.stride, ctx.sizes = stride, sizes
        forward, _ = _IMPLS[x.device.type]
        return forward(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale,
                       stride, sizes)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale = ctx.saved_tensors
        stride, sizes = ctx.stride, ctx.sizes
        _check_dy(dy, x, sizes, stride)
        _, backward = _IMPLS[x.device.type]
        dx, d_bw, d_bb, d_bs, d_ww, d_ws = backward(
            dy, x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale, stride,
            sizes)
        return dx, d_bw, (None if base_bias is None else d_bb), d_bs, d_ww, d_ws, None, None


class _ModuleWTConv(torch.autograd.Function):
    """The module's eager path: its parameters in, as they are, and their gradients out.

    ``WTConv2d`` holds its parameters in the published shapes, one
    ``(4C, 1, K, K)`` kernel and one ``(1, 4C, 1, 1)`` scale per level. Going
    through :func:`wtconv2d` costs a view per parameter, two ``torch.stack``
    calls for ``L > 1`` and, under autocast, a cast per weight, each an
    autograd node with host cost in both directions. This ``Function`` takes
    the parameters directly (``base_weight``, ``base_bias`` if any,
    ``base_scale``, the ``L`` level kernels, the ``L`` level scales). The GPU
    kernels only need the bytes in the right order, so for ``L > 1`` the
    level kernels and scales are joined by one ``torch.cat`` each along
    their first channel axis (``(L*4C, 1, K, K)`` and ``(1, L*4C, 1, 1)``
    hold the ``(L, C, 4, K, K)`` and ``(L, C, 4)`` layouts), and the
    gradients of those come back split into per-level views. Other
    implementations (the CPU oracle) get the :class:`~wtconv_cuda.WTConvWeights`
    shapes. Results are bit-identical to :func:`wtconv2d` on
    :meth:`WTConv2d.kernel_weights` (a CPU test checks it, and
    ``tests/gpu/test_bindings_gpu.py`` on a GPU).
    """

    @staticmethod
    def forward(ctx, x, stride, sizes, has_bias, *params):
        weights = _module_weights(x, sizes, has_bias, params)
        ctx.save_for_backward(x, *weights)
        ctx.stride, ctx.sizes, ctx.param_dtype = stride, sizes, params[0].dtype
        return _module_forward(x, weights, stride, sizes)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, *weights = ctx.saved_tensors
        stride, sizes = ctx.stride, ctx.sizes
        _check_dy(dy, x, sizes, stride)
        _, backward = _IMPLS[x.device.type]
        if backward is _backward_cuda:
            dx, *grads = _backward_cuda(dy, x, *weights, stride, sizes)
        else:
            dx, *grads = backward(dy, x, *_weights_layout(weights, sizes), stride, sizes)
            grads = [None if w is None else g.reshape(w.shape) for g, w in zip(grads, weights)]
        if weights[1] is None:
            del grads[1]
        if grads[0].dtype != ctx.param_dtype:
            grads = [g.to(ctx.param_dtype) for g in grads]
        d_ww, d_ws = grads[-2:]
        if sizes.levels == 0:
            levels = ()
        elif sizes.levels == 1:
            levels = (d_ww, d_ws)
        else:
            levels = _level_views(d_ww, d_ws, sizes)
        return (dx, None, None, None, *grads[:-2], *levels)


def _level_views(d_ww, d_ws, sizes):
    """Per-level gradient views of the joined ``(L*4C, 1, K, K)`` and ``(1, L*4C, 1, 1)``
    gradients, ``L`` kernels then ``L`` scales, each contiguous in its parameter's shape.

    Contiguous strides are what DDP's gradient buckets expect (a split along the
    scales' dim 1 would leave dim 0's stride at ``L * 4C``). One ``as_strided`` per view:
    ``split`` and ``unbind`` cost several dispatcher calls per view.
    """
    four_c, k = 4 * sizes.channels, sizes.kernel_size
    kernel, scale = four_c * k * k, four_c
    d_ww, d_ws = d_ww.contiguous(), d_ws.contiguous()  # no-ops for the kernels' outputs
    w0, s0 = d_ww.storage_offset(), d_ws.storage_offset()
    w_shape, w_strides = (four_c, 1, k, k), (k * k, k * k, k, 1)
    s_shape, s_strides = (1, four_c, 1, 1), (four_c, 1, 1, 1)
    levels = range(sizes.levels)
    return (*(d_ww.as_strided(w_shape, w_strides, w0 + j * kernel) for j in levels),
            *(d_ws.as_strided(s_shape, s_strides, s0 + j * scale) for j in levels))


def _module_weights(x, sizes, has_bias, params):
    """The kernels' weights from the module's parameters (see :class:`_ModuleWTConv`):
    ``[base_weight, base_bias or None, base_scale, wavelet_weight, wavelet_scale]`` in
    ``x``'s dtype, checked against ``x``."""
    levels, n = sizes.levels, 3 if has_bias else 2
    weights = list(params[:n])
    if levels == 1:
        weights += params[n:]
    elif levels > 1:
        weights += (torch.cat(params[n:n + levels]), torch.cat(params[n + levels:], 1))
    else:
        weights += (params[0].new_empty((0,)), params[0].new_empty((0,)))
    if params[0].dtype != x.dtype:  # autocast
        weights = [w.to(x.dtype) for w in weights]
    if not has_bias:
        weights.insert(1, None)
    _check_dtypes_devices(x, *weights)
    return weights


def _module_forward(x, weights, stride, sizes):
    """The forward on :func:`_module_weights`' output, on ``x``'s device."""
    forward, _ = _IMPLS[x.device.type]
    if forward is not _forward_cuda:
        weights = _weights_layout(weights, sizes)
    return forward(x, *weights, stride, sizes)


def _weights_layout(weights, sizes):
    """The module's weights (see :class:`_ModuleWTConv`) in the WTConvWeights shapes."""
    c, k, levels = sizes.channels, sizes.kernel_size, sizes.levels
    bw, bb, bs, ww, ws = weights
    return [bw.reshape(c, k, k), bb, bs.reshape(c), ww.reshape(levels, c, 4, k, k),
            ws.reshape(levels, c, 4)]


# ---------------------------------------------------------------------------
# Functional form
# ---------------------------------------------------------------------------


def _autocast_input(x, dtype):
    """``x`` cast to ``dtype`` for the kernels: one copy, NCHW-contiguous.

    The kernels read NCHW-contiguous planes. When autocast has to copy ``x``
    anyway, the cast writes that layout directly: for a channels-last input
    (timm's ConvNeXt blocks feed one) this replaces a cast and a separate
    layout copy, and the tensor saved for the backward is already
    contiguous, so the backward does not copy it again. Without a cast the
    input is passed as it is (no copy is saved for the backward).
    """
    if not x.is_floating_point() or x.dtype in (dtype, torch.float64):
        return x
    return x.to(dtype, memory_format=torch.contiguous_format)


def _autocast(tensors, device_type):
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    x, *weights = tensors
    return (_autocast_input(x, dtype), *(
        t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64
        else t
        for t in weights
    ))


def wtconv2d(x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale, levels=None,
             stride=1):
    """Apply the WTConv operator of SPEC.md (differentiable in every tensor argument).

    Weights use the :class:`~wtconv_cuda.WTConvWeights` layouts (not the
    published 4-D layouts; :class:`WTConv2d` converts those with free views).

    Parameters
    ----------
    x : torch.Tensor, shape (B, C, H, W)
        Input: float32, float16 or bfloat16 on CUDA; also float64 on the CPU.
    base_weight : torch.Tensor, shape (C, K, K)
        Depthwise kernel of the base path, odd ``K``.
    base_bias : torch.Tensor of shape (C,), or None
        Bias of the base path (scaled by ``base_scale``), or None.
    base_scale : torch.Tensor, shape (C,)
        Per-channel scale of the base path.
    wavelet_weight : torch.Tensor, shape (L, C, 4, K, K)
        ``wavelet_weight[j - 1, c, k]``: level ``j``, channel ``c``, subband
        ``k`` (LL, LH, HL, HH).
    wavelet_scale : torch.Tensor, shape (L, C, 4)
        Per-subband scale of each level.
    levels : int or None, default None
        ``None`` takes ``L`` from ``wavelet_weight``; an int must equal it.
    stride : int, default 1
        Output subsampling factor ``s >= 1``.

    Returns
    -------
    torch.Tensor, shape (B, C, ceil(H/s), ceil(W/s))
        ``x``'s dtype, or the autocast dtype inside an autocast region.

    Raises
    ------
    TypeError
        Mismatched or unsupported dtypes; ``levels``/``stride`` not an int.
    ValueError
        Inconsistent shapes, even ``K``, ``levels`` not matching the weights,
        ``stride < 1``, tensors on different devices.
    """
    sizes = _common.check_layer(
        tuple(x.shape), tuple(base_weight.shape),
        None if base_bias is None else tuple(base_bias.shape), tuple(base_scale.shape),
        tuple(wavelet_weight.shape), tuple(wavelet_scale.shape), levels, stride)
    tensors = _autocast((x, base_weight, base_bias, base_scale, wavelet_weight, wavelet_scale),
                        x.device.type)
    if torch.compiler.is_compiling():
        return wtconv2d_fwd(*tensors, int(stride))
    return _EagerWTConv.apply(*tensors, int(stride), sizes)


# ---------------------------------------------------------------------------
# The module
# ---------------------------------------------------------------------------


def _require_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


class _ScaleModule(nn.Module):
    """A learned per-channel scale in the published layout (``weight`` of shape ``dims``).

    Parameters
    ----------
    dims : tuple of int
        Shape of ``weight``, ``(1, N, 1, 1)``.
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
        """``x * weight`` (broadcast over ``(B, N, H, W)``)."""
        return x * self.weight


class WTConv2d(nn.Module):
    """The WTConv layer (Finder et al., ECCV 2024) with the published constructor and names.

    Parameters are held in the published layer's shapes and names, so its
    checkpoints load with ``strict=True`` and parameter counts match:
    ``base_conv.weight (C, 1, K, K)``, ``base_conv.bias (C,)`` (if ``bias``),
    ``base_scale.weight (1, C, 1, 1)`` (init 1.0), and for each level ``i``
    ``wavelet_convs.{i}.weight (4C, 1, K, K)`` and ``wavelet_scale.{i}.weight
    (1, 4C, 1, 1)`` (init 0.1); convolution weights and the bias use
    ``nn.Conv2d``'s default initialisation. The fixed Haar filters
    ``wt_filter`` and ``iwt_filter`` ``(4C, 1, 2, 2)`` (and ``stride_filter
    (C, 1, 1, 1)`` when ``stride > 1``) are persistent buffers: they are in the
    state dict, are checked to be the Haar filters on load, are not
    parameters, and are not used by the computation (the kernels apply the
    exact Haar transform). Total parameters: ``C*K*K + C (bias) + C +
    L*(4C*K*K + 4C)``.

    ``base_conv`` and ``wavelet_convs`` are ``nn.Conv2d`` modules used only as
    parameter containers.

    Parameters
    ----------
    in_channels : int
        ``C``.
    out_channels : int
        Must equal ``in_channels`` (the layer is depthwise).
    kernel_size : int, default 5
        Odd ``K``.
    stride : int, default 1
        Output subsampling factor.
    bias : bool, default True
        Whether the base path has a bias.
    wt_levels : int, default 1
        Wavelet levels ``L >= 0``.
    wt_type : str, default 'db1'
        ``'db1'`` (or its PyWavelets alias ``'haar'``); other wavelets raise.
    device, dtype : optional
        Factory arguments of the parameters and buffers.

    Raises
    ------
    TypeError
        A size is not an int.
    ValueError
        ``in_channels != out_channels``, an unsupported wavelet, an even or
        non-positive kernel size, ``stride < 1`` or ``wt_levels < 0``.

    Notes
    -----
    ``forward(x)`` takes ``x`` of shape ``(B, C, H, W)`` and returns ``(B, C,
    ceil(H/stride), ceil(W/stride))``; see :func:`wtconv2d` for dtypes,
    devices and autocast.
    """

    def __init__(self, in_channels, out_channels, kernel_size=5, stride=1, bias=True, wt_levels=1,
                 wt_type="db1", *, device=None, dtype=None):
        super().__init__()
        c = _require_int("in_channels", in_channels, 1)
        _require_int("out_channels", out_channels, 1)
        if out_channels != in_channels:
            raise ValueError(
                f"WTConv2d is depthwise: out_channels ({out_channels}) must equal in_channels "
                f"({in_channels})"
            )
        k = _require_int("kernel_size", kernel_size, 1)
        if k % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {k}")
        s = _require_int("stride", stride, 1)
        levels = _require_int("wt_levels", wt_levels, 0)
        if wt_type not in _common.WAVELETS:
            raise ValueError(
                f"wt_type {wt_type!r} is not supported: only the Haar wavelet ('db1', alias "
                "'haar') is implemented"
            )
        factory = {"device": device, "dtype": dtype}
        self.in_channels = self.out_channels = c
        self.kernel_size = k
        self.stride = s
        self.wt_levels = levels
        self.wt_type = wt_type

        self.base_conv = nn.Conv2d(c, c, k, padding="same", stride=1, dilation=1, groups=c,
                                   bias=bool(bias), **factory)
        self.base_scale = _ScaleModule((1, c, 1, 1), 1.0, **factory)
        self.wavelet_convs = nn.ModuleList(
            nn.Conv2d(4 * c, 4 * c, k, padding="same", stride=1, dilation=1, groups=4 * c,
                      bias=False, **factory)
            for _ in range(levels)
        )
        self.wavelet_scale = nn.ModuleList(
            _ScaleModule((1, 4 * c, 1, 1), 0.1, **factory) for _ in range(levels)
        )
        filters = torch.as_tensor(haar_filter_tensor(c), dtype=dtype or torch.get_default_dtype(),
                                  device=device)
        self.register_buffer("wt_filter", filters.clone())
        self.register_buffer("iwt_filter", filters.clone())
        if s > 1:
            self.register_buffer("stride_filter", torch.ones(c, 1, 1, 1, **factory))

    def extra_repr(self):
        """Constructor arguments, for ``repr``."""
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, bias={self.base_conv.bias is not None}, "
                f"wt_levels={self.wt_levels}, wt_type={self.wt_type!r}")

    def kernel_weights(self):
        """The parameters as views in the :class:`~wtconv_cuda.WTConvWeights` layouts.

        Returns
        -------
        WTConvWeights
            ``base_weight (C, K, K)``, ``base_bias (C,)`` or None,
            ``base_scale (C,)``, ``wavelet_weight (L, C, 4, K, K)`` (a stacked
            copy for ``L > 1``, a view for ``L == 1``; differentiable) and
            ``wavelet_scale (L, C, 4)``; tensors that carry autograd history
            to the parameters.
        """
        c, k = self.in_channels, self.kernel_size
        base = self.base_conv.weight
        if self.wt_levels == 1:  # views, no copy
            wavelet_weight = self.wavelet_convs[0].weight.reshape(1, c, 4, k, k)
            wavelet_scale = self.wavelet_scale[0].weight.reshape(1, c, 4)
        elif self.wt_levels:
            wavelet_weight = torch.stack([m.weight.reshape(c, 4, k, k) for m in self.wavelet_convs])
            wavelet_scale = torch.stack([m.weight.reshape(c, 4) for m in self.wavelet_scale])
        else:
            wavelet_weight = base.new_zeros((0, c, 4, k, k))
            wavelet_scale = base.new_zeros((0, c, 4))
        return WTConvWeights(base.reshape(c, k, k), self.base_conv.bias,
                             self.base_scale.weight.reshape(c), wavelet_weight, wavelet_scale)

    def forward(self, x):
        """Apply the layer.

        Parameters
        ----------
        x : torch.Tensor, shape (B, C, H, W)
            Input with ``C == in_channels``, on the parameters' device.

        Returns
        -------
        torch.Tensor, shape (B, C, ceil(H/stride), ceil(W/stride))
            The layer's output (``x``'s dtype, or the autocast dtype).
        """
        if torch.compiler.is_compiling():
            w = self.kernel_weights()
            return wtconv2d(x, *w, levels=self.wt_levels, stride=self.stride)
        return self._forward_eager(x)

    def _parameters_in_flat_order(self):
        """``base_weight``, ``base_bias`` (if any), ``base_scale``, level kernels, level scales.

        Read from the modules' ``_parameters`` dictionaries: ``nn.Module``'s
        attribute lookup costs ~0.6 us a name, 14 names a call at ``L = 3``.
        Parameters replaced by assignment are seen, as with attribute access; a
        name missing from its dictionary (a parametrized weight, say) takes
        the attribute path.
        """
        modules = self._modules
        try:
            base = modules["base_conv"]._parameters
            bias = base["bias"]
            return (base["weight"], *(() if bias is None else (bias,)),
                    modules["base_scale"]._parameters["weight"],
                    *(m._parameters["weight"] for m in modules["wavelet_convs"]._modules.values()),
                    *(m._parameters["weight"] for m in modules["wavelet_scale"]._modules.values()))
        except KeyError:
            bias = self.base_conv.bias
            return (self.base_conv.weight, *(() if bias is None else (bias,)),
                    self.base_scale.weight, *(m.weight for m in self.wavelet_convs),
                    *(m.weight for m in self.wavelet_scale))

    def _forward_eager(self, x):
        """The eager call: :class:`_ModuleWTConv` on the parameters (no per-parameter nodes),
        or, with nothing to differentiate, the forward without the autograd Function."""
        c, k, levels = self.in_channels, self.kernel_size, self.wt_levels
        has_bias = self.base_conv.bias is not None
        sizes = _common.check_layer(tuple(x.shape), (c, k, k), (c,) if has_bias else None, (c,),
                                    (levels, c, 4, k, k), (levels, c, 4), levels, self.stride)
        params = self._parameters_in_flat_order()
        dtype = params[0].dtype
        for p in params[1:]:
            if p.dtype != dtype:
                raise TypeError(f"the layer's parameters have mixed dtypes ({dtype}, {p.dtype})")
        kind = x.device.type
        if torch.is_autocast_enabled(kind):  # cast like a convolution; float64 is left alone
            target = torch.get_autocast_dtype(kind)
            x = _autocast_input(x, target)
            if dtype.is_floating_point and dtype != torch.float64:
                dtype = target
        if dtype != x.dtype:
            raise TypeError(
                f"base_weight has dtype {params[0].dtype} but x has dtype {x.dtype}; they must "
                "match (use torch.autocast or cast the module)"
            )
        if not torch.is_grad_enabled() or not (
                x.requires_grad or any(p.requires_grad for p in params)):
            # nothing to differentiate: the same computation without the autograd Function
            # (its apply costs tens of microseconds of host time per call)
            weights = _module_weights(x, sizes, has_bias, params)
            return _module_forward(x, weights, int(self.stride), sizes)
        return _ModuleWTConv.apply(x, int(self.stride), sizes, has_bias, *params)

    def to_weights(self):
        """Detached copies of the parameters as a :class:`~wtconv_cuda.WTConvWeights`.

        Returns
        -------
        WTConvWeights
            Tensors on the module's device and dtype (read through
            :func:`wtconv_cuda.weights_from_state_dict`).
        """
        state = {k: v.detach().clone() for k, v in self.state_dict().items()}
        return weights_from_state_dict(state)

    @classmethod
    def from_weights(cls, weights, stride=1, *, device=None, dtype=None):
        """Build a layer holding ``weights``.

        Parameters
        ----------
        weights : WTConvWeights
            Arrays of any supported library (NumPy, PyTorch, ...).
        stride : int, default 1
            The layer's stride.
        device, dtype : optional
            Of the new layer (default: PyTorch's defaults).

        Returns
        -------
        WTConv2d
        """
        c, k, levels = weights.channels, weights.kernel_size, weights.levels
        layer = cls(c, c, k, stride=stride, bias=weights.base_bias is not None, wt_levels=levels,
                    device=device, dtype=dtype)
        state = {name: value if torch.is_tensor(value) else torch.as_tensor(to_numpy(value))
                 for name, value in weights_to_state_dict(weights).items()}
        if layer.stride > 1:
            state["stride_filter"] = torch.ones(c, 1, 1, 1)
        layer.load_state_dict(state, strict=True)
        return layer

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        from ..weights import _check_fixed_filter

        c = self.in_channels
        expected = {"wt_filter": haar_filter_tensor(c), "iwt_filter": haar_filter_tensor(c)}
        if self.stride > 1:
            expected["stride_filter"] = np.ones((c, 1, 1, 1))
        for name, values in expected.items():
            key = prefix + name
            if key in state_dict and tuple(state_dict[key].shape) == values.shape:
                try:
                    _check_fixed_filter(key, state_dict[key], values)
                except ValueError as exc:
                    error_msgs.append(str(exc))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

