"""JAX binding: ``wtconv2d`` with a ``custom_vjp``, eager and under ``jax.jit``.

Mechanisms
    *Under tracing* (``jax.jit``, ``jax.grad``, ``vmap``, ...) and for
    bfloat16, each forward or backward is one
    :func:`jax.experimental.buffer_callback.buffer_callback` call: XLA hands
    the Python callback its device buffers (``__cuda_array_interface__``) and
    its compute stream, and the callback launches the fused kernels on that
    stream with the buffers' raw addresses. It is zero-copy both ways: inputs
    are read in place (never written), outputs are buffers that XLA allocated
    for the callback's results, and the weight-gradient partials and global
    scratch are extra (discarded) results, so XLA allocates them too. Each
    problem's launches are planned once and replayed with the buffers'
    addresses (:mod:`wtconv_cuda.kernels.program`). No host synchronisation;
    the cost is the Python callback (a few tens of microseconds of host time
    per call; see ``benchmarks/binding_overhead.py``).
    XLA treats the call as opaque, so it is not fused and does not enter XLA's
    CUDA-graph command buffers (``command_buffer_compatible=False``: the first
    call of a shape may compile kernels and upload tables).
    ``jax.pure_callback`` would instead copy every array to the host and back;
    ``jax.ffi`` needs a compiled C++ handler.

    *Eager* float32/float16 calls on a GPU (concrete arrays, the default
    ``eager_mechanism() == "dlpack"``) exchange the arrays with CuPy through
    DLPack (zero-copy) and run :func:`wtconv_cuda.forward` /
    :func:`wtconv_cuda.backward` on JAX's stream for external work
    (``Device.get_stream_for_external_ready_events()``, the stream JAX uses
    for DLPack hand-offs); outputs come from CuPy's pool on that stream and
    are handed to JAX through DLPack. The DLPack stream handshake orders
    everything with JAX's work, without host synchronisation; the inputs are
    held until an event recorded after the kernels has passed, since JAX
    would otherwise recycle a dropped input's memory in its own stream order.
    ``set_eager_mechanism("callback")`` routes eager calls through the
    callback as well (then XLA allocates the outputs and the kernels run on
    XLA's compute stream).

    On the CPU, both mechanisms run the float64 oracle
    :mod:`wtconv_cuda.reference` on the host buffers (through the callback)
    and round once to the input dtype.

Requires JAX with ``jax.experimental.buffer_callback`` (0.7 or newer); the GPU
path also needs CuPy.
"""

from __future__ import annotations

import collections
import functools

import numpy as np

import jax
import jax.dlpack
import jax.numpy as jnp
from jax.experimental.buffer_callback import buffer_callback

from .. import reference
from ..weights import WTConvWeights
from . import _common

__all__ = ["wtconv2d", "eager_mechanism", "set_eager_mechanism"]

#: Kernel storage names of the dtypes the GPU path accepts.
GPU_STORAGE = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}
_DLPACK_DTYPES = ("float32", "float16")
_CPU_DTYPES = ("float16", "bfloat16", "float32", "float64")
_DL_CPU = 1  # DLDeviceType.kDLCPU

_MECHANISMS = ("dlpack", "callback")
_eager = ["dlpack"]


def eager_mechanism() -> str:
    """How eager GPU calls reach the kernels.

    Returns
    -------
    str
        ``"dlpack"`` (default) or ``"callback"``; see the module docstring.
    """
    return _eager[0]


def set_eager_mechanism(name: str) -> None:
    """Choose how eager (untraced) GPU calls reach the kernels.

    Parameters
    ----------
    name : {"dlpack", "callback"}
        ``"dlpack"``: CuPy views of the JAX arrays, CuPy-allocated outputs
        handed back through DLPack. ``"callback"``: the same
        ``buffer_callback`` path as under ``jax.jit``.

    Raises
    ------
    ValueError
        Unknown name.
    """
    if name not in _MECHANISMS:
        raise ValueError(f"eager mechanism must be one of {_MECHANISMS}, got {name!r}")
    _eager[0] = name


