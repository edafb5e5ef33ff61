"""PyTorch binding on the CPU: oracle agreement, published checkpoints, autograd, tracing."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import wtconv_cuda as wt  # noqa: E402
from wtconv_cuda import WTConvWeights, reference  # noqa: E402
from wtconv_cuda.bindings.torch import (  # noqa: E402
    WTConv2d,
    wtconv2d,
    wtconv2d_bwd,
    wtconv2d_fwd,
)

from ..conftest import autocast_or_off, random_weights  # noqa: E402


def as_torch(w: WTConvWeights, dtype=torch.float64, requires_grad=False) -> WTConvWeights:
    return WTConvWeights(*(None if a is None else
                           torch.tensor(np.asarray(a), dtype=dtype, requires_grad=requires_grad)
                           for a in w))


def as_numpy(w: WTConvWeights) -> WTConvWeights:
    return WTConvWeights(*(None if a is None else a.detach().double().numpy() for a in w))


def rel(got, want):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    scale = np.linalg.norm(want)
    return np.linalg.norm(got - want) / (scale if scale > 0 else 1.0)


# ---------------------------------------------------------------------------
# An independent implementation of the published layer (standard torch ops)
# ---------------------------------------------------------------------------

#: The published layer stores its Haar taps as float32(1/sqrt(2))**2.
PUBLISHED_TAP = float(np.float32(np.float32(1 / np.sqrt(2)) ** 2))


class PublishedScale(torch.nn.Module):
    def __init__(self, dims, init):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full(dims, init))

    def forward(self, x):
        return x * self.weight


class PublishedWTConv2d(torch.nn.Module):
    """The published layer's structure, written from SPEC.md with conv2d / conv_transpose2d."""

    def __init__(self, c, k=5, stride=1, bias=True, levels=1):
        super().__init__()
        signs = np.sign(wt.weights.haar_filter_tensor(c))
        filters = torch.tensor(signs * PUBLISHED_TAP, dtype=torch.float32)
        self.wt_filter = torch.nn.Parameter(filters.clone(), requires_grad=False)
        self.iwt_filter = torch.nn.Parameter(filters.clone(), requires_grad=False)
        self.base_conv = torch.nn.Conv2d(c, c, k, padding="same", groups=c, bias=bias)
        self.base_scale = PublishedScale((1, c, 1, 1), 1.0)
        self.wavelet_convs = torch.nn.ModuleList(
            torch.nn.Conv2d(4 * c, 4 * c, k, padding="same", groups=4 * c, bias=False)
            for _ in range(levels))
        self.wavelet_scale = torch.nn.ModuleList(
            PublishedScale((1, 4 * c, 1, 1), 0.1) for _ in range(levels))
        self.stride, self.levels, self.c = stride, levels, c
        if stride > 1:
            self.stride_filter = torch.nn.Parameter(torch.ones(c, 1, 1, 1), requires_grad=False)

    def forward(self, x):
        c = self.c
        lows, highs, grids = [], [], []
        cur = x
        for i in range(self.levels):
            grids.append(cur.shape[-2:])
            cur = F.pad(cur, (0, cur.shape[3] % 2, 0, cur.shape[2] % 2))
            b, _, h, w = cur.shape
            sub = F.conv2d(cur, self.wt_filter.to(x.dtype), stride=2, groups=c)
            cur = sub.reshape(b, c, 4, h // 2, w // 2)[:, :, 0]
            z = self.wavelet_scale[i](self.wavelet_convs[i](sub)).reshape(b, c, 4, h // 2, w // 2)
            lows.append(z[:, :, 0])
            highs.append(z[:, :, 1:])
        nxt = 0
        for i in reversed(range(self.levels)):
            u = torch.cat([(lows.pop() + nxt).unsqueeze(2), highs.pop()], 2)
            b, _, _, h, w = u.shape
            grid = grids.pop()
            nxt = F.conv_transpose2d(u.reshape(b, 4 * c, h, w), self.iwt_filter.to(x.dtype),
                                     stride=2, groups=c)[:, :, :grid[0], :grid[1]]
        y = self.base_scale(self.base_conv(x)) + nxt
        if self.stride > 1:
            y = F.conv2d(y, self.stride_filter.to(x.dtype), stride=self.stride, groups=c)
        return y


def randomise(module, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


# ---------------------------------------------------------------------------
# Oracle agreement
# ---------------------------------------------------------------------------

CASES = [
    # (B, C, H, W), K, L, stride, bias
    ((2, 3, 17, 23), 5, 3, 1, True),
    ((1, 2, 9, 8), 3, 2, 2, False),
    ((2, 4, 7, 7), 5, 0, 1, True),
    ((1, 3, 1, 6), 3, 4, 3, True),
]


@pytest.mark.parametrize("shape,k,levels,stride,bias", CASES)
def test_functional_matches_oracle_float64(rng, shape, k, levels, stride, bias):
    w = random_weights(rng, shape[1], k, levels, bias)
    x = rng.standard_normal(shape)
    tw = as_torch(w, requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    y = wtconv2d(tx, *tw, levels=levels, stride=stride)
    y_ref = reference.forward(x, w, levels, stride)
    assert y.dtype == torch.float64 and rel(y.detach(), y_ref) < 1e-13
    dy = rng.standard_normal(y.shape)
    y.backward(torch.tensor(dy))
    dx_ref, dw_ref = reference.backward(x, w, dy, levels, stride)
    assert rel(tx.grad, dx_ref) < 1e-13
    for name, t in tw._asdict().items():
        want = getattr(dw_ref, name)
        if t is None:
            assert want is None
        else:
            assert rel(t.grad, want) < 1e-13, name


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 1e-3),
                                       (torch.bfloat16, 1e-2)])
def test_module_matches_oracle_lower_precision(rng, dtype, tol):
    layer = randomise(WTConv2d(4, 4, 5, stride=2, wt_levels=3), 3).to(dtype)
    x = torch.tensor(rng.standard_normal((2, 4, 19, 16))).to(dtype).requires_grad_()
    y = layer(x)
    assert y.dtype == dtype and y.shape == (2, 4, 10, 8)
    w = as_numpy(layer.to_weights())
    xr = x.detach().double().numpy()
    assert rel(y.detach().double(), reference.forward(xr, w, 3, 2)) < tol
    dy = torch.tensor(rng.standard_normal(y.shape)).to(dtype)
    y.backward(dy)
    _, dw = reference.backward(xr, w, dy.double().numpy(), 3, 2)
    assert layer.wavelet_convs[2].weight.grad.dtype == dtype
    got = layer.wavelet_convs[2].weight.grad.double().numpy().reshape(4, 4, 5, 5)
    assert rel(got, dw.wavelet_weight[2]) < tol


def test_empty_batch():
    layer = WTConv2d(3, 3, 3, wt_levels=2)
    x = torch.zeros(0, 3, 9, 9, requires_grad=True)
    y = layer(x)
    assert y.shape == (0, 3, 9, 9)
    y.sum().backward()
    assert torch.count_nonzero(layer.wavelet_convs[0].weight.grad) == 0


def test_gradcheck_float64():
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)

    c, k, levels = 2, 3, 2
    args = (randn(1, c, 7, 6), randn(c, k, k), randn(c), randn(c), randn(levels, c, 4, k, k),
            randn(levels, c, 4))
    assert torch.autograd.gradcheck(lambda *a: wtconv2d(*a, levels=levels, stride=2), args)
    no_bias = (args[0], args[1], None, *args[3:])
    assert torch.autograd.gradcheck(lambda x, bw, bs, ww, ws: wtconv2d(x, bw, None, bs, ww, ws),
                                    tuple(a for a in no_bias if a is not None))


