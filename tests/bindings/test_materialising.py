"""The benchmark's materialising PyTorch baseline (benchmarks/materialising.py) vs the oracle."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import wtconv_cuda as wt  # noqa: E402
from wtconv_cuda import WTConvWeights, reference  # noqa: E402
from wtconv_cuda.bindings.torch import WTConv2d  # noqa: E402

from ..conftest import random_weights  # noqa: E402

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "materialising.py"
SHAPES = [(2, 3, 13, 11), (1, 2, 7, 9), (1, 2, 1, 5), (2, 1, 17, 6)]


@pytest.fixture(scope="module")
def mat():
    spec = importlib.util.spec_from_file_location("materialising_under_test", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_tensors(w: WTConvWeights, requires_grad=False) -> WTConvWeights:
    return WTConvWeights(*(None if a is None else
                           torch.tensor(a, dtype=torch.float64, requires_grad=requires_grad)
                           for a in w))


def rel(got, want):
    got = got.detach().numpy() if torch.is_tensor(got) else np.asarray(got)
    want = np.asarray(want, dtype=np.float64)
    scale = np.abs(want).max()
    return np.abs(got - want).max() / (scale if scale > 0 else 1.0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("levels", [0, 1, 2, 3])
@pytest.mark.parametrize("stride", [1, 2])
def test_forward_matches_oracle_float64(mat, rng, shape, levels, stride):
    w = random_weights(rng, shape[1], 3 if levels % 2 else 5, levels, bias=levels != 2)
    x = rng.standard_normal(shape)
    want = reference.forward(x, w, levels, stride)
    got = mat.materialising_wtconv2d(torch.tensor(x), *as_tensors(w), stride=stride)
    assert tuple(got.shape) == want.shape
    assert rel(got, want) < 1e-12


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("levels", [0, 1, 2, 3])
@pytest.mark.parametrize("stride", [1, 2])
def test_autograd_gradients_match_oracle_backward(mat, rng, shape, levels, stride):
    w = random_weights(rng, shape[1], 5, levels, bias=levels != 1)
    x = rng.standard_normal(shape)
    y_shape = reference.forward(x, w, levels, stride).shape
    dy = rng.standard_normal(y_shape)
    want_dx, want_dw = reference.backward(x, w, dy, levels, stride)

    tx = torch.tensor(x, requires_grad=True)
    tw = as_tensors(w, requires_grad=True)
    y = mat.materialising_wtconv2d(tx, *tw, stride=stride)
    y.backward(torch.tensor(dy))
    assert rel(tx.grad, want_dx) < 1e-12
    for name, t, g in zip(WTConvWeights._fields, tw, want_dw):
        if t is None:
            assert g is None
            continue
        if t.numel() == 0:  # L = 0: no level parameters
            continue
        assert rel(t.grad, g) < 1e-11, name


@pytest.mark.parametrize("stride", [1, 2])
def test_module_has_published_names_and_matches_oracle(mat, rng, stride):
    c, k, levels = 3, 5, 2
    w = random_weights(rng, c, k, levels)
    layer = mat.MaterialisingWTConv2d.from_weights(w, stride=stride, dtype=torch.float64)
    binding = WTConv2d(c, c, k, stride=stride, wt_levels=levels, dtype=torch.float64)
    assert {n: tuple(v.shape) for n, v in layer.state_dict().items()} == \
        {n: tuple(v.shape) for n, v in binding.state_dict().items()}
    assert [n for n, _ in layer.named_parameters()] == [n for n, _ in binding.named_parameters()]

    x = rng.standard_normal((2, c, 11, 10))
    y = layer(torch.tensor(x))
    assert rel(y, reference.forward(x, w, stride=stride)) < 1e-12

    dy = rng.standard_normal(tuple(y.shape))
    _, want_dw = reference.backward(x, w, dy, stride=stride)
    y.backward(torch.tensor(dy))
    want = wt.weights_to_state_dict(want_dw)
    for name, p in layer.named_parameters():
        assert rel(p.grad, np.reshape(want[name], tuple(p.shape))) < 1e-11, name


def test_from_layer_copies_a_binding_layer(mat, rng):
    w = random_weights(rng, 4, 5, 3, dtype=np.float32)
    binding = WTConv2d.from_weights(w, stride=2)
    layer = mat.MaterialisingWTConv2d.from_layer(binding)
    assert layer.stride == 2 and layer.wt_levels == 3
    x = torch.tensor(rng.standard_normal((1, 4, 19, 13)), dtype=torch.float32)
    with torch.no_grad():
        assert rel(layer(x), binding(x).double().numpy()) < 1e-5
        layer.base_conv.weight.add_(1.0)  # a copy: the binding's parameters do not change
    assert np.allclose(binding.base_conv.weight.detach().numpy().reshape(4, 5, 5), w.base_weight)


class _RecordCalls(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("levels, stride", [(0, 1), (1, 2), (3, 1)])
def test_op_sequence_mirrors_the_published_layer(mat, rng, levels, stride):
    c = 2
    layer = mat.MaterialisingWTConv2d.from_weights(random_weights(rng, c, 5, levels),
                                                   stride=stride, dtype=torch.float64)
    x = torch.tensor(rng.standard_normal((1, c, 9, 8)))
    with torch.no_grad(), _RecordCalls() as mode:
        layer(x)
    # per level: one analysis conv (stride 2, the Haar filters) and one depthwise conv; the
    # base conv; and the stride's 1x1 conv. Synthesis: one conv_transpose2d per level.
    assert mode.calls.count("conv2d") == 2 * levels + 1 + (stride > 1)
    assert mode.calls.count("conv_transpose2d") == levels
    assert mode.calls.count("cat") == levels


def test_haar_filters_layout(mat):
    filters = mat.haar_filters(3, dtype=torch.float64)
    assert tuple(filters.shape) == (12, 1, 2, 2)
    assert np.array_equal(filters.numpy(), wt.weights.haar_filter_tensor(3))


def test_constructor_errors(mat):
    with pytest.raises(ValueError):
        mat.MaterialisingWTConv2d(4, 8)
    with pytest.raises(ValueError):
        mat.MaterialisingWTConv2d(4, 4, wt_type="db2")
    with pytest.raises(ValueError):
        mat.MaterialisingWTConv2d(4, 4, kernel_size=4)