# ---------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------


def _leaves(w: WTConvWeights) -> tuple:
    return tuple(a for a in w if a is not None)


def _on_gpu(x) -> bool:
    """Whether ``x`` will run on a GPU, as far as it is known at trace time."""
    if isinstance(x, jax.core.Tracer) or not isinstance(x, jax.Array):
        return jax.default_backend() == "gpu"
    return any(d.platform == "gpu" for d in x.devices())


def _check(x, w, levels, stride) -> _common.LayerSizes:
    if not isinstance(w, WTConvWeights):
        raise TypeError(f"w must be a WTConvWeights, got {type(w).__name__}")
    sizes = _common.check_layer(
        tuple(x.shape), tuple(w.base_weight.shape),
        None if w.base_bias is None else tuple(w.base_bias.shape), tuple(w.base_scale.shape),
        tuple(w.wavelet_weight.shape), tuple(w.wavelet_scale.shape), levels, stride)
    dtype = np.dtype(x.dtype).name
    for name, a in w._asdict().items():
        if a is not None and np.dtype(a.dtype).name != dtype:
            raise TypeError(f"w.{name} has dtype {np.dtype(a.dtype).name} but x has dtype "
                            f"{dtype}; they must match")
    if dtype not in _CPU_DTYPES:
        raise TypeError(f"x has dtype {dtype}; expected float16, bfloat16, float32 or float64")
    if dtype not in GPU_STORAGE and _on_gpu(x):
        raise TypeError(f"x has dtype {dtype}; on a GPU the kernels support float32, float16 "
                        "and bfloat16 (use CPU arrays for float64)")
    return sizes


def wtconv2d(x, w, levels=None, stride=1):
    """Apply the WTConv operator of SPEC.md, differentiable in ``x`` and every weight.

    Parameters
    ----------
    x : jax.Array, shape (B, C, H, W)
        Input: float32, float16 or bfloat16 (also float64 on the CPU).
    w : WTConvWeights
        JAX arrays of ``x``'s dtype: ``base_weight (C, K, K)``, ``base_bias
        (C,)`` or None, ``base_scale (C,)``, ``wavelet_weight (L, C, 4, K,
        K)``, ``wavelet_scale (L, C, 4)``; odd ``K``.
    levels : int or None, default None
        ``None`` takes ``L`` from the weights; an int must equal it.
    stride : int, default 1
        Output subsampling factor ``s >= 1``.

    Returns
    -------
    jax.Array, shape (B, C, ceil(H/s), ceil(W/s))
        ``x``'s dtype. Its VJP gives the gradients of ``x`` and of every
        weight (``None`` for an absent bias).

    Raises
    ------
    TypeError
        ``w`` not a :class:`~wtconv_cuda.WTConvWeights`; mismatched or
        unsupported dtypes; ``levels``/``stride`` not an int.
    ValueError
        Inconsistent shapes, even ``K``, ``levels`` not matching the weights,
        ``stride < 1``.
    """
    sizes = _check(x, w, levels, stride)
    return _wtconv(x, w, sizes.levels, int(stride))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _wtconv(x, w, levels, stride):
    return _forward(x, w, levels, stride)


def _wtconv_fwd(x, w, levels, stride):
    return _forward(x, w, levels, stride), (x, w)


def _wtconv_bwd(levels, stride, residuals, dy):
    x, w = residuals
    return _backward(x, w, dy, levels, stride)


_wtconv.defvjp(_wtconv_fwd, _wtconv_bwd)


# ---------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------


def _concrete_gpu(arrays) -> bool:
    for a in arrays:
        if isinstance(a, jax.core.Tracer) or not isinstance(a, jax.Array):
            return False
    devices = arrays[0].devices()
    return len(devices) == 1 and next(iter(devices)).platform == "gpu"