def test_gradcheck_module_parameters():
    layer = randomise(WTConv2d(2, 2, 3, wt_levels=2, dtype=torch.float64), 1)
    x = torch.randn(1, 2, 6, 5, dtype=torch.float64, requires_grad=True)
    params = [p for p in layer.parameters()]

    def run(x, *values):
        out = torch.func.functional_call(layer, dict(zip([n for n, _ in layer.named_parameters()],
                                                         values)), (x,))
        return out

    assert torch.autograd.gradcheck(run, (x, *params))


# ---------------------------------------------------------------------------
# The published layer: names, counts, checkpoints
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("c,k,levels,bias,stride", [(8, 5, 1, True, 1), (3, 7, 4, False, 2),
                                                    (5, 3, 0, True, 1)])
def test_state_dict_names_shapes_and_parameter_count(c, k, levels, bias, stride):
    layer = WTConv2d(c, c, k, stride=stride, bias=bias, wt_levels=levels)
    published = PublishedWTConv2d(c, k, stride, bias, levels)
    ours = {name: tuple(t.shape) for name, t in layer.state_dict().items()}
    theirs = {name: tuple(t.shape) for name, t in published.state_dict().items()}
    assert ours == theirs
    assert ours["base_conv.weight"] == (c, 1, k, k)
    assert ("stride_filter" in ours) == (stride > 1)
    expected = c * k * k + (c if bias else 0) + c + levels * (4 * c * k * k + 4 * c)
    assert sum(p.numel() for p in layer.parameters()) == expected
    assert sum(p.numel() for p in published.parameters() if p.requires_grad) == expected
    assert all(p.requires_grad for p in layer.parameters())


