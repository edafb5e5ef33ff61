"""Framework bindings on a real GPU: zero-copy, streams, tracing, graphs, autocast, devices.

Runs only where ``WTCONV_TEST_GPU=1`` and PyTorch and CuPy see a GPU (JAX
tests additionally need a CUDA build of JAX). Results are compared with the
float64 oracle evaluated on the same rounded inputs, and the three bindings
are compared with each other bit for bit (they plan and launch the same
kernels).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

if os.environ.get("WTCONV_TEST_GPU") != "1":
    pytest.skip("GPU tests run with WTCONV_TEST_GPU=1", allow_module_level=True)

# JAX must not grab most of the GPU memory: PyTorch and CuPy share the device here.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("PyTorch sees no GPU", allow_module_level=True)

from wtconv_cuda import WTConvWeights, reference  # noqa: E402
from wtconv_cuda.bindings import _common  # noqa: E402
from wtconv_cuda.bindings import cupy as wtcupy  # noqa: E402
from wtconv_cuda.bindings.torch import (  # noqa: E402
    WTConv2d,
    wtconv2d,
    wtconv2d_bwd,
    wtconv2d_fwd,
)
from wtconv_cuda.kernels import program  # noqa: E402
from wtconv_cuda.kernels.launch import Problem, plan_plane, planned_specs  # noqa: E402

from ..conftest import autocast_or_off  # noqa: E402

DEV = torch.device("cuda", 0)
#: dtype -> relative tolerance against the oracle on rounded inputs
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
SLEEP_CYCLES = 300_000_000  # ~0.15 s of GPU spinning: long enough to expose a wrong stream


def rel(got, want) -> float:
    got = got.detach().double().cpu().numpy() if torch.is_tensor(got) else np.asarray(got,
                                                                                         np.float64)
    want = np.asarray(want, np.float64)
    assert np.isfinite(got).all(), "non-finite values (unwritten output?)"
    scale = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / (scale if scale > 0 else 1.0))


def random_tensors(c, k, levels, bias, dtype, device=DEV, seed=0, batch=2, hw=(23, 17)):
    """x and WTConvWeights tensors (requires_grad), random and non-zero everywhere."""
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape, low=-1.0, high=1.0):
        t = torch.rand(*shape, generator=gen, dtype=torch.float64) * (high - low) + low
        return t.to(device=device, dtype=dtype).requires_grad_()

    x = draw(batch, c, *hw)
    w = WTConvWeights(draw(c, k, k), draw(c) if bias else None, draw(c, low=0.5, high=1.5),
                      draw(levels, c, 4, k, k), draw(levels, c, 4, low=-0.5, high=0.5))
    return x, w


def oracle(x, w, dy, levels, stride):
    """Float64 oracle on the exact (rounded) values of the tensors."""
    def host(t):
        return None if t is None else t.detach().double().cpu().numpy()

    wr = WTConvWeights(*(host(a) for a in w))
    y = reference.forward(host(x), wr, levels, stride)
    dx, dw = reference.backward(host(x), wr, host(dy), levels, stride)
    return y, dx, dw


def make_layer(c, k, levels, stride=1, bias=True, dtype=torch.float32, device=DEV, seed=0):
    torch.manual_seed(seed)
    layer = WTConv2d(c, c, k, stride=stride, bias=bias, wt_levels=levels)
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-1, 1)
    return layer.to(device=device, dtype=dtype)


# ---------------------------------------------------------------------------
# PyTorch: correctness
# ---------------------------------------------------------------------------

CASES = [  # (B, C, H, W), K, L, stride, bias
    ((2, 3, 17, 23), 5, 3, 1, True),
    ((4, 96, 56, 56), 5, 5, 1, True),
    ((2, 8, 255, 257), 3, 4, 2, False),  # a plane too large for shared memory
    ((1, 4, 1, 7), 7, 2, 1, True),
    ((2, 6, 14, 14), 5, 0, 2, True),
]


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("shape,k,levels,stride,bias", CASES)
def test_torch_matches_oracle(shape, k, levels, stride, bias, dtype):
    b, c, h, width = shape
    x, w = random_tensors(c, k, levels, bias, dtype, batch=b, hw=(h, width))
    y = wtconv2d(x, *w, levels=levels, stride=stride)
    assert y.dtype == dtype and y.device == DEV and y.is_contiguous()
    dy = torch.randn(y.shape, device=DEV).to(dtype)
    y.backward(dy)
    y_ref, dx_ref, dw_ref = oracle(x, w, dy, levels, stride)
    tol = TOL[dtype]
    assert rel(y, y_ref) < tol
    assert rel(x.grad, dx_ref) < tol
    for name, t in w._asdict().items():
        if t is not None:
            assert t.grad.dtype == dtype
            assert rel(t.grad, getattr(dw_ref, name)) < tol, name


def test_float64_on_cuda_raises():
    x, w = random_tensors(2, 3, 1, True, torch.float64)
    with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
        wtconv2d(x, *w)


def test_module_in_bfloat16_and_non_contiguous_input():
    layer = make_layer(8, 5, 2, dtype=torch.bfloat16)
    x = torch.randn(2, 8, 20, 31, device=DEV, dtype=torch.bfloat16)
    xt = x.transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    assert not xt.is_contiguous()
    assert torch.equal(layer(xt), layer(x))
    assert layer(x).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_channels_last_input_equals_nchw_input(dtype):
    """timm's ConvNeXt feeds channels-last float32: one cast writes NCHW (see
    _autocast_input); outputs and every gradient equal the NCHW input's bitwise."""
    layer = make_layer(16, 5, 3, seed=9)
    x = torch.randn(3, 16, 29, 26, device=DEV)  # a plane size torchstep precompiles
    runs = []
    for memory_format in (torch.contiguous_format, torch.channels_last):
        xi = x.clone(memory_format=memory_format).requires_grad_()
        layer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype):
            y = layer(xi)
        assert y.grad_fn.saved_tensors[0].is_contiguous()
        dy = torch.linspace(-1, 1, y.numel(), device=DEV).reshape(y.shape).to(dtype)
        y.backward(dy.to(memory_format=memory_format))  # channels-last dy as well
        runs.append([y.detach(), xi.grad] + [p.grad for p in layer.parameters()])
    for a, b in zip(*runs):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("levels,bias,autocast", [(3, True, None), (1, False, None),
                                                  (0, True, None), (2, True, torch.bfloat16)],
                         ids=str)
