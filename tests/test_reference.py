"""The float64 oracle against independent computations and against itself."""

import numpy as np
import pytest
import pywt
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.signal import correlate2d

from wtconv_cuda import WTConvWeights, reference as R

from .conftest import random_weights


def grids(h, w, levels):
    """The level-1..L grids of an (h, w) image."""
    return [(-(-h // 2**j), -(-w // 2**j)) for j in range(1, levels + 1)]


# ---------------------------------------------------------------------------
# Haar transform
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 3, 6, 8), (1, 1, 2, 2), (4, 10, 4)])
def test_haar_step_equals_pywavelets_dwt2(rng, shape):
    v = rng.standard_normal(shape)
    c_a, (c_h, c_v, c_d) = pywt.dwt2(v, "haar")
    u = R.haar_analysis(v)
    assert u.shape == (*shape[:-2], 4, shape[-2] // 2, shape[-1] // 2)
    for k, expected in enumerate([c_a, c_h, c_v, c_d]):
        np.testing.assert_allclose(u[..., k, :, :], expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("hw", [(5, 7), (1, 1), (1, 4), (3, 1)])
def test_haar_step_on_odd_sizes_pads_with_zeros(rng, hw):
    v = rng.standard_normal((2, *hw))
    padded = np.pad(v, [(0, 0), (0, hw[0] % 2), (0, hw[1] % 2)])
    c_a, (c_h, c_v, c_d) = pywt.dwt2(padded, "haar")
    u = R.haar_analysis(v)
    np.testing.assert_allclose(u, np.stack([c_a, c_h, c_v, c_d], axis=-3), rtol=0, atol=1e-14)


@pytest.mark.parametrize("hw", [(6, 8), (7, 9), (1, 1), (1, 6), (5, 2)])
def test_synthesis_inverts_analysis(rng, hw):
    v = rng.standard_normal((2, 3, *hw))
    np.testing.assert_allclose(R.haar_synthesis(R.haar_analysis(v), hw), v, rtol=0, atol=1e-14)


def test_analysis_inverts_synthesis_on_even_grids(rng):
    u = rng.standard_normal((2, 4, 3, 5))
    np.testing.assert_allclose(R.haar_analysis(R.haar_synthesis(u, (6, 10))), u, atol=1e-14)


def test_synthesis_rejects_a_grid_that_does_not_halve(rng):
    with pytest.raises(ValueError, match="does not halve"):
        R.haar_synthesis(rng.standard_normal((4, 3, 3)), (8, 6))


@settings(max_examples=40, deadline=None)
@given(
    h=st.integers(1, 70),
    w=st.integers(1, 70),
    levels=st.integers(0, 10),
    seed=st.integers(0, 2**32 - 1),
)
def test_closed_form_synthesis_equals_level_by_level_loop(h, w, levels, seed):
    rng = np.random.default_rng(seed)
    zs = [rng.standard_normal((2, 3, 4, *g)) for g in grids(h, w, levels)]
    loop = R.synthesis_chain(zs, (h, w)) if zs else np.zeros((2, 3, h, w))
    closed = R.closed_form_synthesis(zs, (h, w))
    np.testing.assert_allclose(np.broadcast_to(closed, loop.shape), loop, rtol=0, atol=1e-13)


def test_closed_form_rejects_a_wrong_grid(rng):
    with pytest.raises(ValueError, match=r"zs\[1\] must have shape"):
        R.closed_form_synthesis(
            [rng.standard_normal((4, 3, 3)), rng.standard_normal((4, 1, 1))], (5, 6)
        )


def test_analysis_chain_reaches_one_pixel_and_stays_there(rng):
    subbands = R.analysis_chain(rng.standard_normal((1, 2, 5, 3)), 9)
    assert [u.shape[-2:] for u in subbands] == grids(5, 3, 9)
    assert subbands[-1].shape[-2:] == (1, 1)


# ---------------------------------------------------------------------------
# Depthwise convolution
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("k, hw", [(1, (5, 6)), (3, (7, 4)), (5, (9, 11)), (7, (3, 2))])
def test_depthwise_conv_same_equals_scipy_correlate2d(rng, k, hw):
    x = rng.standard_normal((2, 3, *hw))
    w = rng.standard_normal((3, k, k))
    y = R.depthwise_conv_same(x, w)
    for b in range(2):
        for c in range(3):
            expected = correlate2d(x[b, c], w[c], mode="same", boundary="fill")
            np.testing.assert_allclose(y[b, c], expected, rtol=0, atol=1e-13)


@pytest.mark.parametrize("k, hw", [(3, (5, 4)), (5, (2, 7)), (9, (3, 3))])
def test_conv_adjoints(rng, k, hw):
    x, g = rng.standard_normal((2, 2, 3, *hw))
    w = rng.standard_normal((3, k, k))
    lhs = np.vdot(R.depthwise_conv_same(x, w), g)
    assert np.isclose(np.vdot(x, R.depthwise_conv_same_adjoint(g, w)), lhs, rtol=1e-13)
    assert np.isclose(np.vdot(w, R.depthwise_conv_same_weight_grad(x, g, k)), lhs, rtol=1e-13)


# ---------------------------------------------------------------------------
# The operator: independent checks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "k, hw, bias", [(1, (9, 7), True), (3, (4, 11), False), (5, (2, 3), True), (7, (3, 5), True)]
)
def test_zero_levels_is_a_scaled_depthwise_conv(rng, k, hw, bias):
    x = rng.standard_normal((2, 3, *hw))
    w = random_weights(rng, 3, k, 0, bias=bias)
    y = R.forward(x, w)
    for b in range(2):
        for c in range(3):
            conv = correlate2d(x[b, c], w.base_weight[c], mode="same")
            if bias:
                conv = conv + w.base_bias[c]
            np.testing.assert_allclose(y[b, c], w.base_scale[c] * conv, rtol=1e-12, atol=1e-13)


def _forward_with_pywavelets(x, w, levels):
    """SPEC forward on sizes divisible by 2**levels, from PyWavelets and SciPy only."""

    def conv(a, kernels):  # a (B, *G, h, w), kernels (*G, K, K)
        out = np.empty_like(a)
        for idx in np.ndindex(a.shape[:-2]):
            out[idx] = correlate2d(a[idx], kernels[idx[1:]], mode="same")
        return out

    y = w.base_scale[:, None, None] * (conv(x, w.base_weight) + w.base_bias[:, None, None])
    details, v = [], x
    for j in range(levels):
        ll, (lh, hl, hh) = pywt.dwt2(v, "haar")
        u = np.stack([ll, lh, hl, hh], axis=2)
        details.append(w.wavelet_scale[j][..., None, None] * conv(u, w.wavelet_weight[j]))
        v = ll
    r = 0.0
    for z in reversed(details):
        r = pywt.idwt2((z[:, :, 0] + r, (z[:, :, 1], z[:, :, 2], z[:, :, 3])), "haar")
    return y + r


@pytest.mark.parametrize("levels, hw", [(1, (6, 10)), (2, (8, 12)), (3, (8, 16))])
def test_forward_equals_pywavelets_composition(rng, levels, hw):
    x = rng.standard_normal((2, 3, *hw))
    w = random_weights(rng, 3, 3, levels)
    np.testing.assert_allclose(
        R.forward(x, w), _forward_with_pywavelets(x, w, levels), rtol=1e-12, atol=1e-12
    )


def test_stride_subsamples_the_full_output(rng):
    x = rng.standard_normal((2, 3, 11, 8))
    w = random_weights(rng, 3, 5, 2)
    full = R.forward(x, w)
    for s in (2, 3, 4, 20):
        y = R.forward(x, w, stride=s)
        assert y.shape == (2, 3, -(-11 // s), -(-8 // s))
        np.testing.assert_array_equal(y, full[:, :, ::s, ::s])


def test_levels_reach_single_pixel_grids_and_deep_levels_contribute(rng):
    x = rng.standard_normal((1, 2, 3, 5))
    w = random_weights(rng, 2, 3, 9)
    y9 = R.forward(x, w)
    shallower = w._replace(wavelet_weight=w.wavelet_weight[:8], wavelet_scale=w.wavelet_scale[:8])
    assert y9.shape == x.shape
    assert not np.allclose(y9, R.forward(x, shallower))


def test_forward_is_linear_in_x(rng):
    w = random_weights(rng, 3, 5, 3, bias=False)
    x1, x2 = rng.standard_normal((2, 2, 3, 13, 9))
    a, b = 1.7, -0.3
    combined = R.forward(a * x1 + b * x2, w, stride=2)
    np.testing.assert_allclose(
        combined,
        a * R.forward(x1, w, stride=2) + b * R.forward(x2, w, stride=2),
        rtol=1e-12,
        atol=1e-12,
    )


def test_computes_in_float64_whatever_the_input_dtype(rng):
    x = rng.standard_normal((1, 2, 7, 6)).astype(np.float32)
    w = random_weights(rng, 2, 3, 2, dtype=np.float16)
    w64 = WTConvWeights(*(a.astype(np.float64) for a in w))
    y = R.forward(x, w)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, R.forward(x.astype(np.float64), w64))


def test_empty_batch(rng):
    w = random_weights(rng, 3, 3, 2)
    x = np.empty((0, 3, 5, 4))
    assert R.forward(x, w, stride=2).shape == (0, 3, 3, 2)
    dx, dw = R.backward(x, w, np.empty((0, 3, 3, 2)), stride=2)
    assert dx.shape == x.shape
    for g, p in zip(dw, w):
        assert g.shape == p.shape and not g.any()


def test_backward_rejects_a_wrong_dy_shape(rng):
    w = random_weights(rng, 3, 3, 1)
    x = rng.standard_normal((1, 3, 5, 5))
    with pytest.raises(
        ValueError, match=r"dy must have shape .* = \(1, 3, 3, 3\), got \(1, 3, 1, 1\)"
    ):
        R.backward(x, w, np.ones((1, 3, 1, 1)), stride=2)


def test_rejects_non_numpy_inputs(rng):
    w = random_weights(rng, 3, 3, 1)
    with pytest.raises(TypeError, match="x must be a numpy array, got list"):
        R.forward(np.zeros((1, 3, 4, 4)).tolist(), w)


# ---------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("levels", [0, 1, 4])
def test_adjoint_identity(rng, stride, levels):
    w = random_weights(rng, 3, 5, levels, bias=False)
    x = rng.standard_normal((2, 3, 15, 10))
    g = rng.standard_normal(R.forward(x, w, stride=stride).shape)
    dx, _ = R.backward(x, w, g, stride=stride)
    lhs, rhs = np.vdot(R.forward(x, w, stride=stride), g), np.vdot(x, dx)
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs)


def _loss(x, w, g, stride):
    return np.vdot(R.forward(x, w, stride=stride), g)


def _central_difference(f, array, index, eps=1e-6):
    original = array[index]
    array[index] = original + eps
    up = f()
    array[index] = original - eps
    down = f()
    array[index] = original
    return (up - down) / (2 * eps)


def _assert_close(fd, an, scale, what):
    err = abs(fd - an)
    assert err <= 1e-6 * max(abs(an), scale), f"{what}: finite difference {fd!r} vs analytic {an!r}"


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("levels", [0, 1, 2, 3])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_every_gradient_matches_central_differences(rng, bias, levels, k):
    stride = 1 + (levels + k) % 2  # strides 1 and 2 both occur for every k
    w = random_weights(rng, 2, k, levels, bias=bias)
    x = rng.standard_normal((2, 2, 9, 7))
    g = rng.standard_normal(R.forward(x, w, stride=stride).shape)
    dx, dw = R.backward(x, w, g, stride=stride)
    assert (dw.base_bias is None) == (not bias)

    params = {name: a.copy() for name, a in w._asdict().items() if a is not None}
    grads = {name: a for name, a in dw._asdict().items() if a is not None}
    params["x"], grads["x"] = x.copy(), dx

    def loss():
        return _loss(
            params["x"],
            WTConvWeights(**{f: params.get(f) for f in WTConvWeights._fields}),
            g,
            stride,
        )

    for name, array in params.items():
        grad = grads[name]
        assert grad.shape == array.shape
        if array.size == 0:  # no wavelet parameters when levels == 0
            continue
        scale = np.abs(grad).max()
        # a random sample of single entries ...
        for flat in rng.choice(array.size, size=min(array.size, 40), replace=False):
            index = np.unravel_index(flat, array.shape)
            _assert_close(
                _central_difference(loss, array, index), grad[index], scale, f"{name}{index}"
            )
        # ... and one random direction through all entries at once
        direction = rng.standard_normal(array.shape)
        base = array.copy()
        eps = 1e-6
        array[...] = base + eps * direction
        up = loss()
        array[...] = base - eps * direction
        down = loss()
        array[...] = base
        _assert_close(
            (up - down) / (2 * eps),
            np.vdot(grad, direction),
            np.abs(grad).sum(),
            f"{name} direction",
        )


ZEROS = np.zeros((1, 2, 4, 4))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: R.haar_analysis(np.zeros(5)), r"\(\.\.\., H, W\)"),
        (lambda: R.haar_analysis(np.zeros((2, 0))), r"H, W >= 1"),
        (lambda: R.analysis_chain(np.zeros((4, 4)), -1), "levels must be >= 0"),
        (lambda: R.depthwise_conv_same(np.zeros((2, 3, 4)), np.zeros((3, 3, 3))), "B, C, H, W"),
        (lambda: R.depthwise_conv_same(np.zeros((1, 3, 4, 4)), np.zeros((3, 2, 2))), "K odd"),
        (lambda: R.depthwise_conv_same(np.zeros((1, 3, 4, 4)), np.zeros((2, 3, 3))), "channels"),
        (lambda: R.depthwise_conv_same_adjoint(np.zeros((1, 3, 4, 4)), np.zeros((3, 3, 4))), "K"),
        (lambda: R.depthwise_conv_same_weight_grad(ZEROS, np.zeros((1, 2, 4)), 3), "share one"),
        (lambda: R.depthwise_conv_same_weight_grad(ZEROS, ZEROS, 2), "odd"),
    ],
)
def test_building_blocks_reject_malformed_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()
