"""JAX binding on the CPU: oracle agreement of the output and of the custom VJP, eager and jit."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from wtconv_cuda import WTConvWeights, reference  # noqa: E402
from wtconv_cuda.bindings import jax as wtjax  # noqa: E402

from ..conftest import random_weights  # noqa: E402


def to_jax(w, dtype=jnp.float32):
    return WTConvWeights(*(None if a is None else jnp.asarray(a, dtype) for a in w))


def to_f64(w):
    return WTConvWeights(*(None if a is None else np.asarray(a, np.float64) for a in w))


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = np.linalg.norm(want)
    return np.linalg.norm(got - want) / (scale if scale > 0 else 1.0)


CASES = [
    ((2, 3, 17, 23), 5, 3, 1, True),
    ((1, 2, 9, 8), 3, 2, 2, False),
    ((2, 4, 7, 7), 5, 0, 1, True),
    ((1, 3, 1, 6), 3, 4, 3, True),
]


def inputs(rng, shape, k, levels, bias):
    w = to_jax(random_weights(rng, shape[1], k, levels, bias))
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    return x, w


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("shape,k,levels,stride,bias", CASES)
def test_forward_and_vjp_match_oracle(rng, shape, k, levels, stride, bias, jit):
    x, w = inputs(rng, shape, k, levels, bias)

    def f(x, w):
        return wtconv2d_checked(x, w, levels, stride)

    fwd = jax.jit(f) if jit else f
    y = fwd(x, w)
    xr, wr = np.asarray(x, np.float64), to_f64(w)
    assert y.dtype == jnp.float32
    assert rel(y, reference.forward(xr, wr, levels, stride)) < 1e-6

    dy = jnp.asarray(rng.standard_normal(y.shape), jnp.float32)
    grad = jax.grad(lambda x, w: jnp.sum(f(x, w) * dy), argnums=(0, 1))
    dx, dw = (jax.jit(grad) if jit else grad)(x, w)
    dx_ref, dw_ref = reference.backward(xr, wr, np.asarray(dy, np.float64), levels, stride)
    assert rel(dx, dx_ref) < 1e-6
    for name in WTConvWeights._fields:
        got, want = getattr(dw, name), getattr(dw_ref, name)
        if want is None:
            assert got is None
        else:
            assert got.dtype == jnp.float32 and rel(got, want) < 1e-6, name


def wtconv2d_checked(x, w, levels, stride):
    return wtjax.wtconv2d(x, w, levels=levels, stride=stride)


def test_vjp_of_jitted_function_and_value_and_grad(rng):
    x, w = inputs(rng, (2, 3, 12, 10), 3, 2, True)
    loss = jax.jit(jax.value_and_grad(lambda w: jnp.sum(wtjax.wtconv2d(x, w) ** 2)))
    value, dw = loss(w)
    y = reference.forward(np.asarray(x, np.float64), to_f64(w))
    assert abs(float(value) - np.sum(y ** 2)) / np.sum(y ** 2) < 1e-5
    _, dw_ref = reference.backward(np.asarray(x, np.float64), to_f64(w), 2 * y)
    assert rel(dw.wavelet_scale, dw_ref.wavelet_scale) < 1e-5


def test_vmap(rng):
    x, w = inputs(rng, (2, 3, 9, 9), 3, 1, True)
    xs = jnp.stack([x, 2 * x])
    ys = jax.vmap(lambda a: wtjax.wtconv2d(a, w))(xs)
    assert ys.shape == (2, 2, 3, 9, 9)
    for a, b in zip(xs, ys):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(wtjax.wtconv2d(a, w)))


def test_bfloat16(rng):
    x, w = inputs(rng, (1, 2, 11, 13), 5, 2, True)
    xb, wb = x.astype(jnp.bfloat16), to_jax(w, jnp.bfloat16)
    y = jax.jit(wtjax.wtconv2d)(xb, wb)
    assert y.dtype == jnp.bfloat16
    y_ref = reference.forward(np.asarray(xb, np.float64), to_f64(wb))
    assert rel(y, y_ref) < 1e-2
    dx, dw = jax.grad(lambda x, w: jnp.sum(wtjax.wtconv2d(x, w).astype(jnp.float32)),
                      argnums=(0, 1))(xb, wb)
    assert dx.dtype == dw.base_weight.dtype == jnp.bfloat16


def test_empty_batch(rng):
    _, w = inputs(rng, (1, 3, 5, 5), 3, 1, True)
    x = jnp.zeros((0, 3, 5, 5), jnp.float32)
    assert wtjax.wtconv2d(x, w, stride=2).shape == (0, 3, 3, 3)
    dw = jax.grad(lambda w: jnp.sum(wtjax.wtconv2d(x, w)))(w)
    assert not np.any(np.asarray(dw.wavelet_weight))


def test_inputs_are_not_modified(rng):
    x, w = inputs(rng, (1, 2, 8, 8), 3, 2, True)
    before = [np.array(a) for a in (x, *w)]
    jax.grad(lambda x: jnp.sum(wtjax.wtconv2d(x, w)))(x)
    for a, b in zip((x, *w), before):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_errors(rng):
    x, w = inputs(rng, (1, 3, 8, 8), 3, 1, True)
    with pytest.raises(TypeError, match="WTConvWeights"):
        wtjax.wtconv2d(x, tuple(w))
    with pytest.raises(TypeError, match="dtype"):
        wtjax.wtconv2d(x.astype(jnp.float16), w)
    with pytest.raises(ValueError, match="levels = 2"):
        wtjax.wtconv2d(x, w, levels=2)
    with pytest.raises(ValueError, match="channels"):
        wtjax.wtconv2d(x[:, :2], w)
    with pytest.raises(ValueError, match="eager mechanism"):
        wtjax.set_eager_mechanism("pure_callback")


def test_eager_mechanism_switch(rng):
    x, w = inputs(rng, (1, 2, 8, 8), 3, 1, True)
    before = wtjax.eager_mechanism()
    try:
        wtjax.set_eager_mechanism("callback")
        assert wtjax.eager_mechanism() == "callback"
        y = wtjax.wtconv2d(x, w)
    finally:
        wtjax.set_eager_mechanism(before)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(wtjax.wtconv2d(x, w)))