def test_module_path_bitwise_equal_to_the_ops(levels, bias, autocast):
    """The module's eager path (parameters as they are, level parameters joined by
    one cat each) gives exactly what the ops give on kernel_weights()."""
    layer = make_layer(16, 5, levels, bias=bias, seed=7)
    x = torch.randn(3, 16, 29, 26, device=DEV, requires_grad=True)
    context = autocast_or_off("cuda", autocast)
    with context:
        y = layer(x)
    assert type(y.grad_fn).__name__ == "_ModuleWTConvBackward"
    dy = torch.randn(y.shape, device=DEV).to(y.dtype)
    y.backward(dy)
    params = list(layer.parameters())
    ours = [x.grad.clone()] + [p.grad.clone() for p in params]

    x.grad = None
    layer.zero_grad(set_to_none=True)
    with context:
        w = layer.kernel_weights()
        if autocast:
            w = [None if t is None else t.to(autocast) for t in w]
        y_op = torch.ops.wtconv_cuda.wtconv2d_fwd(x.to(y.dtype), *w, 1)
    y_op.backward(dy)
    assert torch.equal(y_op, y)
    for a, b in zip([x.grad] + [p.grad for p in params], ours):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)


@pytest.mark.parametrize("levels,autocast", [(2, None), (3, torch.bfloat16)], ids=str)
def test_module_without_gradients_bitwise_equal(levels, autocast):
    """Under no_grad the module skips the autograd Function: the same output, bit for bit,
    on the stage shape whose forward runs on the register kernel (7 x 7) and a split one."""
    for shape in [(64, 32, 7, 7), (64, 384, 14, 14)]:
        layer = make_layer(shape[1], 5, levels, seed=9)
        x = torch.randn(*shape, device=DEV, requires_grad=True)
        context = autocast_or_off("cuda", autocast)
        with context:
            y = layer(x)
            with torch.no_grad():
                y_nograd = layer(x)
        assert y.grad_fn is not None and y_nograd.grad_fn is None
        assert y_nograd.dtype == y.dtype and torch.equal(y_nograd, y.detach())