@pytest.mark.parametrize("stride,bias,levels", [(1, True, 3), (2, False, 2), (1, True, 0)])
def test_published_checkpoint_loads_strict_and_matches(stride, bias, levels):
    c = 3
    published = randomise(PublishedWTConv2d(c, 5, stride, bias, levels).double(), 7)
    layer = WTConv2d(c, c, 5, stride=stride, bias=bias, wt_levels=levels, dtype=torch.float64)
    result = layer.load_state_dict(published.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys

    x = torch.randn(2, c, 21, 18, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y, y_pub = layer(x), published(x2)
    # The published taps are 0.49999997, not 0.5: a relative difference ~1e-7 per level.
    assert rel(y.detach(), y_pub.detach()) < 1e-6
    dy = torch.randn(y.shape, dtype=torch.float64)
    y.backward(dy)
    y_pub.backward(dy)
    assert rel(x.grad, x2.grad) < 1e-6
    ours = dict(layer.named_parameters())
    for name, p in published.named_parameters():
        if p.requires_grad:
            assert rel(ours[name].grad, p.grad) < 1e-6, name

    # And back: our state dict loads into the published structure.
    assert not PublishedWTConv2d(c, 5, stride, bias, levels).double().load_state_dict(
        layer.state_dict(), strict=True).missing_keys


def test_checkpoint_under_a_prefix_and_weights_round_trip():
    w = wt.init_weights(4, 5, 2, seed=3)
    state = {k: torch.as_tensor(v) for k, v in
             wt.weights_to_state_dict(w, prefix="stages.0.blocks.1.dwconv").items()}
    net = torch.nn.Module()
    net.stages = torch.nn.ModuleList([torch.nn.Module()])
    net.stages[0].blocks = torch.nn.ModuleList([torch.nn.Module(), torch.nn.Module()])
    net.stages[0].blocks[1].dwconv = WTConv2d(4, 4, 5, wt_levels=2)
    net.load_state_dict(state, strict=True)
    back = net.stages[0].blocks[1].dwconv.to_weights()
    for a, b in zip(back, w):
        np.testing.assert_array_equal(a.numpy(), b)
    layer = WTConv2d.from_weights(w, stride=2)
    assert layer.stride == 2 and "stride_filter" in layer.state_dict()
    for a, b in zip(layer.to_weights(), w):
        np.testing.assert_array_equal(a.numpy(), b)


def test_non_haar_filters_are_rejected_on_load():
    layer = WTConv2d(2, 2, 3)
    state = layer.state_dict()
    state["wt_filter"] = torch.rand(state["wt_filter"].shape)
    with pytest.raises(RuntimeError, match="Haar"):
        WTConv2d(2, 2, 3).load_state_dict(state)


def test_constructor_errors():
    with pytest.raises(ValueError, match="out_channels"):
        WTConv2d(4, 8)
    with pytest.raises(ValueError, match="db2"):
        WTConv2d(4, 4, wt_type="db2")
    with pytest.raises(ValueError, match="odd"):
        WTConv2d(4, 4, kernel_size=4)
    with pytest.raises(ValueError, match="stride"):
        WTConv2d(4, 4, stride=0)
    with pytest.raises(TypeError, match="wt_levels"):
        WTConv2d(4, 4, wt_levels=1.5)
    assert WTConv2d(4, 4, wt_type="haar").wt_type == "haar"


def test_call_errors():
    layer = WTConv2d(3, 3, 3, wt_levels=1)
    with pytest.raises(ValueError, match="channels"):
        layer(torch.randn(1, 4, 8, 8))
    with pytest.raises(TypeError, match="dtype"):
        layer(torch.randn(1, 3, 8, 8, dtype=torch.float64))
    w = layer.kernel_weights()
    with pytest.raises(ValueError, match="levels = 2"):
        wtconv2d(torch.randn(1, 3, 8, 8), *w, levels=2)
    with pytest.raises(ValueError, match="dy"):
        wtconv2d_bwd(torch.randn(1, 3, 4, 4), torch.randn(1, 3, 8, 8), *w, 1)


# ---------------------------------------------------------------------------
# Custom op machinery: opcheck, compile, export, autocast
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("bias,stride", [(True, 1), (False, 2)])
def test_opcheck(bias, stride):
    gen = torch.Generator().manual_seed(1)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, requires_grad=True)

    args = (randn(2, 3, 9, 8), randn(3, 5, 5), randn(3) if bias else None, randn(3),
            randn(2, 3, 4, 5, 5), randn(2, 3, 4), stride)
    torch.library.opcheck(wtconv2d_fwd, args)
    dy = torch.randn(wtconv2d_fwd(*args).shape)
    # The backward op has no autograd formula (no double backward): check it without grad.
    plain = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in (dy, *args))
    torch.library.opcheck(wtconv2d_bwd, plain)


