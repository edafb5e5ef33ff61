"""Every bad input of issue 7 on every public entry point, with its message.

Each case asserts the exception type and a message that names the argument
and states the expected and the actual value. Entry points: the core API
(``wtconv_cuda.forward`` / ``backward`` / ``Tape``, NumPy and, through a
stand-in CuPy array type, the GPU dispatch), the PyTorch binding on CPU
tensors and the JAX binding on CPU arrays (each skipped when its framework
is missing). Non-contiguous, negative-stride, Fortran-ordered and broadcast
NumPy inputs must give exactly the result of their contiguous copies.
"""

from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest

import wtconv_cuda as wt
from wtconv_cuda import Saved, Tape, WTConvWeights, _validate, reference

from ..conftest import random_weights

B, C, H, W, K, L = 2, 3, 9, 7, 3, 2


@pytest.fixture
def x(rng):
    return rng.standard_normal((B, C, H, W))


@pytest.fixture
def w(rng):
    return random_weights(rng, C, K, L)


def dy_for(rng, x, stride=1):
    b, c, h, width = x.shape
    return rng.standard_normal((b, c, -(-h // stride), -(-width // stride)))


# ---------------------------------------------------------------------------
# Core API, NumPy
# ---------------------------------------------------------------------------

# (id, make(x, w) -> (x, w, kwargs), error, message regex)
BAD_FORWARD = [
    ("x-rank-3", lambda x, w: (x[0], w, {}), ValueError,
     r"x must be a 4-D array \(B, C, H, W\), got 3-D shape \(3, 9, 7\)"),
    ("x-rank-5", lambda x, w: (x[None], w, {}), ValueError,
     r"x must be a 4-D array \(B, C, H, W\), got 5-D shape \(1, 2, 3, 9, 7\)"),
    ("x-scalar", lambda x, w: (np.float32(1.0), w, {}), ValueError,
     r"x must be a 4-D array .* got 0-D shape \(\)"),
    ("x-tuple", lambda x, w: (tuple(x), w, {}), TypeError,
     r"x must be a numpy.ndarray \(CPU\) or a cupy.ndarray \(GPU\), got builtins.tuple"),
    ("x-int32", lambda x, w: (x.astype(np.int32), w, {}), TypeError,
     "x must have dtype float16, bfloat16, float32 or float64, got int32"),
    ("x-uint8", lambda x, w: (x.astype(np.uint8), w, {}), TypeError,
     "x must have dtype float16, bfloat16, float32 or float64, got uint8"),
    ("x-bool", lambda x, w: (x > 0, w, {}), TypeError,
     "x must have dtype float16, bfloat16, float32 or float64, got bool"),
    ("x-complex64", lambda x, w: (x.astype(np.complex64), w, {}), TypeError,
     "x must have dtype float16, bfloat16, float32 or float64, got complex64"),
    ("x-object", lambda x, w: (x.astype(object), w, {}), TypeError,
     "x must have dtype float16, bfloat16, float32 or float64, got object"),
    ("H-zero", lambda x, w: (x[:, :, :0], w, {}), ValueError,
     r"x must have non-zero height and width, got shape \(2, 3, 0, 7\)"),
    ("W-zero", lambda x, w: (x[..., :0], w, {}), ValueError,
     r"x must have non-zero height and width, got shape \(2, 3, 9, 0\)"),
    ("channels-x-fewer", lambda x, w: (x[:, :2], w, {}), ValueError,
     r"weights have C = 3 channels \(weights.base_weight.shape\[0\]\) but x has 2 channels "
     r"\(x.shape\[1\]\)"),
    ("channels-x-more", lambda x, w: (np.concatenate([x, x], 1), w, {}), ValueError,
     r"weights have C = 3 channels .* but x has 6 channels"),
    ("weights-none", lambda x, w: (x, None, {}), TypeError,
     "weights must be a WTConvWeights, got NoneType"),
    ("weights-dict", lambda x, w: (x, w._asdict(), {}), TypeError,
     "weights must be a WTConvWeights, got dict"),
    ("weights-field-none", lambda x, w: (x, w._replace(base_scale=None), {}), TypeError,
     r"weights.base_scale must be an array \(only weights.base_bias may be None\), got None"),
    ("weights-field-list", lambda x, w: (x, w._replace(wavelet_scale=w.wavelet_scale.tolist()),
                                         {}), TypeError,
     "weights.wavelet_scale must be a numpy array like x, got list"),
    ("weights-int", lambda x, w: (x, w._replace(base_scale=np.ones(C, np.int64)), {}), TypeError,
     "weights.base_scale must have dtype float16, bfloat16, float32 or float64, got int64"),
    ("weights-complex", lambda x, w: (x, w._replace(wavelet_weight=w.wavelet_weight + 0j), {}),
     TypeError, "weights.wavelet_weight must have dtype float16, bfloat16, float32 or float64, got "
                "complex128"),
    ("K-even", lambda x, w: (x, w._replace(base_weight=np.ones((C, 4, 4)),
                                           wavelet_weight=np.ones((L, C, 4, 4, 4))), {}),
     ValueError, "kernel size K must be odd, got K = 4 from weights.base_weight"),
    ("K-zero", lambda x, w: (x, w._replace(base_weight=np.ones((C, 0, 0))), {}),
     ValueError, "kernel size K must be odd, got K = 0"),
    ("base-rank", lambda x, w: (x, w._replace(base_weight=np.ones((C, 1, K, K))), {}),
     ValueError, r"weights.base_weight must have shape \(C, K, K\), got \(3, 1, 3, 3\)"),
    ("wavelet-K", lambda x, w: (x, w._replace(wavelet_weight=np.ones((L, C, 4, 5, 5))), {}),
     ValueError, r"weights.wavelet_weight must have shape \(L, C, 4, K, K\) = "
                 r"\(2, 3, 4, 3, 3\), got \(2, 3, 4, 5, 5\)"),
    ("wavelet-channels", lambda x, w: (x, w._replace(wavelet_weight=np.ones((L, 4, 4, K, K))),
                                       {}), ValueError,
     r"weights.wavelet_weight must have shape .* = \(2, 3, 4, 3, 3\), got \(2, 4, 4, 3, 3\)"),
    ("wavelet-published-layout", lambda x, w: (x, w._replace(
        wavelet_weight=np.ones((L, 4 * C, 1, K, K))), {}), ValueError,
     r"weights.wavelet_weight must have shape .* got \(2, 12, 1, 3, 3\)"),
    ("bias-shape", lambda x, w: (x, w._replace(base_bias=np.ones((1, C))), {}), ValueError,
     r"weights.base_bias must have shape \(C,\) = \(3,\), got \(1, 3\)"),
    ("scale-published-layout", lambda x, w: (x, w._replace(base_scale=np.ones((1, C, 1, 1))),
                                             {}), ValueError,
     r"weights.base_scale must have shape \(C,\) = \(3,\), got \(1, 3, 1, 1\)"),
    ("wavelet-scale", lambda x, w: (x, w._replace(wavelet_scale=np.ones((L, C))), {}),
     ValueError, r"weights.wavelet_scale must have shape \(L, C, 4\) = \(2, 3, 4\), got "
                 r"\(2, 3\)"),
    ("levels-negative", lambda x, w: (x, w, {"levels": -1}), ValueError,
     "levels must be >= 0, got -1"),
    ("levels-negative-numpy", lambda x, w: (x, w, {"levels": np.int64(-3)}), ValueError,
     "levels must be >= 0, got -3"),
    ("levels-mismatch", lambda x, w: (x, w, {"levels": 1}), ValueError,
     r"levels = 1 but the weights hold 2 wavelet levels \(weights.wavelet_weight.shape\[0\]\)"),
    ("levels-float", lambda x, w: (x, w, {"levels": 2.0}), TypeError,
     "levels must be an int or None, got float 2.0"),
    ("levels-str", lambda x, w: (x, w, {"levels": "2"}), TypeError,
     "levels must be an int or None, got str '2'"),
    ("levels-bool", lambda x, w: (x, w, {"levels": True}), TypeError,
     "levels must be an int or None, got bool True"),
    ("stride-zero", lambda x, w: (x, w, {"stride": 0}), ValueError,
     "stride must be >= 1, got 0"),
    ("stride-negative", lambda x, w: (x, w, {"stride": -2}), ValueError,
     "stride must be >= 1, got -2"),
    ("stride-float", lambda x, w: (x, w, {"stride": 2.0}), TypeError,
     "stride must be an int, got float 2.0"),
    ("stride-none", lambda x, w: (x, w, {"stride": None}), TypeError,
     "stride must be an int, got NoneType None"),
    ("tape", lambda x, w: (x, w, {"tape": []}), TypeError,
     "tape must be a Tape or None, got list"),
]
if np.dtype(np.longdouble) != np.dtype(np.float64):  # extended precision is not float64
    BAD_FORWARD.append(("x-longdouble", lambda x, w: (x.astype(np.longdouble), w, {}), TypeError,
                        f"x must have dtype float16, bfloat16, float32 or float64, got "
                        f"{np.dtype(np.longdouble)}"))


@pytest.mark.parametrize("make,error,match", [c[1:] for c in BAD_FORWARD],
                         ids=[c[0] for c in BAD_FORWARD])
def test_forward_rejects(x, w, make, error, match):
    args = make(x, w)
    with pytest.raises(error, match=match):
        wt.forward(args[0], args[1], **args[2])


BAD_SAVED = [c for c in BAD_FORWARD if c[0] != "tape" and not c[0].startswith("x-rank")
             and c[0] not in ("x-scalar", "channels-x-more")]


@pytest.mark.parametrize("make,error,match", [c[1:] for c in BAD_SAVED],
                         ids=[c[0] for c in BAD_SAVED])
def test_backward_rejects_bad_saved_fields(rng, x, w, make, error, match):
    bad_x, bad_w, kwargs = make(x, w)
    saved = Saved(bad_x, bad_w, kwargs.get("levels"), kwargs.get("stride", 1))
    with pytest.raises(error, match=match):
        wt.backward(saved, dy_for(rng, x))


BAD_DY = [  # (id, make(dy), error, message), forward at stride 2
    ("rows", lambda dy: dy[:, :, :-1], ValueError,
     r"dy must have shape \(B, C, ceil\(H/2\), ceil\(W/2\)\) of the output = \(2, 3, 5, 4\), "
     r"got \(2, 3, 4, 4\)"),
    ("unstrided", lambda dy: np.zeros((B, C, H, W)), ValueError,
     r"dy must have shape .* = \(2, 3, 5, 4\), got \(2, 3, 9, 7\)"),
    ("rank", lambda dy: dy[None], ValueError,
     r"dy must have shape .* = \(2, 3, 5, 4\), got \(1, 2, 3, 5, 4\)"),
    ("int", lambda dy: dy.astype(np.int8), TypeError,
     "dy must have dtype float16, bfloat16, float32 or float64, got int8"),
    ("complex", lambda dy: dy.astype(np.complex128), TypeError,
     "dy must have dtype float16, bfloat16, float32 or float64, got complex128"),
    ("list", lambda dy: dy.tolist(), TypeError, "dy must be a numpy array like x, got list"),
    ("none", lambda dy: None, TypeError, "dy must be a numpy array like x, got NoneType"),
]


@pytest.mark.parametrize("make,error,match", [c[1:] for c in BAD_DY],
                         ids=[c[0] for c in BAD_DY])
def test_tape_backward_rejects_bad_dy(rng, x, w, make, error, match):
    tape = Tape()
    wt.forward(x, w, stride=2, tape=tape)
    with pytest.raises(error, match=match):
        tape.backward(make(dy_for(rng, x, 2)))
    with pytest.raises(error, match=match):
        wt.backward(tape.saved, make(dy_for(rng, x, 2)))


def test_tape_and_saved_misuse(rng, x, w):
    with pytest.raises(RuntimeError, match="Tape.backward called before a forward call"):
        Tape().backward(dy_for(rng, x))
    with pytest.raises(TypeError, match="saved must be a Saved record, got tuple"):
        wt.backward((x, w, L, 1), dy_for(rng, x))
    with pytest.raises(TypeError, match="saved must be a Saved record, got Tape"):
        wt.backward(Tape(), dy_for(rng, x))


def test_failed_forward_does_not_record_into_the_tape(x, w):
    tape = Tape()
    with pytest.raises(ValueError):
        wt.forward(x, w, stride=0, tape=tape)
    assert tape.saved is None


@pytest.mark.parametrize("x_dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("w_dtype", [np.float16, np.float32, np.float64])
def test_cpu_dtype_promotion_is_the_documented_rule(rng, x_dtype, w_dtype):
    """CPU: any float mix is accepted, computed in float64, rounded once to x's dtype
    (gradients to each parameter's dtype) -- README's dtype rule."""
    x = rng.standard_normal((1, 2, 5, 6)).astype(x_dtype)
    w = random_weights(rng, 2, 3, 1, dtype=w_dtype)
    w = w._replace(base_scale=w.base_scale.astype(np.float64))  # mixed inside the weights too
    dy = rng.standard_normal((1, 2, 5, 6)).astype(np.float16)
    tape = Tape()
    y = wt.forward(x, w, tape=tape)
    assert y.dtype == x_dtype
    np.testing.assert_array_equal(y, reference.forward(x, w).astype(x_dtype))
    dx, dw = tape.backward(dy)
    assert dx.dtype == x_dtype
    for g, p in zip(dw, w):
        assert g.dtype == p.dtype


# ---------------------------------------------------------------------------
# Layouts: non-contiguous, negative strides, Fortran order, broadcasts
# ---------------------------------------------------------------------------


def layouts(a: np.ndarray, rng) -> dict:
    """Views holding ``a``'s values with other memory layouts."""
    big = np.zeros((a.shape[0], a.shape[1], 2 * a.shape[2] + 1, 3 * a.shape[3]), a.dtype)
    big[:, :, 1::2, ::3] = a
    flipped = np.ascontiguousarray(a[..., ::-1, ::-1])[..., ::-1, ::-1]
    channels_last = np.ascontiguousarray(np.moveaxis(a, 1, -1))
    return {
        "strided": big[:, :, 1::2, ::3],
        "negative": flipped,
        "fortran": np.asfortranarray(a),
        "channels-last": np.moveaxis(channels_last, -1, 1),
        "readonly": _readonly(a.copy()),
    }


def _readonly(a):
    a.setflags(write=False)
    return a


@pytest.mark.parametrize("layout", ["strided", "negative", "fortran", "channels-last",
                                    "readonly"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_numpy_layouts_give_the_contiguous_result(rng, layout, dtype):
    x = rng.standard_normal((2, 3, 7, 5)).astype(dtype)
    w = random_weights(rng, 3, 3, 2, dtype=dtype)
    dy = rng.standard_normal((2, 3, 4, 3)).astype(dtype)
    tape = Tape()
    y_ref = wt.forward(x, w, stride=2, tape=tape)
    dx_ref, dw_ref = tape.backward(dy)

    xv, dyv = layouts(x, rng)[layout], layouts(dy, rng)[layout]
    wv = WTConvWeights(*(None if a is None else _weight_view(a, layout) for a in w))
    assert not xv.flags.c_contiguous or layout == "readonly"
    before = [xv.copy(), dyv.copy()]
    y = wt.forward(xv, wv, stride=2, tape=tape)
    dx, dw = tape.backward(dyv)
    # float64 results may differ in the last bit: NumPy's einsum (the oracle's Haar step)
    # sums in an order that depends on the memory layout. Narrower dtypes round that away.
    same = np.testing.assert_array_equal if dtype != np.float64 else (
        lambda got, want: np.testing.assert_allclose(got, want, rtol=0,
                                                     atol=1e-13 * np.abs(want).max()))
    same(y, y_ref)
    same(dx, dx_ref)
    for g, want in zip(dw, dw_ref):
        same(g, want)
    np.testing.assert_array_equal(xv, before[0])
    np.testing.assert_array_equal(dyv, before[1])


def _weight_view(a, layout):
    if layout == "negative":
        return np.ascontiguousarray(a[::-1])[::-1]
    if layout == "strided":
        big = np.zeros((2 * a.shape[0],) + a.shape[1:], a.dtype)
        big[::2] = a
        return big[::2]
    if layout == "fortran":
        return np.asfortranarray(a)
    if layout == "readonly":
        return _readonly(a.copy())
    return a


def test_broadcast_inputs_give_the_materialised_result(rng):
    """Zero-stride views (np.broadcast_to) are read, not misread as one element."""
    row = rng.standard_normal((1, 1, 1, 6))
    x = np.broadcast_to(row, (2, 3, 5, 6))
    w = random_weights(rng, 3, 3, 1)
    w = w._replace(base_scale=np.broadcast_to(np.float64(0.5), (3,)))
    y = wt.forward(x, w, stride=1)
    w_copy = w._replace(base_scale=np.full(3, 0.5))
    np.testing.assert_array_equal(y, wt.forward(np.ascontiguousarray(x), w_copy))


# ---------------------------------------------------------------------------
# Core API, GPU dispatch (a stand-in CuPy array type; no CuPy needed)
# ---------------------------------------------------------------------------


class FakeDevice:
    def __init__(self, id):
        self.id = id


class FakeMemoryPointer:
    def __init__(self, device_id):
        self.device_id = device_id


class FakeCupyArray:
    """Looks like a cupy.ndarray to the dispatcher: shape, ndim, dtype, module, and the
    device both as ``data.device_id`` and as a ``device`` object built on each access."""

    def __init__(self, a, device=0):
        self.a, self.shape, self.ndim, self.dtype = a, a.shape, a.ndim, a.dtype
        self.data = FakeMemoryPointer(device)

    @property
    def device(self):
        return FakeDevice(self.data.device_id)


FakeCupyArray.__module__ = "cupy._core.core"


class DeviceOnlyArray(FakeCupyArray):
    """A CuPy-like array that names its device only through ``device``."""

    def __init__(self, a, device=0):
        super().__init__(a, device)
        self._device = FakeDevice(device)
        del self.data

    @property
    def device(self):
        return self._device


DeviceOnlyArray.__module__ = "cupy._core.core"


def fake(w: WTConvWeights, dtype=np.float32, device=0, **overrides) -> WTConvWeights:
    arrays = {name: None if a is None else FakeCupyArray(a.astype(dtype), device)
              for name, a in w._asdict().items()}
    arrays.update(overrides)
    return WTConvWeights(**arrays)


@pytest.fixture
def no_gpu_module(monkeypatch):
    """A GPU module that fails the test if reached: every case must be rejected earlier."""
    module = types.ModuleType("wtconv_cuda.gpu")

    def unreachable(*args):
        raise AssertionError("invalid input reached the GPU module")

    module.forward = module.backward = unreachable
    monkeypatch.setitem(sys.modules, "wtconv_cuda.gpu", module)
    monkeypatch.setattr(wt, "gpu", module, raising=False)


GPU_BAD = [  # (id, make(x, w, dy) -> (x, w, dy), error, message)
    ("weights-dtype", lambda x, w, dy: (FakeCupyArray(x.astype(np.float32)), fake(w, np.float16),
                                        None), TypeError,
     "weights.base_weight has dtype float16 but x has dtype float32; on this path they must "
     "match"),
    ("one-weight-dtype", lambda x, w, dy: (
        FakeCupyArray(x.astype(np.float16)),
        fake(w, np.float16, wavelet_scale=FakeCupyArray(w.wavelet_scale.astype(np.float32))),
        None), TypeError, "weights.wavelet_scale has dtype float32 but x has dtype float16"),
    ("host-weights", lambda x, w, dy: (FakeCupyArray(x.astype(np.float32)), w, None), TypeError,
     "weights.base_weight must be a cupy array like x, got numpy"),
    ("host-x", lambda x, w, dy: (x.astype(np.float32), fake(w), None), TypeError,
     "weights.base_weight must be a numpy array like x, got cupy"),
    ("one-host-weight", lambda x, w, dy: (FakeCupyArray(x.astype(np.float32)),
                                          fake(w, base_bias=w.base_bias.astype(np.float32)),
                                          None), TypeError,
     "weights.base_bias must be a cupy array like x, got numpy"),
    ("other-device", lambda x, w, dy: (FakeCupyArray(x.astype(np.float32), device=0),
                                       fake(w, device=1), None), ValueError,
     "weights.base_weight is on CUDA device 1 but x is on CUDA device 0"),
    ("one-other-device", lambda x, w, dy: (
        FakeCupyArray(x.astype(np.float32), device=1),
        fake(w, device=1, wavelet_weight=FakeCupyArray(w.wavelet_weight.astype(np.float32), 0)),
        None), ValueError, "weights.wavelet_weight is on CUDA device 0 but x is on CUDA device 1"),
    ("int", lambda x, w, dy: (FakeCupyArray(x.astype(np.int32)), fake(w, np.int32), None),
     TypeError, "x must have dtype float16, bfloat16, float32 or float64, got int32"),
]


@pytest.mark.parametrize("make,error,match", [c[1:] for c in GPU_BAD],
                         ids=[c[0] for c in GPU_BAD])
def test_gpu_dispatch_rejects_before_any_launch(rng, x, w, no_gpu_module, make, error, match):
    gx, gw, _ = make(x, w, dy_for(rng, x))
    with pytest.raises(error, match=match):
        wt.forward(gx, gw)
    with pytest.raises(error, match=match):
        wt.backward(Saved(gx, gw, None, 1), FakeCupyArray(dy_for(rng, x).astype(gx.dtype)))


GPU_BAD_DY = [
    ("host", lambda dy: dy.astype(np.float32), TypeError, "dy must be a cupy array like x, got "
                                                          "numpy"),
    ("dtype", lambda dy: FakeCupyArray(dy.astype(np.float16)), TypeError,
     "dy has dtype float16 but x has dtype float32; on this path they must match"),
    ("float64", lambda dy: FakeCupyArray(dy), TypeError,
     "dy has dtype float64 but x has dtype float32"),
    ("device", lambda dy: FakeCupyArray(dy.astype(np.float32), device=3), ValueError,
     "dy is on CUDA device 3 but x is on CUDA device 0"),
    ("shape", lambda dy: FakeCupyArray(dy[:, :, :-1].astype(np.float32)), ValueError,
     r"dy must have shape .* = \(2, 3, 9, 7\), got \(2, 3, 8, 7\)"),
]


@pytest.mark.parametrize("make,error,match", [c[1:] for c in GPU_BAD_DY],
                         ids=[c[0] for c in GPU_BAD_DY])
def test_gpu_dispatch_rejects_bad_dy(rng, x, w, no_gpu_module, make, error, match):
    saved = Saved(FakeCupyArray(x.astype(np.float32)), fake(w), None, 1)
    with pytest.raises(error, match=match):
        wt.backward(saved, make(dy_for(rng, x)))


def test_device_id_reads_the_memory_pointer_then_the_device_object(rng):
    a = rng.standard_normal(3)
    assert _validate._device_id(FakeCupyArray(a, 2)) == 2
    assert _validate._device_id(DeviceOnlyArray(a, 3)) == 3
    assert _validate._device_id(a) is None  # NumPy: a memoryview without device_id
    assert _validate._device_id(object()) is None


def test_a_weight_on_another_device_is_found_by_either_attribute(rng, x, w, no_gpu_module):
    gx = FakeCupyArray(x.astype(np.float32), 0)
    gw = fake(w, wavelet_scale=DeviceOnlyArray(w.wavelet_scale.astype(np.float32), 1))
    with pytest.raises(ValueError, match="weights.wavelet_scale is on CUDA device 1 but x is on "
                                         "CUDA device 0"):
        wt.forward(gx, gw)


# ---------------------------------------------------------------------------
# PyTorch binding, CPU tensors
# ---------------------------------------------------------------------------


def torch_inputs(rng, dtype_name="float64"):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    x = torch.tensor(rng.standard_normal((B, C, H, W)), dtype=dtype)
    w = WTConvWeights(*(torch.tensor(a, dtype=dtype) for a in random_weights(rng, C, K, L)))
    return torch, x, w


TORCH_BAD = [  # (id, make(torch, x, w) -> (x, w, kwargs), error, message)
    ("x-rank", lambda t, x, w: (x[0], w, {}), ValueError,
     r"x must be 4-D \(B, C, H, W\), got shape \(3, 9, 7\)"),
    ("H-zero", lambda t, x, w: (x[:, :, :0], w, {}), ValueError,
     r"x must have non-zero height and width, got shape \(2, 3, 0, 7\)"),
    ("channels", lambda t, x, w: (x[:, :2], w, {}), ValueError,
     r"the weights have C = 3 channels \(base_weight.shape\[0\]\) but x has 2 channels "
     r"\(x.shape\[1\]\)"),
    ("dtype-mismatch", lambda t, x, w: (x.float(), w, {}), TypeError,
     "base_weight has dtype torch.float64 but x has dtype torch.float32; they must match"),
    ("one-weight-dtype", lambda t, x, w: (x, w._replace(wavelet_scale=w.wavelet_scale.half()),
                                          {}), TypeError,
     "wavelet_scale has dtype torch.float16 but x has dtype torch.float64"),
    ("int", lambda t, x, w: (x.int(), WTConvWeights(*(a.int() for a in w)), {}), TypeError,
     "x has dtype torch.int32; expected a floating dtype"),
    ("complex", lambda t, x, w: (x.to(t.complex128), WTConvWeights(*(a.to(t.complex128)
                                                                     for a in w)), {}),
     TypeError, "x has dtype torch.complex128; expected a floating dtype"),
    ("K-even", lambda t, x, w: (x, w._replace(base_weight=t.ones(C, 4, 4, dtype=x.dtype),
                                              wavelet_weight=t.ones(L, C, 4, 4, 4,
                                                                    dtype=x.dtype)), {}),
     ValueError, "kernel size K must be odd, got K = 4 from base_weight"),
    ("wavelet-shape", lambda t, x, w: (x, w._replace(wavelet_weight=w.wavelet_weight[:, :2]), {}),
     ValueError, r"wavelet_weight must have shape \(L, C, 4, K, K\) = \(L, 3, 4, 3, 3\), got "
                 r"\(2, 2, 4, 3, 3\)"),
    ("bias-shape", lambda t, x, w: (x, w._replace(base_bias=w.base_bias[:2]), {}), ValueError,
     r"base_bias must have shape \(C,\) = \(3,\), got \(2,\)"),
    ("levels-negative", lambda t, x, w: (x, w, {"levels": -1}), ValueError,
     r"levels = -1 but the weights hold 2 wavelet levels"),
    ("levels-float", lambda t, x, w: (x, w, {"levels": 2.0}), TypeError,
     "levels must be an int or None, got float"),
    ("stride-zero", lambda t, x, w: (x, w, {"stride": 0}), ValueError,
     "stride must be >= 1, got 0"),
    ("stride-float", lambda t, x, w: (x, w, {"stride": 1.5}), TypeError,
     "stride must be an int, got float"),
    ("weight-device", lambda t, x, w: (x, w._replace(base_scale=w.base_scale.to("meta")), {}),
     ValueError, "base_scale is on meta but x is on cpu"),
]


@pytest.mark.parametrize("make,error,match", [c[1:] for c in TORCH_BAD],
                         ids=[c[0] for c in TORCH_BAD])
def test_torch_functional_rejects(rng, make, error, match):
    torch, x, w = torch_inputs(rng)
    from wtconv_cuda.bindings.torch import wtconv2d

    bx, bw, kwargs = make(torch, x, w)
    with pytest.raises(error, match=match):
        wtconv2d(bx, *bw, **kwargs)


TORCH_OP_BAD = [c for c in TORCH_BAD if "levels" not in c[0] and c[0] != "stride-float"]


@pytest.mark.parametrize("make,error,match", [c[1:] for c in TORCH_OP_BAD],
                         ids=[c[0] for c in TORCH_OP_BAD])
def test_torch_ops_reject(rng, make, error, match):
    torch, x, w = torch_inputs(rng)
    from wtconv_cuda.bindings.torch import wtconv2d_bwd, wtconv2d_fwd

    bx, bw, kwargs = make(torch, x, w)
    stride = kwargs.get("stride", 1)
    with pytest.raises(error, match=match):
        wtconv2d_fwd(bx, *bw, stride)
    dy = torch.zeros(B, C, H, W, dtype=x.dtype)
    with pytest.raises(error, match=match):
        wtconv2d_bwd(dy, bx, *bw, stride)


def test_torch_op_schema_rejects_a_float_stride(rng):
    torch, x, w = torch_inputs(rng)
    from wtconv_cuda.bindings.torch import wtconv2d_fwd

    with pytest.raises(RuntimeError, match="Expected a value of type 'int' for argument "
                                           "'stride' but instead found type 'float'"):
        wtconv2d_fwd(x, *w, 1.5)


def test_torch_bad_dy(rng):
    torch, x, w = torch_inputs(rng)
    from wtconv_cuda.bindings.torch import wtconv2d_bwd

    with pytest.raises(ValueError, match=r"dy must have the output's shape \(2, 3, 5, 4\), got "
                                         r"\(2, 3, 9, 7\)"):
        wtconv2d_bwd(torch.zeros(B, C, H, W, dtype=x.dtype), x, *w, 2)
    with pytest.raises(ValueError, match="dy is on meta but x is on cpu"):
        wtconv2d_bwd(torch.zeros(B, C, H, W, device="meta"), x, *w, 1)
    with pytest.raises(TypeError, match="dy must have dtype float16, bfloat16, float32 or float64, got "
                                        "int64"):
        wtconv2d_bwd(torch.zeros(B, C, H, W, dtype=torch.int64), x, *w, 1)


def test_torch_module_rejects(rng):
    torch = pytest.importorskip("torch")
    from wtconv_cuda.bindings.torch import WTConv2d

    cases = [
        (dict(in_channels=3, out_channels=3, wt_levels=-1), ValueError,
         "wt_levels must be >= 0, got -1"),
        (dict(in_channels=3, out_channels=3, kernel_size=4), ValueError,
         "kernel_size must be odd, got 4"),
        (dict(in_channels=3, out_channels=6), ValueError,
         r"out_channels \(6\) must equal in_channels \(3\)"),
        (dict(in_channels=3, out_channels=3, stride=0), ValueError, "stride must be >= 1, got 0"),
        (dict(in_channels=3, out_channels=3, wt_type="db2"), ValueError,
         "wt_type 'db2' is not supported"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            WTConv2d(**kwargs)
    layer = WTConv2d(3, 3, 3, wt_levels=2)
    with pytest.raises(ValueError, match=r"x must be 4-D \(B, C, H, W\), got shape \(3, 8, 8\)"):
        layer(torch.randn(3, 8, 8))
    with pytest.raises(ValueError, match="but x has 4 channels"):
        layer(torch.randn(1, 4, 8, 8))
    with pytest.raises(TypeError, match="has dtype torch.float32 but x has dtype torch.float64"):
        layer(torch.randn(1, 3, 8, 8, dtype=torch.float64))


@pytest.mark.parametrize("layout", ["transposed", "channels_last", "sliced", "expanded"])
def test_torch_layouts_give_the_contiguous_result(rng, layout):
    torch, x, w = torch_inputs(rng)
    from wtconv_cuda.bindings.torch import wtconv2d

    if layout == "transposed":
        view = x.transpose(2, 3).contiguous().transpose(2, 3)
    elif layout == "channels_last":
        view = x.contiguous(memory_format=torch.channels_last)
    elif layout == "sliced":
        big = torch.zeros(B, C, 2 * H, 3 * W, dtype=x.dtype)
        big[:, :, ::2, ::3] = x
        view = big[:, :, ::2, ::3]
    else:
        x = x[:1, :, :1].expand(B, C, H, W)
        view = x
        x = x.contiguous()
    assert not view.is_contiguous()
    wv = w._replace(base_weight=w.base_weight.transpose(1, 2).contiguous().transpose(1, 2))
    xg, vg = x.clone().requires_grad_(), view.detach().requires_grad_(layout != "expanded")
    y = wtconv2d(xg, *w, stride=2)
    yv = wtconv2d(vg, *wv, stride=2)
    assert torch.equal(y, yv)
    if layout != "expanded":
        dy = torch.randn_like(y)
        y.backward(dy)
        yv.backward(dy)
        assert torch.equal(xg.grad, vg.grad)


def test_torch_empty_batch(rng):
    torch, x, w = torch_inputs(rng)
    from wtconv_cuda.bindings.torch import wtconv2d

    xe = x[:0].clone().requires_grad_()
    params = [a.clone().requires_grad_() for a in w]
    y = wtconv2d(xe, *params, stride=2)
    assert y.shape == (0, C, 5, 4)
    y.sum().backward()
    for p in params:
        assert torch.equal(p.grad, torch.zeros_like(p))


# ---------------------------------------------------------------------------
# JAX binding, CPU arrays
# ---------------------------------------------------------------------------


def jax_inputs(rng):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.asarray(rng.standard_normal((B, C, H, W)), jnp.float32)
    w = WTConvWeights(*(jnp.asarray(a, jnp.float32) for a in random_weights(rng, C, K, L)))
    return jax, jnp, x, w


JAX_BAD = [  # (id, make(jnp, x, w) -> (x, w, kwargs), error, message)
    ("x-rank", lambda j, x, w: (x[0], w, {}), ValueError,
     r"x must be 4-D \(B, C, H, W\), got shape \(3, 9, 7\)"),
    ("H-zero", lambda j, x, w: (x[:, :, :0], w, {}), ValueError,
     r"x must have non-zero height and width, got shape \(2, 3, 0, 7\)"),
    ("channels", lambda j, x, w: (x[:, :2], w, {}), ValueError,
     r"the weights have C = 3 channels \(base_weight.shape\[0\]\) but x has 2 channels"),
    ("dtype-mismatch", lambda j, x, w: (x.astype(j.float16), w, {}), TypeError,
     "w.base_weight has dtype float32 but x has dtype float16; they must match"),
    ("int", lambda j, x, w: (x.astype(j.int32), WTConvWeights(*(a.astype(j.int32) for a in w)),
                             {}), TypeError,
     "x has dtype int32; expected float16, bfloat16, float32 or float64"),
    ("complex", lambda j, x, w: (x.astype(j.complex64),
                                 WTConvWeights(*(a.astype(j.complex64) for a in w)), {}),
     TypeError, "x has dtype complex64; expected float16, bfloat16, float32 or float64"),
    ("w-tuple", lambda j, x, w: (x, tuple(w), {}), TypeError,
     "w must be a WTConvWeights, got tuple"),
    ("K-even", lambda j, x, w: (x, w._replace(base_weight=j.ones((C, 4, 4)),
                                              wavelet_weight=j.ones((L, C, 4, 4, 4))), {}),
     ValueError, "kernel size K must be odd, got K = 4 from base_weight"),
    ("scale-shape", lambda j, x, w: (x, w._replace(base_scale=j.ones((1, C, 1, 1))), {}),
     ValueError, r"base_scale must have shape \(C,\) = \(3,\), got \(1, 3, 1, 1\)"),
    ("levels-negative", lambda j, x, w: (x, w, {"levels": -1}), ValueError,
     r"levels = -1 but the weights hold 2 wavelet levels"),
    ("levels-float", lambda j, x, w: (x, w, {"levels": 2.0}), TypeError,
     "levels must be an int or None, got float"),
    ("stride-zero", lambda j, x, w: (x, w, {"stride": 0}), ValueError,
     "stride must be >= 1, got 0"),
    ("stride-float", lambda j, x, w: (x, w, {"stride": 2.0}), TypeError,
     "stride must be an int, got float"),
]


@pytest.mark.parametrize("make,error,match", [c[1:] for c in JAX_BAD],
                         ids=[c[0] for c in JAX_BAD])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_jax_rejects(rng, jit, make, error, match):
    jax, jnp, x, w = jax_inputs(rng)
    from wtconv_cuda.bindings.jax import wtconv2d

    bx, bw, kwargs = make(jnp, x, w)

    def call(bx, bw):
        return wtconv2d(bx, bw, **kwargs)

    with pytest.raises(error, match=match):
        (jax.jit(call) if jit else call)(bx, bw)


def test_jax_wrong_cotangent_and_empty_batch(rng):
    jax, jnp, x, w = jax_inputs(rng)
    from wtconv_cuda.bindings.jax import wtconv2d

    _, vjp = jax.vjp(lambda x: wtconv2d(x, w, stride=2), x)
    with pytest.raises(ValueError, match=re.escape("float32[2,3,5,4]")):
        vjp(jnp.ones((B, C, H, W), jnp.float32))
    y, vjp = jax.vjp(lambda x, w: wtconv2d(x, w, stride=2), x[:0], w)
    assert y.shape == (0, C, 5, 4)
    dx, dw = vjp(jnp.ones(y.shape, jnp.float32))
    assert dx.shape == (0, C, H, W)
    for g, p in zip(dw, w):
        assert g.shape == p.shape and not np.asarray(g).any()