def _use_dlpack(x, w, *more) -> bool:
    return (_eager[0] == "dlpack" and np.dtype(x.dtype).name in _DLPACK_DTYPES
            and _concrete_gpu((x, *_leaves(w), *more)))


def _forward(x, w, levels, stride):
    b, c, h, width = x.shape
    ho, wo = _common.out_hw(h, width, stride)
    if b == 0:
        return jnp.zeros((0, c, ho, wo), x.dtype)
    if _use_dlpack(x, w):
        return _forward_dlpack(x, w, levels, stride)
    has_bias = w.base_bias is not None
    scratch = _scratch_sizes(x, w, levels, stride, backward=False)
    results = (jax.ShapeDtypeStruct((b, c, ho, wo), x.dtype),
               *(jax.ShapeDtypeStruct((n,), jnp.float32) for n in scratch))
    call = buffer_callback(_forward_callback(levels, stride, has_bias), results,
                           vmap_method="sequential")
    return call(x, *_leaves(w))[0]


def _backward(x, w, dy, levels, stride):
    has_bias = w.base_bias is not None
    if x.shape[0] == 0:
        dw = WTConvWeights(*(None if a is None else jnp.zeros(a.shape, a.dtype) for a in w))
        return jnp.zeros(x.shape, x.dtype), dw
    dy = dy.astype(x.dtype)
    if _use_dlpack(x, w, dy):
        return _backward_dlpack(x, w, dy, levels, stride)
    scratch = _scratch_sizes(x, w, levels, stride, backward=True)
    results = (jax.ShapeDtypeStruct(x.shape, x.dtype),
               *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in _leaves(w)),
               *(jax.ShapeDtypeStruct((n,), jnp.float32) for n in scratch))
    call = buffer_callback(_backward_callback(levels, stride, has_bias), results,
                           vmap_method="sequential")
    out = call(dy, x, *_leaves(w))
    dx, grads = out[0], list(out[1:1 + len(_leaves(w))])
    bw, bb, bs, ww, ws = _unpack(grads, has_bias)
    return dx, WTConvWeights(bw, bb, bs, ww, ws)


def _unpack(weights, has_bias):
    if has_bias:
        bw, bb, bs, ww, ws = weights
    else:
        bw, bs, ww, ws = weights
        bb = None
    return bw, bb, bs, ww, ws


# ---------------------------------------------------------------------------
# Trace-time launch plan: the work buffers XLA allocates as extra results
# ---------------------------------------------------------------------------


def _gpu_kernels_for_tracing():
    if jax.default_backend() != "gpu":
        return None
    try:
        import cupy  # noqa: F401
    except ImportError:
        return None
    device = jax.devices()[0]
    index = device.local_hardware_id if device.local_hardware_id is not None else device.id
    return _common.device_kernels(index)


def _scratch_sizes(x, w, levels, stride, backward) -> tuple:
    """float32 work-buffer sizes the kernels will request (empty off the GPU)."""
    dtype = np.dtype(x.dtype).name
    if dtype not in GPU_STORAGE:
        return ()
    kernels = _gpu_kernels_for_tracing()
    if kernels is None:
        return ()
    from ..kernels import launch as kernel_launch

    b, c, h, width = x.shape
    problem = kernel_launch.Problem(b, c, h, width, w.kernel_size, levels, stride,
                                    GPU_STORAGE[dtype], w.base_bias is not None)
    return tuple(kernel_launch.work_buffers(problem, backward, kernels.shared_limit,
                                            kernels.max_slots))


# ---------------------------------------------------------------------------
# The callbacks (run by XLA at execution time)
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _forward_callback(levels, stride, has_bias):
    # One function object per configuration: JAX caches compiled calls by it.
    def callback(ctx, out, x, *weights):
        _run_forward(ctx, out, x, weights, levels, stride, has_bias)
    return callback


@functools.lru_cache(maxsize=None)
def _backward_callback(levels, stride, has_bias):
    def callback(ctx, out, dy, x, *weights):
        _run_backward(ctx, out, dy, x, weights, levels, stride, has_bias)
    return callback