def block(c=4, levels=2):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(c, c, 1), WTConv2d(c, c, 5, wt_levels=levels),
                               torch.nn.GELU())


def grads(module):
    return [p.grad.clone() for p in module.parameters()]


def test_compile_fullgraph_matches_eager():
    net = block()
    x = torch.randn(2, 4, 13, 11)
    y = net(x)
    y.square().sum().backward()
    eager = grads(net)
    net.zero_grad()
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    y2 = compiled(x)
    y2.square().sum().backward()
    torch.testing.assert_close(y2, y)
    for a, b in zip(grads(net), eager):
        torch.testing.assert_close(a, b)


def test_compile_dynamic_shapes():
    net = block(levels=3)
    compiled = torch.compile(net, fullgraph=True, dynamic=True, backend="aot_eager")
    for shape in [(1, 4, 16, 16), (2, 4, 23, 9)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), net(x))


def test_compile_inductor_forward():
    net = block()
    x = torch.randn(2, 4, 12, 10)
    torch.testing.assert_close(torch.compile(net, fullgraph=True)(x), net(x))


def test_functional_eager_path_is_one_autograd_node_bitwise_equal_to_the_ops():
    torch.manual_seed(3)
    c, k, levels = 4, 5, 2
    x = torch.randn(2, c, 13, 11, dtype=torch.float64, requires_grad=True)
    w = [torch.randn(shape, dtype=torch.float64, requires_grad=True)
         for shape in ((c, k, k), (c,), (c,), (levels, c, 4, k, k), (levels, c, 4))]
    dy = torch.randn(2, c, 13, 11, dtype=torch.float64)

    y = wtconv2d(x, *w, levels=levels)
    assert type(y.grad_fn).__name__ == "_EagerWTConvBackward"  # no custom-op dispatch
    y.backward(dy)
    eager = [t.grad.clone() for t in (x, *w)]
    for t in (x, *w):
        t.grad = None
    y_op = torch.ops.wtconv_cuda.wtconv2d_fwd(x, *w, 1)
    y_op.backward(dy)
    assert torch.equal(y_op, y)
    for a, b in zip([t.grad for t in (x, *w)], eager):
        assert torch.equal(a, b)


