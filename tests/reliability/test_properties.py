"""Hypothesis properties against the float64 oracle.

(a) The CPU path (NumPy through :func:`wtconv_cuda.forward` / ``backward``):
random shapes (including ``B = 0``), levels, odd ``K``, strides and dtypes.
It must equal the oracle rounded once to each output's dtype, bit for bit,
and the oracle itself must be affine in ``x`` and have the exact adjoint
(the gradients are checked against directional differences, which are exact
here because the operator is linear in each parameter separately).

(b) The generated kernels in numba's CUDA simulator, on tiny shapes. The
examples are derandomized, so CI runs the same cases every time.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wtconv_cuda as wt
from wtconv_cuda import reference
from wtconv_cuda.kernels.launch import Tuning

from ..conftest import random_weights
from .helpers import (
    SMEM, STORAGE, TOL, cast_weights, check_sim_against_oracle, needs_simulator, out_shape,
    sim_forward,
)

DTYPES = [np.float16, np.float32, np.float64]

CPU_SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                        suppress_health_check=[HealthCheck.too_slow])
SIM_SETTINGS = settings(max_examples=15, deadline=None, derandomize=True, database=None,
                        suppress_health_check=[HealthCheck.too_slow,
                                               HealthCheck.data_too_large])


@st.composite
def problems(draw, batch=(0, 2), channels=(1, 3), size=(1, 12), levels=(0, 4),
             kernel_sizes=(1, 3, 5, 7), strides=(1, 3)):
    shape = (draw(st.integers(*batch)), draw(st.integers(*channels)),
             draw(st.integers(*size)), draw(st.integers(*size)))
    return dict(shape=shape, levels=draw(st.integers(*levels)),
                k=draw(st.sampled_from(kernel_sizes)), stride=draw(st.integers(*strides)),
                bias=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)))


def draw_inputs(p, x_dtype, w_dtype=None, dy_dtype=None):
    rng = np.random.default_rng(p["seed"])
    x = rng.standard_normal(p["shape"]).astype(x_dtype)
    w = random_weights(rng, p["shape"][1], p["k"], p["levels"], bias=p["bias"],
                       dtype=w_dtype or x_dtype)
    dy = rng.standard_normal(out_shape(p["shape"], p["stride"])).astype(dy_dtype or x_dtype)
    return rng, x, w, dy


# ---------------------------------------------------------------------------
# (a) CPU path
# ---------------------------------------------------------------------------


@CPU_SETTINGS
@given(p=problems(), x_dtype=st.sampled_from(DTYPES), w_dtype=st.sampled_from(DTYPES),
       dy_dtype=st.sampled_from(DTYPES))
def test_cpu_path_is_the_oracle_rounded_once(p, x_dtype, w_dtype, dy_dtype):
    """Any mix of float dtypes on the CPU: float64 compute, one rounding per output."""
    _, x, w, dy = draw_inputs(p, x_dtype, w_dtype, dy_dtype)
    levels, stride = p["levels"], p["stride"]
    tape = wt.Tape()
    y = wt.forward(x, w, stride=stride, tape=tape)
    assert y.dtype == x_dtype and y.shape == out_shape(x.shape, stride)
    np.testing.assert_array_equal(y, reference.forward(x, w, levels, stride).astype(x_dtype))
    dx, dw = tape.backward(dy)
    dx_ref, dw_ref = reference.backward(x, w, dy, levels, stride)
    assert dx.dtype == x_dtype
    np.testing.assert_array_equal(dx, dx_ref.astype(x_dtype))
    for name, param in w._asdict().items():
        grad, want = getattr(dw, name), getattr(dw_ref, name)
        if param is None:
            assert grad is None and want is None
            continue
        assert grad.dtype == param.dtype and grad.shape == param.shape, name
        np.testing.assert_array_equal(grad, want.astype(param.dtype), err_msg=name)


def close64(got, want, rel=1e-10):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    assert float(np.max(np.abs(got - want), initial=0.0)) <= rel * scale


@CPU_SETTINGS
@given(p=problems(batch=(1, 2)), a=st.floats(-3, 3), b=st.floats(-3, 3))
def test_oracle_is_affine_in_x(p, a, b):
    rng, x1, w, _ = draw_inputs(p, np.float64)
    x2 = rng.standard_normal(x1.shape)
    levels, stride = p["levels"], p["stride"]
    f = lambda x: reference.forward(x, w, levels, stride)  # noqa: E731
    f0 = f(np.zeros_like(x1))
    close64(f(a * x1 + b * x2), a * f(x1) + b * f(x2) + (1 - a - b) * f0)


@CPU_SETTINGS
@given(p=problems(batch=(1, 2)))
def test_oracle_gradients_are_exact_directional_derivatives(p):
    """``<dx, v> = <f(x + v) - f(x), dy>`` and the same for every parameter: the operator is
    linear in x and in each parameter array on its own (the others fixed)."""
    rng, x, w, dy = draw_inputs(p, np.float64)
    levels, stride = p["levels"], p["stride"]
    y = reference.forward(x, w, levels, stride)
    dx, dw = reference.backward(x, w, dy, levels, stride)
    v = rng.standard_normal(x.shape)
    y_v = reference.forward(x + v, w, levels, stride)
    close64(np.vdot(dx, v), np.vdot(y_v - y, dy), 1e-9)
    for name, param in w._asdict().items():
        if param is None:
            continue
        v = rng.standard_normal(param.shape)
        w_v = w._replace(**{name: param + v})
        y_v = reference.forward(x, w_v, levels, stride)
        close64(np.vdot(getattr(dw, name), v), np.vdot(y_v - y, dy), 1e-9)


# ---------------------------------------------------------------------------
# (b) The generated kernels in the simulator
# ---------------------------------------------------------------------------


@needs_simulator
@SIM_SETTINGS
@given(p=problems(batch=(1, 2), channels=(1, 2), size=(1, 9), levels=(0, 3),
                  kernel_sizes=(1, 3, 5)),
       storage=st.sampled_from(sorted(STORAGE)), shared_limit=st.sampled_from([SMEM, 0]),
       planes_per_block=st.sampled_from([1, 2]))
def test_simulated_kernels_match_oracle(p, storage, shared_limit, planes_per_block):
    dtype = STORAGE[storage]
    _, x, w, dy = draw_inputs(p, dtype)
    w = cast_weights(w, dtype)
    levels, stride = p["levels"], p["stride"]
    check_sim_against_oracle(x, w, dy, levels, stride, TOL[storage], shared_limit=shared_limit,
                             tuning=Tuning(planes_per_block=planes_per_block))


@needs_simulator
@SIM_SETTINGS
@given(p=problems(batch=(1, 1), channels=(1, 2), size=(1, 8), levels=(0, 3),
                  kernel_sizes=(1, 3)),
       a=st.sampled_from([0.5, -2.0, 3.0]))
def test_simulated_forward_is_affine_in_x(p, a):
    """float32 kernels: ``f(a x1 + x2) - f(0) = a (f(x1) - f(0)) + (f(x2) - f(0))`` up to
    float32 rounding (a regression guard against state carried between planes or calls)."""
    rng, x1, w, _ = draw_inputs(p, np.float32)
    x2 = rng.standard_normal(x1.shape).astype(np.float32)
    w = cast_weights(w, np.float32)
    levels, stride = p["levels"], p["stride"]
    # Stack the four inputs as one batch: one launch, four planes per channel.
    xs = np.ascontiguousarray(np.concatenate(
        [a * x1 + x2, x1, x2, np.zeros_like(x1)]).astype(np.float32))
    y = sim_forward(xs, w, levels, stride, tuning=Tuning(planes_per_block=2)).astype(np.float64)
    n = x1.shape[0]
    mix, y1, y2, y0 = (y[i * n:(i + 1) * n] for i in range(4))
    want = a * (y1 - y0) + (y2 - y0)
    scale = max(1.0, float(np.max(np.abs(y))))
    assert float(np.max(np.abs((mix - y0) - want))) <= 1e-5 * scale * (abs(a) + 2)