def _host(buffer) -> np.ndarray:
    a = np.asarray(buffer)
    if a.dtype.name == "bfloat16":
        a = a.astype(np.float32)
    return a


def _store(buffer, values) -> None:
    target = np.asarray(buffer)
    target[...] = np.asarray(values).astype(target.dtype)


def _is_host(buffer) -> bool:
    kind, _ = buffer.__dlpack_device__()
    return int(kind) == _DL_CPU


def _device_id(buffer) -> int:
    return int(buffer.__dlpack_device__()[1])


def _stream_of(ctx) -> int:
    return int(ctx.stream)


def _address(buffer) -> np.uint64:
    # A zero-size buffer (no wavelet levels) may report a null address.
    return np.uint64(buffer.__cuda_array_interface__["data"][0] or 0)


def _run_forward(ctx, out, x, weights, levels, stride, has_bias):
    y, *scratch = out
    if _is_host(x):
        w = WTConvWeights(*(None if a is None else _host(a)
                            for a in _unpack(weights, has_bias)))
        _store(y, reference.forward(_host(x), w, levels, stride))
        return
    bw, bb, bs, ww, ws = _unpack(weights, has_bias)
    _launch(ctx, scratch, x, weights, levels, stride, has_bias, False,
            (_address(x), _address(y), *_kernel_weights(bw, bb, bs, ww, ws)))


def _run_backward(ctx, out, dy, x, weights, levels, stride, has_bias):
    n = len(weights)
    dx, grads, scratch = out[0], out[1:1 + n], out[1 + n:]
    if _is_host(x):
        w = WTConvWeights(*(None if a is None else _host(a)
                            for a in _unpack(weights, has_bias)))
        dx_ref, dw = reference.backward(_host(x), w, _host(dy), levels, stride)
        _store(dx, dx_ref)
        for target, values in zip(grads, (a for a in dw if a is not None)):
            _store(target, values)
        return
    bw, bb, bs, ww, ws = _unpack(weights, has_bias)
    gw, gb, gs, gww, gws = _unpack(grads, has_bias)
    _launch(ctx, scratch, x, weights, levels, stride, has_bias, True,
            (_address(x), _address(dy), _address(dx), *_kernel_weights(bw, bb, bs, ww, ws),
             *_kernel_weights(gw, gb, gs, gww, gws)))


def _kernel_weights(bw, bb, bs, ww, ws) -> tuple:
    """Addresses of the five weight (or gradient) buffers; a bias-free layer passes
    ``base_scale`` where the kernels take the bias (they do not read it)."""
    return (_address(bw), _address(bs if bb is None else bb), _address(bs), _address(ww),
            _address(ws))


def _launch(ctx, scratch, x, weights, levels, stride, has_bias, backward, addresses):
    """Queue one call's launches on XLA's stream: its recorded program
    (:mod:`wtconv_cuda.kernels.program`), else through the planner. Work buffers come
    from XLA's extra results (:class:`_ScratchPool`); ``addresses`` in the slot order of
    :func:`~wtconv_cuda.kernels.program.run_direct`."""
    from ..kernels.launch import Problem
    from ..kernels.driver import side_stream
    from ..kernels.program import run_direct

    dtype = np.dtype(x.dtype).name
    if dtype not in GPU_STORAGE:
        raise TypeError(f"x has dtype {dtype}; on a GPU the kernels support float32, float16 "
                        "and bfloat16")
    device_id = _device_id(x)
    b, c, h, width = x.shape
    problem = Problem(b, c, h, width, weights[0].shape[-1], levels, stride, GPU_STORAGE[dtype],
                      has_bias)
    kernels = _common.device_kernels(device_id)
    pointer = _stream_of(ctx)
    stream = _common.stream_handle(device_id, pointer)
    pool = _ScratchPool(scratch, device_id, stream)
    make_table = _cupy_table(device_id)
    with _common.DeviceScope(device_id):
        program = kernels.program(problem, backward, make_table)
        if program is None:
            launcher = _common.PointerLauncher(kernels, stream, pool.allocate, make_table)
            run_direct(launcher, problem, backward, addresses)
        else:
            program.run(addresses, pool.allocate, pointer,
                        side_stream(device_id) if program.forks else None)