@pytest.mark.parametrize("levels,bias,autocast", [(2, True, None), (3, False, None),
                                                  (1, True, None), (0, True, None),
                                                  (2, True, torch.bfloat16),
                                                  (1, False, torch.float16)])
def test_module_eager_path_takes_the_parameters_directly_bitwise_equal_to_the_ops(
        levels, bias, autocast):
    """One node whose inputs are the parameters themselves (no view, stack or cast nodes),
    with the same output and gradients as the ops on kernel_weights()."""
    torch.manual_seed(3)
    dtype = torch.float32 if autocast else torch.float64
    layer = randomise(WTConv2d(4, 4, 5, bias=bias, wt_levels=levels, dtype=dtype), 5)
    x = torch.randn(2, 4, 13, 11, dtype=dtype, requires_grad=True)
    context = autocast_or_off("cpu", autocast)

    with context:
        y = layer(x)
    assert type(y.grad_fn).__name__ == "_ModuleWTConvBackward"
    inputs = [fn for fn, _ in y.grad_fn.next_functions if fn is not None]
    params = list(layer.parameters())
    assert len(inputs) == len(params) + 1  # x (or its autocast cast) and the parameters
    leaves = [fn.variable for fn in inputs[1:] if type(fn).__name__ == "AccumulateGrad"]
    assert [id(p) for p in leaves] == [id(p) for p in params]  # the parameters, in order
    dy = torch.randn(y.shape, dtype=y.dtype)
    y.backward(dy)
    eager = [x.grad.clone()] + [p.grad.clone() for p in params]

    x.grad = None
    layer.zero_grad(set_to_none=True)
    with context:
        w = layer.kernel_weights()
        if autocast:
            w = [None if t is None else t.to(autocast) for t in w]
        y_op = torch.ops.wtconv_cuda.wtconv2d_fwd(x.to(y.dtype), *w, 1)
    y_op.backward(dy)
    assert torch.equal(y_op, y)
    for a, b in zip([x.grad] + [p.grad for p in params], eager):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)


@pytest.mark.parametrize("levels,autocast", [(2, None), (0, None), (3, torch.bfloat16)])
def test_module_without_gradients_skips_the_function_bitwise_equal(levels, autocast):
    """Under no_grad, and when nothing requires grad, the module calls the forward without
    the autograd Function: same output, bit for bit, and no graph."""
    torch.manual_seed(6)
    dtype = torch.float32 if autocast else torch.float64
    layer = randomise(WTConv2d(4, 4, 5, wt_levels=levels, dtype=dtype), 5)
    x = torch.randn(2, 4, 13, 11, dtype=dtype, requires_grad=True)
    context = autocast_or_off("cpu", autocast)
    with context:
        y = layer(x)
        with torch.no_grad():
            y_nograd = layer(x)
        frozen = x.detach()
        for p in layer.parameters():
            p.requires_grad_(False)
        y_frozen = layer(frozen)
    assert type(y.grad_fn).__name__ == "_ModuleWTConvBackward"
    for out in (y_nograd, y_frozen):
        assert out.grad_fn is None and not out.requires_grad
        assert out.dtype == y.dtype and torch.equal(out, y.detach())