# ---------------------------------------------------------------------------
# PyTorch: zero-copy, allocation, streams, synchronisation
# ---------------------------------------------------------------------------


class LaunchRecorder:
    """Records the arguments of every raw-pointer launch: replayed programs
    (``program.launch_packed``) and the planner's (``PointerLauncher.call``)."""

    def __init__(self, monkeypatch):
        self.calls = []
        original = _common.PointerLauncher.call
        replay = program.launch_packed

        def call(launcher, kernel, grid, block, args, shared_bytes):
            self.calls.append(dict(args=[int(a) for a in args], stream=launcher._stream.ptr))
            return original(launcher, kernel, grid, block, args, shared_bytes)

        def launch_packed(function, grid, block, shared_bytes, stream, values):
            self.calls.append(dict(args=list(values), stream=int(stream)))
            return replay(function, grid, block, shared_bytes, stream, values)

        monkeypatch.setattr(_common.PointerLauncher, "call", call)
        monkeypatch.setattr(program, "launch_packed", launch_packed)


def plan(problem, backward):
    kernels = _common.device_kernels(0)
    return plan_plane(problem, backward, kernels.shared_limit, kernels.max_slots)


def test_torch_zero_copy_and_torch_owned_memory(monkeypatch):
    c, k, levels = 64, 5, 3
    layer = make_layer(c, k, levels)
    w = WTConvWeights(*(None if a is None else a.detach().contiguous()
                        for a in layer.kernel_weights()))
    x = torch.randn(8, c, 64, 64, device=DEV)
    dy = torch.randn(8, c, 64, 64, device=DEV)
    wtconv2d_bwd(dy, x, *w, 1)  # warm-up: kernels and tables
    layer(x)
    torch.cuda.synchronize()
    recorder = LaunchRecorder(monkeypatch)
    pool = cupy.get_default_memory_pool()
    pool_before = pool.used_bytes()
    problem = Problem(8, c, 64, 64, k, levels, 1, "float32", True)
    slack = 1 << 20  # stacked weights, parameter-sized gradients

    y = layer(x)  # through the module: x itself reaches the kernel
    (fwd,) = recorder.calls
    assert fwd["args"][0] == x.data_ptr() and fwd["args"][2] == x.data_ptr()  # read in place
    assert fwd["args"][1] == y.data_ptr()  # written straight into PyTorch's output
    assert fwd["stream"] == torch.cuda.current_stream().cuda_stream

    recorder.calls.clear()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    y = wtconv2d_fwd(x, *w, 1)
    peak = torch.cuda.max_memory_allocated() - before
    assert recorder.calls[0]["args"][1] == y.data_ptr()
    assert peak <= y.numel() * 4 + plan(problem, False).scratch_floats * 4 + slack

    recorder.calls.clear()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    dx, *grads = wtconv2d_bwd(dy, x, *w, 1)
    peak = torch.cuda.max_memory_allocated() - before
    back = plan(problem, True)
    kernels = _common.device_kernels(0)
    specs = [type(s).__name__ for s in planned_specs(problem, True, kernels.shared_limit,
                                                     kernels.max_slots)]
    assert len(recorder.calls) == len(specs)
    if back.spec.weights_only:  # dx first: the forward on dy, straight into PyTorch's dx
        assert specs[:2] == ["FlipSpec", "PlaneSpec"]
        assert recorder.calls[1]["args"][:2] == [dy.data_ptr(), dx.data_ptr()]
    at = len(specs) - 1 - specs[::-1].index("PlaneSpec")  # the backward's plane kernel
    plane, finalize = recorder.calls[at], recorder.calls[at + 1:]
    assert len(finalize) == (0 if back.spec.fused_finalize else 1)
    assert plane["args"][0] == dy.data_ptr() and plane["args"][2] == x.data_ptr()
    assert plane["args"][1] == dx.data_ptr()
    # base-weight gradient, PyTorch-owned, written by the finalize or the fused plane kernel
    written_by, index = (plane, 11) if back.spec.fused_finalize else (finalize[0], 6)
    assert written_by["args"][index] == grads[0].data_ptr()
    work = (back.partial_floats + back.scratch_floats) * 4
    assert peak <= dx.numel() * 4 + work + slack
    assert pool.used_bytes() == pool_before  # nothing from CuPy's pool