class _ScratchPool:
    """Hands out the XLA-allocated work buffers (best fit); falls back to CuPy's pool."""

    __slots__ = ("_free", "_device_id", "_stream")

    def __init__(self, buffers, device_id, stream):
        self._free = [(int(b.shape[0]), _address(b)) for b in buffers]
        self._device_id = device_id
        self._stream = stream

    def allocate(self, n):
        fits = [i for i, (size, _) in enumerate(self._free) if size >= n]
        if fits:
            best = min(fits, key=lambda i: self._free[i][0])
            return None, self._free.pop(best)[1]
        import cupy  # not planned at trace time (another GPU model?): stream-ordered CuPy memory

        with cupy.cuda.Device(self._device_id), self._stream:
            array = cupy.empty(n, dtype=cupy.float32)
        return array, array.data.ptr


_table_makers: dict = {}


def _cupy_table(device_id):
    make = _table_makers.get(device_id)
    if make is None:
        def make(values, _device_id=device_id):
            import cupy

            with cupy.cuda.Device(_device_id):
                table = cupy.asarray(np.array(values, dtype=np.int64))
                cupy.cuda.get_current_stream().synchronize()  # read next on XLA's stream
            return table, table.data.ptr

        _table_makers[device_id] = make
    return make


# ---------------------------------------------------------------------------
# Eager GPU path through DLPack and CuPy
# ---------------------------------------------------------------------------

_jax_streams: dict = {}


def _jax_stream(array):
    device = next(iter(array.devices()))
    stream = _jax_streams.get(device.id)
    if stream is None:
        index = device.local_hardware_id if device.local_hardware_id is not None else device.id
        pointer = device.get_stream_for_external_ready_events()
        stream = _jax_streams[device.id] = (index, _common.stream_handle(index, int(pointer)))
    return stream


def _to_cupy(w: WTConvWeights) -> WTConvWeights:
    import cupy

    return WTConvWeights(*(None if a is None else cupy.from_dlpack(a) for a in w))


class _KeepAlive:
    """Keeps a call's JAX inputs alive until the kernels that read them have run.

    JAX frees a buffer in the order of its own compute stream; it does not
    know that our stream still reads an array exported through DLPack. So
    each DLPack call records an event on its stream and holds its inputs until
    that event has passed; finished entries are dropped on later calls (an
    event query, no synchronisation).
    """

    def __init__(self):
        self._pending = collections.deque()

    def hold(self, stream, arrays) -> None:
        import cupy

        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        self._pending.append((event, arrays))
        while self._pending and self._pending[0][0].done:
            self._pending.popleft()

    def __len__(self):
        return len(self._pending)


_keep_alive = _KeepAlive()


def _forward_dlpack(x, w, levels, stride):
    import cupy

    from .. import api

    index, stream = _jax_stream(x)
    with cupy.cuda.Device(index), stream:
        y = api.forward(cupy.from_dlpack(x), _to_cupy(w), levels, stride)
        _keep_alive.hold(stream, (x, w))
        return jax.dlpack.from_dlpack(y)


def _backward_dlpack(x, w, dy, levels, stride):
    import cupy

    from .. import api

    index, stream = _jax_stream(x)
    with cupy.cuda.Device(index), stream:
        saved = api.Saved(cupy.from_dlpack(x), _to_cupy(w), levels, stride)
        dx, dw = api.backward(saved, cupy.from_dlpack(dy))
        _keep_alive.hold(stream, (x, w, dy))
        return (jax.dlpack.from_dlpack(dx),
                WTConvWeights(*(None if g is None else jax.dlpack.from_dlpack(g) for g in dw)))