def test_module_with_a_parametrized_weight():
    """A parametrized weight (not in its module's ``_parameters``) is read through the
    attribute, as PyTorch computes it."""
    from torch.nn.utils import parametrize

    class Doubled(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    torch.manual_seed(7)
    layer = randomise(WTConv2d(3, 3, 3, wt_levels=2, dtype=torch.float64), 3)
    x = torch.randn(1, 3, 9, 8, dtype=torch.float64)
    with torch.no_grad():
        y_plain = layer(x)
        halved = layer.wavelet_convs[1].weight / 2
        layer.wavelet_convs[1].weight.copy_(halved)
    parametrize.register_parametrization(layer.wavelet_convs[1], "weight", Doubled())
    y = layer(x)
    assert torch.allclose(y, y_plain, rtol=1e-12, atol=0)
    y.sum().backward()
    assert layer.wavelet_convs[1].parametrizations.weight.original.grad is not None


@pytest.mark.parametrize("levels", [1, 3])
def test_module_gradients_have_the_parameters_strides(levels):
    """The gradient layout contract (DistributedDataParallel's buckets rely on it)."""
    layer = WTConv2d(3, 3, 3, wt_levels=levels, dtype=torch.float64)
    layer(torch.randn(1, 3, 9, 8, dtype=torch.float64)).sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad.stride() == p.stride(), name


def test_module_gradients_accumulate_over_calls():
    torch.manual_seed(4)
    layer = WTConv2d(3, 3, 3, wt_levels=2, dtype=torch.float64)
    x = torch.randn(1, 3, 9, 8, dtype=torch.float64)
    layer(x).sum().backward()
    once = [p.grad.clone() for p in layer.parameters()]
    layer(x).sum().backward()
    for p, g in zip(layer.parameters(), once):
        assert torch.equal(p.grad, 2 * g)


def test_module_parameters_modified_in_place_after_forward():
    """Parameters the backward reads as they are fall under PyTorch's in-place check;
    the level parameters of L > 1 are joined (copied) at forward time, so the
    backward uses the forward's values of those."""
    layer = WTConv2d(2, 2, 3, wt_levels=1, dtype=torch.float64)
    y = layer(torch.randn(1, 2, 6, 6, dtype=torch.float64))
    with torch.no_grad():
        layer.wavelet_convs[0].weight.add_(1)
    with pytest.raises(RuntimeError, match="inplace"):
        y.sum().backward()

    torch.manual_seed(5)
    layer = WTConv2d(2, 2, 3, wt_levels=2, dtype=torch.float64)
    x = torch.randn(1, 2, 6, 6, dtype=torch.float64)
    layer(x).sum().backward()
    want = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad(set_to_none=True)
    y = layer(x)
    with torch.no_grad():
        for p in (*layer.wavelet_convs.parameters(), *layer.wavelet_scale.parameters()):
            p.mul_(3)
    y.sum().backward()
    for p, g in zip(layer.parameters(), want):
        assert torch.equal(p.grad, g)


def test_export():
    net = block()
    x = torch.randn(2, 4, 13, 11)
    program = torch.export.export(net, (x,))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert torch.ops.wtconv_cuda.wtconv2d_fwd.default in targets
    torch.testing.assert_close(program.module()(x), net(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_casts_like_conv(dtype):
    layer = WTConv2d(3, 3, 5, wt_levels=2)
    x = torch.randn(2, 3, 12, 12, requires_grad=True)
    with torch.autocast("cpu", dtype=dtype):
        y = layer(x)
        conv = layer.base_conv(x)
    assert y.dtype == conv.dtype == dtype
    w = as_numpy(WTConvWeights(*(None if a is None else a.detach().to(dtype)
                                 for a in layer.kernel_weights())))
    y_ref = reference.forward(x.detach().to(dtype).double().numpy(), w, 2, 1)
    assert rel(y.detach().double(), y_ref) < 1e-2
    y.float().sum().backward()
    assert layer.base_scale.weight.grad.dtype == torch.float32
    assert x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("path", ["module", "functional"])
def test_autocast_writes_a_channels_last_input_nchw_in_its_one_cast(path):
    """A channels-last float32 input under autocast is cast and made NCHW-contiguous
    by one copy (one autograd node); the tensor saved for the backward is that
    copy, and outputs and gradients equal those of the NCHW input bit for bit."""
    layer = randomise(WTConv2d(3, 3, 5, wt_levels=2), 8)
    x = torch.randn(2, 3, 10, 9)
    runs = []
    for memory_format in (torch.contiguous_format, torch.channels_last):
        xi = x.clone(memory_format=memory_format).requires_grad_()
        layer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(xi) if path == "module" else wtconv2d(xi, *layer.kernel_weights())
        (cast,) = [fn for fn, _ in y.grad_fn.next_functions[:1]]
        assert type(cast).__name__ == "ToCopyBackward0"
        assert type(cast.next_functions[0][0]).__name__ == "AccumulateGrad"  # no layout node
        assert y.grad_fn.saved_tensors[0].is_contiguous()
        y.backward(torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(y.dtype))
        runs.append([y.detach(), xi.grad] + [p.grad for p in layer.parameters()])
    assert runs[1][1].is_contiguous(memory_format=torch.channels_last)
    for a, b in zip(*runs):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_autocast_input_is_copied_only_when_cast():
    from wtconv_cuda.bindings.torch import _autocast_input

    x = torch.randn(1, 4, 5, 6).to(memory_format=torch.channels_last)
    cast = _autocast_input(x, torch.bfloat16)
    assert cast.dtype == torch.bfloat16 and cast.is_contiguous()
    assert torch.equal(cast, x.to(torch.bfloat16))
    assert _autocast_input(x, torch.float32) is x  # no cast: left as it is
    assert _autocast_input(x.double(), torch.bfloat16).dtype == torch.float64


def test_autocast_under_compile():
    net = block()
    x = torch.randn(2, 4, 12, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = net(x)
        compiled = torch.compile(net, fullgraph=True, backend="aot_eager")(x)
    assert compiled.dtype == torch.bfloat16
    torch.testing.assert_close(compiled, eager)


@pytest.mark.parametrize("contiguous", [True, False])
def test_level_views_are_the_levels_in_the_parameters_shapes(contiguous):
    """The per-level gradient views: the same values as a split, contiguous strides."""
    from wtconv_cuda.bindings import _common
    from wtconv_cuda.bindings import torch as wttorch

    c, k, levels = 3, 5, 3
    sizes = _common.LayerSizes(2, c, 9, 9, k, levels)
    torch.manual_seed(0)
    if contiguous:
        d_ww = torch.randn(levels * 4 * c, 1, k, k)
        d_ws = torch.randn(1, levels * 4 * c, 1, 1)
    else:  # same shapes, permuted strides
        d_ww = torch.randn(k, k, 1, levels * 4 * c).permute(3, 2, 0, 1)
        d_ws = torch.randn(1, 2 * levels * 4 * c, 1, 1)[:, ::2]
        assert not d_ww.is_contiguous() and not d_ws.is_contiguous()
    views = wttorch._level_views(d_ww, d_ws, sizes)
    expected = (*d_ww.split(4 * c), *d_ws.split(4 * c, dim=1))
    assert len(views) == 2 * levels
    for view, want in zip(views, expected):
        assert view.shape == want.shape
        assert view.stride() == torch.empty(want.shape).stride()
        assert torch.equal(view, want)