def test_torch_respects_the_current_stream():
    layer = make_layer(16, 5, 3)
    src = torch.randn(4, 16, 96, 96, device=DEV)
    dy_src = torch.randn(4, 16, 96, 96, device=DEV)
    xe = src.clone().requires_grad_()
    expected = layer(xe)
    expected.backward(dy_src)
    expected_dx = xe.grad.clone()
    expected_dw = layer.wavelet_convs[1].weight.grad.clone()
    layer.zero_grad(set_to_none=True)

    x = torch.zeros_like(src, requires_grad=True)
    dy = torch.zeros_like(dy_src)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)  # the writes below land long after the call is queued
        with torch.no_grad():
            x.copy_(src)
            dy.copy_(dy_src)
        y = layer(x)  # must run on `side`, after the copies
        y.backward(dy)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(y, expected)
    assert torch.equal(x.grad, expected_dx)
    assert torch.equal(layer.wavelet_convs[1].weight.grad, expected_dw)


def test_no_host_synchronisation_on_the_hot_path():
    layer = make_layer(8, 5, 2)
    x = torch.randn(2, 8, 40, 40, device=DEV, requires_grad=True)
    layer(x).sum().backward()  # warm-up (first call uploads tables)
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = layer(x)
        y.backward(torch.ones_like(y))
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------------------
# PyTorch: compile, CUDA graphs, autocast, devices
# ---------------------------------------------------------------------------


def small_block(device=DEV):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(16, 16, 1), WTConv2d(16, 16, 5, wt_levels=3),
                               torch.nn.GELU()).to(device)


