"""Public API: dispatch, tape, dtype rules, input checks (CPU only, no CuPy)."""

import subprocess
import sys
import types

import numpy as np
import pytest

import wtconv_cuda as wt
from wtconv_cuda import Saved, Tape, WTConvWeights, reference

from .conftest import random_weights

B, C, H, W, K, L = 2, 3, 9, 7, 3, 2


@pytest.fixture
def x(rng):
    return rng.standard_normal((B, C, H, W))


@pytest.fixture
def w(rng):
    return random_weights(rng, C, K, L)


def dy_for(rng, x, stride=1):
    b, c, h, w = x.shape
    return rng.standard_normal((b, c, -(-h // stride), -(-w // stride)))


# ---------------------------------------------------------------------------
# CPU path
# ---------------------------------------------------------------------------


def test_readme_command_float64_input_float32_weights():
    weights = wt.init_weights(8, 5, 3)
    y = wt.forward(np.random.default_rng(0).random((2, 8, 37, 45)), weights)
    assert y.shape == (2, 8, 37, 45) and y.dtype == np.float64


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_forward_rounds_the_float64_result_once_to_x_dtype(rng, x, w, dtype):
    xd = x.astype(dtype)
    y = wt.forward(xd, w, stride=2)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, reference.forward(xd, w, stride=2).astype(dtype))


def test_bfloat16_arrays_round_the_float64_results_once(rng, x):
    """ml_dtypes.bfloat16 arrays (the dtype cupy.from_dlpack gives a bfloat16 tensor)
    are accepted; the CPU path rounds the oracle's results once to bfloat16."""
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    w = WTConvWeights(*(a.astype(bf16) for a in random_weights(rng, C, K, L)))
    xb = x.astype(bf16)
    tape = Tape()
    y = wt.forward(xb, w, stride=2, tape=tape)
    assert y.dtype == bf16
    np.testing.assert_array_equal(y, reference.forward(xb, w, stride=2).astype(bf16))
    dy = dy_for(rng, x, 2).astype(bf16)
    dx, dw = tape.backward(dy)
    ref_dx, ref_dw = reference.backward(xb, w, dy, stride=2)
    assert dx.dtype == bf16
    np.testing.assert_array_equal(dx, ref_dx.astype(bf16))
    for got, ref in zip(dw, ref_dw):
        assert got.dtype == bf16
        np.testing.assert_array_equal(got, ref.astype(bf16))


def test_backward_matches_reference_with_mixed_dtypes(rng, x):
    w = random_weights(rng, C, K, L)
    w = w._replace(
        base_scale=w.base_scale.astype(np.float16),
        wavelet_weight=w.wavelet_weight.astype(np.float32),
    )
    x32 = x.astype(np.float32)
    dy = dy_for(rng, x, 3)
    dx, dw = wt.backward(Saved(x32, w, L, 3), dy)
    ref_dx, ref_dw = reference.backward(x32, w, dy, stride=3)
    assert dx.dtype == np.float32
    np.testing.assert_array_equal(dx, ref_dx.astype(np.float32))
    for got, ref, param in zip(dw, ref_dw, w):
        assert got.dtype == param.dtype
        np.testing.assert_array_equal(got, ref.astype(param.dtype))


def test_tape_records_and_runs_backward(rng, x, w):
    tape = Tape()
    assert tape.saved is None and "empty" in repr(tape)
    y = wt.forward(x, w, stride=2, tape=tape)
    assert tape.saved == Saved(x, w, L, 2)
    assert tape.saved.x is x and tape.saved.weights is w
    dy = dy_for(rng, x, 2)
    dx, dw = tape.backward(dy)
    ref_dx, ref_dw = reference.backward(x, w, dy, stride=2)
    np.testing.assert_array_equal(dx, ref_dx)
    for got, ref in zip(dw, ref_dw):
        np.testing.assert_array_equal(got, ref)
    # adjoint identity through the public API (no bias: the operator is then linear)
    w0 = w._replace(base_bias=None)
    wt.forward(x, w0, stride=2, tape=tape)
    assert np.isclose(
        np.vdot(wt.forward(x, w0, stride=2), dy), np.vdot(x, tape.backward(dy)[0]), rtol=1e-12
    )
    assert y.shape == dy.shape


def test_tape_reuse_keeps_the_latest_call(rng, x, w):
    tape = Tape()
    wt.forward(x, w, tape=tape)
    x2 = rng.standard_normal((1, C, 5, 5))
    wt.forward(x2, w, stride=3, tape=tape)
    assert tape.saved.x is x2 and tape.saved.stride == 3
    dx, _ = tape.backward(dy_for(rng, x2, 3))
    assert dx.shape == x2.shape


def test_tape_backward_before_forward_raises():
    with pytest.raises(RuntimeError, match="before a forward call recorded"):
        Tape().backward(np.ones((1, 1, 1, 1)))



def test_bias_free_layer_has_no_bias_gradient(rng, x):
    w = random_weights(rng, C, K, L, bias=False)
    tape = Tape()
    wt.forward(x, w, tape=tape)
    _, dw = tape.backward(dy_for(rng, x))
    assert dw.base_bias is None and dw.base_scale.shape == (C,)


def test_empty_batch_returns_empty_results(rng, w):
    x = np.empty((0, C, H, W), np.float32)
    tape = Tape()
    y = wt.forward(x, w, stride=2, tape=tape)
    assert y.shape == (0, C, 5, 4) and y.dtype == np.float32
    dx, dw = tape.backward(np.empty((0, C, 5, 4), np.float32))
    assert dx.shape == x.shape and dx.dtype == np.float32
    for g, p in zip(dw, w):
        assert g.shape == p.shape and not g.any()


def test_inputs_are_never_written(rng, x, w):
    dy = dy_for(rng, x, 2)
    copies = [a.copy() for a in (x, dy, *w)]
    for a in (x, dy, *w):
        a.setflags(write=False)  # any write would raise
    tape = Tape()
    wt.forward(x, w, stride=2, tape=tape)
    tape.backward(dy)
    reference.backward(x, w, dy, stride=2)
    for a, c in zip((x, dy, *w), copies):
        np.testing.assert_array_equal(a, c)


def test_import_is_light():
    code = (
        "import sys, wtconv_cuda, wtconv_cuda.bindings;"
        "heavy = [m for m in ('numba', 'cupy', 'torch', 'jax', 'scipy', 'pywt') if m in sys.modules];"
        "assert not heavy, heavy; print(wtconv_cuda.__version__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0.1.0"


def test_public_names():
    assert set(wt.__all__) >= {
        "forward",
        "backward",
        "Tape",
        "Saved",
        "WTConvWeights",
        "init_weights",
        "weights_from_state_dict",
        "weights_to_state_dict",
        "reference",
        "__version__",
    }
    for name in wt.__all__:
        assert hasattr(wt, name)


# ---------------------------------------------------------------------------
# GPU dispatch, without CuPy: fake CuPy arrays and a fake gpu module
# ---------------------------------------------------------------------------


class FakeCupyArray:
    """Looks like a cupy.ndarray to the dispatcher (shape, ndim, dtype, module)."""

    def __init__(self, a):
        self.a, self.shape, self.ndim, self.dtype = a, a.shape, a.ndim, a.dtype


FakeCupyArray.__module__ = "cupy._core.core"


@pytest.fixture
def fake_gpu(monkeypatch):
    calls = []
    module = types.ModuleType("wtconv_cuda.gpu")
    module.forward = lambda *args: calls.append(("forward", args)) or "y"
    module.backward = lambda *args: calls.append(("backward", args)) or ("dx", "dw")
    monkeypatch.setitem(sys.modules, "wtconv_cuda.gpu", module)
    monkeypatch.setattr(wt, "gpu", module, raising=False)
    return calls


def fake_cupy_weights(w, dtype):
    return WTConvWeights(*(None if a is None else FakeCupyArray(a.astype(dtype)) for a in w))


def test_cupy_inputs_go_to_gpu_module_with_resolved_arguments(rng, x, w, fake_gpu):
    cx, cw = FakeCupyArray(x.astype(np.float32)), fake_cupy_weights(w, np.float32)
    tape = Tape()
    assert wt.forward(cx, cw, stride=np.int64(2), tape=tape) == "y"
    assert fake_gpu == [("forward", (cx, cw, L, 2))]
    assert type(fake_gpu[0][1][3]) is int
    cdy = FakeCupyArray(dy_for(rng, x, 2).astype(np.float32))
    assert tape.backward(cdy) == ("dx", "dw")
    assert fake_gpu[1] == ("backward", (cx, cw, cdy, L, 2))


def test_tape_backward_checks_only_dy_of_the_record_forward_made(rng, x, w, fake_gpu,
                                                                 monkeypatch):
    """forward checked its record's arguments; Tape.backward checks dy, not them again.
    A record assigned to ``saved`` by hand is checked in full."""
    from wtconv_cuda import _validate

    calls = []
    check_forward = _validate.check_forward
    monkeypatch.setattr(_validate, "check_forward",
                        lambda *a, **k: calls.append(1) or check_forward(*a, **k))
    cx, cw = FakeCupyArray(x.astype(np.float32)), fake_cupy_weights(w, np.float32)
    cdy = FakeCupyArray(dy_for(rng, x, 2).astype(np.float32))
    tape = Tape()
    wt.forward(cx, cw, stride=2, tape=tape)
    assert tape.backward(cdy) == ("dx", "dw")
    assert len(calls) == 1 and fake_gpu[1] == ("backward", (cx, cw, cdy, L, 2))
    with pytest.raises(ValueError, match=r"dy must have shape .* got \(2, 3, 9, 7\)"):
        tape.backward(FakeCupyArray(dy_for(rng, x, 1).astype(np.float32)))
    with pytest.raises(TypeError, match="dy has dtype float16 but x has dtype float32"):
        tape.backward(FakeCupyArray(dy_for(rng, x, 2).astype(np.float16)))

    tape.saved = Saved(cx, cw, L + 1, 2)  # by hand, wrong levels: checked
    with pytest.raises(ValueError, match=f"levels = {L + 1} but the weights hold {L}"):
        tape.backward(cdy)
    tape.saved = Saved(cx, cw, np.int64(L), np.int64(2))  # by hand, valid: checked, resolved
    assert tape.backward(cdy) == ("dx", "dw")
    assert len(calls) == 3 and fake_gpu[-1] == ("backward", (cx, cw, cdy, L, 2))
    assert type(fake_gpu[-1][1][3]) is int and type(fake_gpu[-1][1][4]) is int


def test_gpu_path_requires_one_dtype(rng, x, w, fake_gpu):
    cx = FakeCupyArray(x.astype(np.float32))
    with pytest.raises(
        TypeError, match="weights.base_weight has dtype float64 but x has dtype float32"
    ):
        wt.forward(cx, fake_cupy_weights(w, np.float64))
    cw = fake_cupy_weights(w, np.float32)
    with pytest.raises(TypeError, match="dy has dtype float64 but x has dtype float32"):
        wt.backward(Saved(cx, cw, L, 1), FakeCupyArray(dy_for(rng, x)))
    with pytest.raises(
        TypeError, match="weights.base_weight must be a cupy array like x, got numpy"
    ):
        wt.forward(cx, w)
    with pytest.raises(TypeError, match="dy must be a cupy array like x, got numpy"):
        wt.backward(Saved(cx, cw, L, 1), dy_for(rng, x).astype(np.float32))
    assert fake_gpu == []


def test_other_frameworks_are_rejected_by_name(w):
    tensor = type("Tensor", (), {"__module__": "torch", "shape": (1, C, 4, 4), "ndim": 4})()
    with pytest.raises(
        TypeError,
        match=r"x must be a numpy.ndarray \(CPU\) or a cupy.ndarray \(GPU\), got torch.Tensor",
    ):
        wt.forward(tensor, w)


# ---------------------------------------------------------------------------
# Every bad input, with its message
# ---------------------------------------------------------------------------


BAD_FORWARD = [
    # (id, make (x, w, kwargs), error, message)
    (
        "x-rank",
        lambda x, w: (x[0], w, {}),
        ValueError,
        r"x must be a 4-D array \(B, C, H, W\), got 3-D shape \(3, 9, 7\)",
    ),
    (
        "x-list",
        lambda x, w: (x.tolist(), w, {}),
        TypeError,
        "x must be a numpy.ndarray .* got builtins.list",
    ),
    (
        "x-int",
        lambda x, w: (x.astype(np.int64), w, {}),
        TypeError,
        "x must have dtype float16, bfloat16, float32 or float64, got int64",
    ),
    (
        "x-complex",
        lambda x, w: (x.astype(np.complex128), w, {}),
        TypeError,
        "x must have dtype .* got complex128",
    ),
    (
        "H-zero",
        lambda x, w: (x[:, :, :0], w, {}),
        ValueError,
        r"x must have non-zero height and width, got shape \(2, 3, 0, 7\)",
    ),
    (
        "W-zero",
        lambda x, w: (x[..., :0], w, {}),
        ValueError,
        r"non-zero height and width, got shape \(2, 3, 9, 0\)",
    ),
    (
        "channels",
        lambda x, w: (x[:, :2], w, {}),
        ValueError,
        r"weights have C = 3 channels .* but x has 2 channels",
    ),
    (
        "weights-tuple",
        lambda x, w: (x, tuple(w), {}),
        TypeError,
        "weights must be a WTConvWeights, got tuple",
    ),
    (
        "weights-list-field",
        lambda x, w: (x, w._replace(base_scale=[1.0, 1.0, 1.0]), {}),
        TypeError,
        "weights.base_scale must be a numpy array like x, got list",
    ),
    (
        "weights-int",
        lambda x, w: (x, w._replace(base_weight=w.base_weight.astype(np.int32)), {}),
        TypeError,
        "weights.base_weight must have dtype float16, bfloat16, float32 or float64, got int32",
    ),
    (
        "K-even",
        lambda x, w: (x, w._replace(base_weight=np.ones((C, 4, 4))), {}),
        ValueError,
        "kernel size K must be odd, got K = 4",
    ),
    (
        "base-not-square",
        lambda x, w: (x, w._replace(base_weight=np.ones((C, 3, 5))), {}),
        ValueError,
        r"weights.base_weight must have shape \(C, K, K\), got \(3, 3, 5\)",
    ),
    (
        "K-inconsistent",
        lambda x, w: (x, w._replace(wavelet_weight=np.ones((L, C, 4, 5, 5))), {}),
        ValueError,
        r"weights.wavelet_weight must have shape \(L, C, 4, K, K\) = \(2, 3, 4, 3, 3\), got \(2, 3, 4, 5, 5\)",
    ),
    (
        "wavelet-rank",
        lambda x, w: (x, w._replace(wavelet_weight=np.ones((C, 4, 3, 3))), {}),
        ValueError,
        r"weights.wavelet_weight must have shape \(L, C, 4, K, K\), got \(3, 4, 3, 3\)",
    ),
    (
        "bias-shape",
        lambda x, w: (x, w._replace(base_bias=np.ones(C + 1)), {}),
        ValueError,
        r"weights.base_bias must have shape \(C,\) = \(3,\), got \(4,\)",
    ),
    (
        "scale-shape",
        lambda x, w: (x, w._replace(base_scale=np.ones((1, C, 1, 1))), {}),
        ValueError,
        r"weights.base_scale must have shape \(C,\) = \(3,\), got \(1, 3, 1, 1\)",
    ),
    (
        "wavelet-scale-levels",
        lambda x, w: (x, w._replace(wavelet_scale=np.ones((L + 1, C, 4))), {}),
        ValueError,
        r"weights.wavelet_scale must have shape \(L, C, 4\) = \(2, 3, 4\), got \(3, 3, 4\)",
    ),
    (
        "levels-mismatch",
        lambda x, w: (x, w, {"levels": 3}),
        ValueError,
        r"levels = 3 but the weights hold 2 wavelet levels",
    ),
    (
        "levels-negative",
        lambda x, w: (x, w, {"levels": -1}),
        ValueError,
        "levels must be >= 0, got -1",
    ),
    (
        "levels-float",
        lambda x, w: (x, w, {"levels": 2.0}),
        TypeError,
        "levels must be an int or None, got float",
    ),
    ("stride-zero", lambda x, w: (x, w, {"stride": 0}), ValueError, "stride must be >= 1, got 0"),
    (
        "stride-float",
        lambda x, w: (x, w, {"stride": 1.5}),
        TypeError,
        "stride must be an int, got float",
    ),
    (
        "stride-bool",
        lambda x, w: (x, w, {"stride": True}),
        TypeError,
        "stride must be an int, got bool",
    ),
    (
        "tape-type",
        lambda x, w: (x, w, {"tape": object()}),
        TypeError,
        "tape must be a Tape or None, got object",
    ),
]


@pytest.mark.parametrize(
    "make, error, match", [case[1:] for case in BAD_FORWARD], ids=[case[0] for case in BAD_FORWARD]
)
def test_forward_rejects_bad_input(x, w, make, error, match):
    args_x, args_w, kwargs = make(x, w)
    with pytest.raises(error, match=match):
        wt.forward(args_x, args_w, **kwargs)


@pytest.mark.parametrize(
    "make, error, match",
    [case[1:] for case in BAD_FORWARD if case[0] != "tape-type"],
    ids=[case[0] for case in BAD_FORWARD if case[0] != "tape-type"],
)
def test_backward_rejects_bad_saved_fields(rng, x, w, make, error, match):
    args_x, args_w, kwargs = make(x, w)
    saved = Saved(args_x, args_w, kwargs.get("levels"), kwargs.get("stride", 1))
    with pytest.raises(error, match=match):
        wt.backward(saved, dy_for(rng, x))


@pytest.mark.parametrize(
    "make_dy, error, match",
    [
        (
            lambda dy: dy[:, :, :-1],
            ValueError,
            r"dy must have shape .* = \(2, 3, 5, 4\), got \(2, 3, 4, 4\)",
        ),
        (lambda dy: dy[0], ValueError, r"dy must have shape .* got \(3, 5, 4\)"),
        (
            lambda dy: dy.astype(np.int16),
            TypeError,
            "dy must have dtype float16, bfloat16, float32 or float64, got int16",
        ),
        (lambda dy: dy.tolist(), TypeError, "dy must be a numpy array like x, got list"),
    ],
)
def test_backward_rejects_bad_dy(rng, x, w, make_dy, error, match):
    tape = Tape()
    wt.forward(x, w, stride=2, tape=tape)
    with pytest.raises(error, match=match):
        tape.backward(make_dy(dy_for(rng, x, 2)))


def test_backward_rejects_a_non_saved_record(rng, x, w):
    with pytest.raises(TypeError, match="saved must be a Saved record, got tuple"):
        wt.backward((x, w, L, 1), dy_for(rng, x))