def param_grads(module):
    return [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile_fullgraph_matches_eager(mode):
    net = small_block()
    x = torch.randn(4, 16, 33, 30, device=DEV)
    eager = net(x)
    eager.square().sum().backward()
    eager_grads = param_grads(net)
    compiled = torch.compile(net, fullgraph=True, mode=mode)
    for _ in range(3):  # reduce-overhead records a CUDA graph after warm-up runs
        net.zero_grad(set_to_none=True)
        y = compiled(x)
        y.square().sum().backward()
        torch.testing.assert_close(y, eager, rtol=1e-4, atol=1e-5)
        for a, b in zip(param_grads(net), eager_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def captured_training_step(layer, static_x, static_dy):
    """``(graph, static_y)``: a CUDA graph of ``layer``'s forward and backward on
    ``static_x`` and ``static_dy``, captured after two warm-up steps on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture
        for _ in range(2):
            layer.zero_grad(set_to_none=True)
            static_x.grad = None
            layer(static_x).backward(static_dy)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    layer.zero_grad(set_to_none=True)
    static_x.grad = None
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
        static_y.backward(static_dy)
    return graph, static_y


def assert_replays_match_eager(graph, layer, static_x, static_dy, static_y, eager):
    """Replay ``graph`` (``captured_training_step``) on two new input sets: each must
    give the bits of ``eager``, a layer of the same kind loaded with ``layer``'s state."""
    eager.load_state_dict(layer.state_dict())
    for seed in (1, 2):
        gen = torch.Generator(device=DEV).manual_seed(seed)
        new_x = torch.randn(static_x.shape, device=DEV, generator=gen)
        new_dy = torch.randn(static_dy.shape, device=DEV, generator=gen)
        with torch.no_grad():
            static_x.copy_(new_x)
            static_dy.copy_(new_dy)
        graph.replay()
        torch.cuda.synchronize()

        xe = new_x.clone().requires_grad_()
        eager.zero_grad(set_to_none=True)
        ye = eager(xe)
        ye.backward(new_dy)
        assert torch.equal(static_y, ye)
        assert torch.equal(static_x.grad, xe.grad)
        for (name, p), q in zip(layer.named_parameters(), eager.parameters()):
            assert torch.equal(p.grad, q.grad), name


def test_cuda_graph_capture_forward_and_backward():
    layer = make_layer(16, 5, 3)
    static_x = torch.randn(4, 16, 40, 36, device=DEV, requires_grad=True)
    static_dy = torch.randn(4, 16, 40, 36, device=DEV)
    graph, static_y = captured_training_step(layer, static_x, static_dy)
    assert_replays_match_eager(graph, layer, static_x, static_dy, static_y, make_layer(16, 5, 3))


def test_first_call_inside_capture_raises_clearly():
    layer = make_layer(5, 3, 1)
    x = torch.randn(1, 5, 37, 41, device=DEV)  # a size not used elsewhere
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="warm-up"):
        with torch.cuda.graph(graph):
            layer(x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_autocast(dtype):
    layer = make_layer(8, 5, 3)
    x = torch.randn(2, 8, 30, 27, device=DEV, requires_grad=True)
    with torch.autocast("cuda", dtype=dtype):
        y = layer(x)
        assert y.dtype == layer.base_conv(x).dtype == dtype
    dy = torch.randn(y.shape, device=DEV).to(dtype)
    y.backward(dy)
    w = WTConvWeights(*(None if a is None else a.detach().to(dtype)
                        for a in layer.kernel_weights()))
    y_ref, dx_ref, dw_ref = oracle(x.detach().to(dtype), w, dy, 3, 1)
    tol = TOL[dtype]
    assert rel(y, y_ref) < tol
    assert x.grad.dtype == torch.float32 and rel(x.grad, dx_ref) < tol
    assert layer.base_conv.weight.grad.dtype == torch.float32
    got = layer.wavelet_convs[0].weight.grad.reshape(8, 4, 5, 5)
    assert rel(got, dw_ref.wavelet_weight[0]) < tol


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device():
    dev1 = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    layer0 = make_layer(8, 5, 3)
    layer1 = make_layer(8, 5, 3, device=dev1)
    x0 = torch.randn(2, 8, 45, 38, device=DEV, requires_grad=True)
    x1 = x0.detach().to(dev1).requires_grad_()
    y0, y1 = layer0(x0), layer1(x1)
    assert y1.device == dev1
    assert torch.cuda.current_device() == 0 and cupy.cuda.runtime.getDevice() == 0
    dy = torch.randn(y0.shape, device=DEV)
    y0.backward(dy)
    y1.backward(dy.to(dev1))
    assert torch.equal(y1.cpu(), y0.cpu())
    assert torch.equal(x1.grad.cpu(), x0.grad.cpu())

    # Stream of device 1 respected while device 0 is current.
    src = x0.detach().to(dev1)
    x = torch.zeros_like(src)
    torch.cuda.synchronize(dev1)
    side = torch.cuda.Stream(device=dev1)
    with torch.cuda.device(dev1), torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.copy_(src)
        y = layer1(x)
    torch.cuda.synchronize(dev1)
    assert torch.equal(y.cpu(), y0.detach().cpu())
    assert torch.cuda.current_device() == 0


# ---------------------------------------------------------------------------
# CuPy binding and DLPack
# ---------------------------------------------------------------------------


def cupy_weights(w):
    return WTConvWeights(*(None if a is None else cupy.from_dlpack(a.detach()) for a in w))


def test_cupy_dlpack_is_zero_copy_and_stream_ordered(monkeypatch):
    x, w = random_tensors(6, 5, 3, True, torch.float32, hw=(64, 48))
    expected = wtconv2d(x, *w, levels=3).detach()
    seen = []
    original = program.launch_packed

    def launch_packed(function, grid, block, shared_bytes, stream, values):
        seen.append(values[0])
        return original(function, grid, block, shared_bytes, stream, values)

    monkeypatch.setattr(program, "launch_packed", launch_packed)
    xd = x.detach()
    y = wtcupy.forward_dlpack(xd, WTConvWeights(*(None if a is None else a.detach() for a in w)))
    assert seen == [xd.data_ptr()]  # the kernel read PyTorch's buffer in place
    assert torch.equal(torch.from_dlpack(y), expected)

    # The producer's pending work is respected: CuPy asks PyTorch (via DLPack's
    # stream argument) to order its current stream before CuPy's.
    target = torch.zeros_like(xd)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        target.copy_(xd)
        y2 = wtcupy.forward_dlpack(target, WTConvWeights(*(None if a is None else a.detach()
                                                          for a in w)))
    cupy.cuda.get_current_stream().synchronize()
    assert bool(cupy.array_equal(y2, y))


def test_cupy_native_and_backward_dlpack():
    x, w = random_tensors(4, 3, 2, False, torch.float32)
    y = wtconv2d(x, *w, levels=2, stride=2)
    dy = torch.randn(y.shape, device=DEV)
    y.backward(dy)
    xc, wc, dyc = cupy.from_dlpack(x.detach()), cupy_weights(w), cupy.from_dlpack(dy)
    tape = wtcupy.Tape()
    yc = wtcupy.forward(xc, wc, stride=2, tape=tape)
    dxc, dwc = wtcupy.backward(tape.saved, dyc)
    assert torch.equal(torch.from_dlpack(yc), y.detach())
    assert torch.equal(torch.from_dlpack(dxc), x.grad)
    dx2, dw2 = wtcupy.backward_dlpack(x.detach(), WTConvWeights(
        *(None if a is None else a.detach() for a in w)), dy, stride=2)
    assert bool(cupy.array_equal(dx2, dxc))
    for name, t in w._asdict().items():
        if t is None:
            assert getattr(dwc, name) is None and getattr(dw2, name) is None
        else:
            assert torch.equal(torch.from_dlpack(getattr(dwc, name)), t.grad), name
            assert bool(cupy.array_equal(getattr(dw2, name), getattr(dwc, name))), name
    with pytest.raises(TypeError, match="cupy.ndarray"):
        wtcupy.forward(x, wc)


# ---------------------------------------------------------------------------
# JAX
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jx():
    jax = pytest.importorskip("jax")
    if jax.default_backend() != "gpu":
        pytest.skip("JAX has no GPU backend here")
    from wtconv_cuda.bindings import jax as wtjax

    return jax, wtjax


def to_jax(jax, t):
    import jax.numpy as jnp

    return None if t is None else jnp.asarray(t.detach().cpu().numpy())


@pytest.mark.parametrize("shape,k,levels,stride,bias", CASES[:3])
def test_jax_torch_cupy_agree_and_match_oracle(jx, shape, k, levels, stride, bias):
    jax, wtjax = jx
    b, c, h, width = shape
    x, w = random_tensors(c, k, levels, bias, torch.float32, batch=b, hw=(h, width))
    y = wtconv2d(x, *w, levels=levels, stride=stride)
    dy = torch.randn(y.shape, device=DEV)
    y.backward(dy)
    y_ref, dx_ref, dw_ref = oracle(x, w, dy, levels, stride)
    assert rel(y, y_ref) < 1e-5 and rel(x.grad, dx_ref) < 1e-5

    xj = to_jax(jax, x)
    wj = WTConvWeights(*(to_jax(jax, a) for a in w))
    dyj = to_jax(jax, dy)
    yt = y.detach().cpu().numpy()

    def f(x, w):
        return wtjax.wtconv2d(x, w, levels=levels, stride=stride)

    results = {
        # The eager DLPack path, called directly.
        "dlpack": (wtjax._forward_dlpack(xj, wj, levels, stride),
                   *wtjax._backward_dlpack(xj, wj, dyj, levels, stride)),
        # Under jit: buffer_callback on XLA's stream with XLA-allocated work buffers.
        "jit": (jax.jit(f)(xj, wj),
                *jax.jit(lambda x, w, dy: jax.vjp(f, x, w)[1](dy))(xj, wj, dyj)),
    }
    before = wtjax.eager_mechanism()
    try:
        wtjax.set_eager_mechanism("callback")
        yj, vjp = jax.vjp(f, xj, wj)
        results["eager callback"] = (yj, *vjp(dyj))
        wtjax.set_eager_mechanism("dlpack")
        yj = f(xj, wj)  # eager, untransformed: the DLPack path
        results["eager default"] = (yj, *jax.vjp(f, xj, wj)[1](dyj))
    finally:
        wtjax.set_eager_mechanism(before)

    for name, (yj, dxj, dwj) in results.items():
        np.testing.assert_array_equal(np.asarray(yj), yt, err_msg=name)
        np.testing.assert_array_equal(np.asarray(dxj), x.grad.cpu().numpy(), err_msg=name)
        for field, t in w._asdict().items():
            got = getattr(dwj, field)
            if t is None:
                assert got is None
            else:
                np.testing.assert_array_equal(np.asarray(got), t.grad.cpu().numpy(),
                                              err_msg=f"{name} {field}")

    # CuPy's native path gives the same bits as well.
    yc = wtcupy.forward(cupy.from_dlpack(x.detach()), cupy_weights(w), levels, stride)
    np.testing.assert_array_equal(cupy.asnumpy(yc), yt)


def test_jax_jit_uses_xla_buffers_only(jx):
    jax, wtjax = jx
    import jax.numpy as jnp

    x, w = random_tensors(32, 5, 3, True, torch.float32, batch=4, hw=(255, 257))
    xj = to_jax(jax, x)
    wj = WTConvWeights(*(to_jax(jax, a) for a in w))
    loss = jax.jit(jax.grad(lambda x, w: jnp.sum(wtjax.wtconv2d(x, w) ** 2), argnums=(0, 1)))
    jax.block_until_ready(loss(xj, wj))  # warm-up: compile, kernels, tables
    pool = cupy.get_default_memory_pool()
    before = pool.used_bytes()
    jax.block_until_ready(loss(xj, wj))
    assert pool.used_bytes() == before  # partials and scratch were XLA's extra results


def test_jax_bfloat16_and_inputs_untouched(jx):
    jax, wtjax = jx
    import jax.numpy as jnp

    x, w = random_tensors(6, 5, 2, True, torch.float32)
    xj = to_jax(jax, x).astype(jnp.bfloat16)
    wj = WTConvWeights(*(to_jax(jax, a).astype(jnp.bfloat16) for a in w))
    before = [np.asarray(a).copy() for a in (xj, *wj)]
    y = wtjax.wtconv2d(xj, wj)
    dx = jax.grad(lambda x: jnp.sum(wtjax.wtconv2d(x, wj).astype(jnp.float32)))(xj)
    assert y.dtype == dx.dtype == jnp.bfloat16
    wr = WTConvWeights(*(np.asarray(a, np.float64) for a in wj))
    assert rel(np.asarray(y, np.float64), reference.forward(np.asarray(xj, np.float64), wr)) < 1e-2
    for a, b in zip((xj, *wj), before):
        np.testing.assert_array_equal(np.asarray(a), b)
