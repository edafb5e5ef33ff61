"""NaN, Inf and float16 overflow: the kernels (simulator) against the float64 oracle.

One input element is set to NaN, +Inf or -Inf; the set of non-finite outputs
of the kernels must equal the oracle's set exactly: no NaN may leak into
outputs that do not depend on that element (through shared tiles, padded tap
tables, buffer reuse across planes) and none may be lost.

The cases include the two leaks found (and fixed) in the kernels: a zero
tap of the stride-1 output phase meeting the pixel just outside an output
column's window, and, for odd ``W``, the missing pixel column ``W`` (gradient
0) meeting ``x`` in the base weight-gradient correlation.
:func:`test_forward_every_pixel_of_a_plane` sweeps every pixel position.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from wtconv_cuda import reference
from wtconv_cuda.kernels.launch import Tuning

from ..conftest import random_weights
from .helpers import (
    SMEM, STORAGE, assert_same_nonfinite, cast_weights, describe_mask_diff, forward_footprint,
    level_grids, needs_simulator, nonfinite, out_shape, sim_backward, sim_forward, touching_taps,
)


@pytest.fixture(autouse=True)
def _no_fp_warnings():
    """Silence NumPy's floating-point warnings (the simulator computes on NumPy scalars)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


#: Two planes per block instead of the default eight for tiny planes: the simulator runs
#: every thread of a block, and the six spare groups would recompute the last plane. The
#: default grouping is covered by the isolation tests below.
FAST = Tuning(planes_per_block=2)


def make_inputs(seed, shape, k, levels, stride, storage="float32", bias=True):
    rng = np.random.default_rng(seed)
    dtype = STORAGE[storage]
    x = rng.standard_normal(shape).astype(dtype)
    w = cast_weights(random_weights(rng, shape[1], k, levels, bias=bias), dtype)
    dy = rng.standard_normal(out_shape(shape, stride)).astype(dtype)
    return x, w, dy


# ---------------------------------------------------------------------------
# The oracle: non-finite values stay local (shifted sums, per-block Haar steps)
# ---------------------------------------------------------------------------

ORACLE_CASES = [  # (H, W), K, L, pixel
    ((9, 11), 3, 0, (4, 5)), ((9, 11), 5, 0, (0, 10)), ((9, 11), 3, 1, (4, 5)),
    ((9, 11), 3, 2, (8, 3)), ((16, 13), 5, 3, (7, 6)), ((9, 11), 1, 3, (5, 5)),
    ((1, 13), 3, 2, (0, 6)), ((7, 1), 5, 4, (6, 0)),
]


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("hw,k,levels,pixel", ORACLE_CASES)
def test_oracle_keeps_non_finite_values_local(hw, k, levels, pixel, value):
    """The oracle's convolution is a sum of shifted products, its Haar steps act per 2x2
    block: a non-finite pixel reaches exactly the outputs that depend on it."""
    x, w, _ = make_inputs(0, (2, 2, *hw), k, levels, 1, "float32")
    x = x.astype(np.float64)
    x[1, 0][pixel] = value
    y = reference.forward(x, w, levels)
    expected = np.zeros(y.shape, bool)
    expected[1, 0] = forward_footprint(*hw, k, levels, *pixel)
    assert np.array_equal(nonfinite(y), expected), describe_mask_diff(nonfinite(y), expected)
    # Adjoint: a non-finite output gradient reaches dx over the same footprint.
    dy = np.ones(y.shape)
    dy[1, 0][pixel] = value
    dx, _ = reference.backward(np.zeros_like(x), w, dy, levels)
    assert np.array_equal(nonfinite(dx), expected), describe_mask_diff(nonfinite(dx), expected)


def test_oracle_weight_gradient_skips_taps_that_touch_no_pixel():
    """The oracle's weight gradient leaves taps that reach no pixel of a grid at exactly 0,
    even when dy holds NaN (it never forms 0 * NaN for them)."""
    x, w, dy = make_inputs(1, (1, 1, 1, 5), 3, 1, 1, "float32")
    dy = dy.astype(np.float64)
    dy[0, 0, 0, 2] = np.nan
    _, dw = reference.backward(x, w, dy, 1)
    assert np.array_equal(dw.base_weight[0, [0, 2]], np.zeros((2, 3)))
    assert np.isnan(dw.base_weight[0, 1]).all()


# ---------------------------------------------------------------------------
# Forward in the simulator: one non-finite pixel
# ---------------------------------------------------------------------------


def forward_case(hw, k, levels, stride, pixel, value, storage="float32"):
    h, w = hw
    label = {np.nan: "nan", np.inf: "inf", -np.inf: "-inf"}[value]
    return pytest.param(hw, k, levels, stride, pixel, value, storage,
                        id=f"{h}x{w}-K{k}-L{levels}-s{stride}-px{pixel[0]},{pixel[1]}-{label}"
                           f"-{storage}")


FORWARD_CASES = (
    # Base path only at stride 1: the old zero-tap leak would be visible here (no
    # wavelet level covers the neighbouring column).
    [forward_case((5, 7), k, 0, 1, (2, px), np.nan) for k in (1, 3, 5) for px in (0, 2, 3, 6)]
    + [forward_case((6, 8), 3, 0, 1, (3, px), v) for px, v in
       ((4, np.inf), (5, -np.inf), (0, np.inf), (7, np.nan))]
    + [forward_case((5, 7), 3, 0, 1, (2, 3), np.nan, "float16"),
       forward_case((5, 7), 3, 0, 1, (2, 2), np.inf, "float16")]
    # Strides 2 and 3.
    + [forward_case((5, 7), k, 0, s, pixel, v) for k, s, pixel, v in
       ((1, 2, (2, 2), np.nan), (3, 2, (1, 6), np.inf), (5, 2, (2, 3), np.nan),
        (1, 3, (3, 3), np.inf), (3, 3, (2, 3), np.nan), (5, 3, (1, 6), -np.inf))]
    # With wavelet levels (the level-1 footprint is wider than the base window).
    + [forward_case((6, 7), k, lv, s, (3, px), v) for k, lv, s, px, v in
       ((1, 1, 1, 2, np.nan), (3, 1, 1, 5, np.inf), (5, 1, 1, 2, np.nan),
        (1, 2, 1, 5, -np.inf), (3, 2, 1, 2, np.nan), (5, 2, 2, 6, np.inf),
        (3, 1, 2, 6, -np.inf))]
    + [forward_case((5, 7), 3, 3, 3, (4, 6), np.nan, "float16")]
)


@needs_simulator
@pytest.mark.parametrize("hw,k,levels,stride,pixel,value,storage", FORWARD_CASES)
def test_forward_non_finite_set_matches_oracle(hw, k, levels, stride, pixel, value, storage):
    x, w, _ = make_inputs(2, (1, 2, *hw), k, levels, stride, storage)
    x[0, 1][pixel] = value
    y = sim_forward(x, w, levels, stride, tuning=FAST)
    want = reference.forward(x, w, levels, stride)
    got_mask, want_mask = nonfinite(y), nonfinite(want)
    assert not want_mask[0, 0].any()  # (the pixel may be skipped by the stride)
    assert np.array_equal(got_mask, want_mask), describe_mask_diff(got_mask, want_mask)


@needs_simulator
@pytest.mark.parametrize("k", [1, 3, 5])
def test_forward_every_pixel_of_a_plane(k):
    """Every pixel of a plane in turn (one channel per pixel, one launch): the non-finite
    outputs are exactly the oracle's."""
    h, w = 4, 5
    x, wts, _ = make_inputs(3, (1, h * w, h, w), k, 0, 1)
    pixels = [(py, px) for py in range(h) for px in range(w)]
    for c, pixel in enumerate(pixels):
        x[0, c][pixel] = np.nan
    got = nonfinite(sim_forward(x, wts, 0, 1))[0]
    want = nonfinite(reference.forward(x, wts, 0, 1))[0]
    for c, pixel in enumerate(pixels):
        assert np.array_equal(got[c], want[c]), (
            f"pixel {pixel}: {describe_mask_diff(got[c], want[c])}")


# ---------------------------------------------------------------------------
# Backward in the simulator
# ---------------------------------------------------------------------------


def structural_taps(k, grid):
    """Taps of a K x K kernel that touch no point of ``grid`` (the oracle leaves them 0)."""
    ty, tx = touching_taps(k, grid[0]), touching_taps(k, grid[1])
    return ~(ty[:, None] & tx[None, :])


def dy_case(hw, k, levels, stride, opix, value):
    h, w = hw
    label = "nan" if np.isnan(value) else "inf"
    return pytest.param(hw, k, levels, stride, opix, value,
                        id=f"{h}x{w}-K{k}-L{levels}-s{stride}-dy{opix[0]},{opix[1]}-{label}")


DY_CASES = (
    [dy_case((5, 7), k, 0, s, opix, np.nan) for k in (1, 3) for s, opix in
     ((1, (2, 2)), (1, (2, 3)), (2, (1, 1)), (3, (1, 2)))]
    + [dy_case((5, 6), 5, lv, s, opix, v) for lv, s, opix, v in
       ((1, 1, (2, 3), np.inf), (2, 2, (1, 2), np.nan), (1, 3, (0, 1), np.inf))]
    + [dy_case((1, 5), 3, 1, 1, (0, 2), np.nan), dy_case((3, 2), 3, 2, 1, (2, 1), np.inf)]
)


@needs_simulator
@pytest.mark.parametrize("hw,k,levels,stride,opix,value", DY_CASES)
def test_dx_non_finite_set_matches_oracle(hw, k, levels, stride, opix, value):
    x, w, dy = make_inputs(4, (2, 2, *hw), k, levels, stride)
    dy[1, 0][opix] = value
    dx, _ = sim_backward(x, w, dy, levels, stride, tuning=FAST)
    dx_ref, _ = reference.backward(x, w, dy, levels, stride)
    got, want = nonfinite(dx), nonfinite(dx_ref)
    assert want[1, 0].any() and want.sum() == want[1, 0].sum()
    assert np.array_equal(got, want), describe_mask_diff(got, want)


@needs_simulator
@pytest.mark.parametrize("hw,k,levels,stride,opix,value", [
    ((5, 7), 3, 0, 1, (2, 3), np.nan), ((5, 6), 5, 2, 2, (1, 2), np.inf),
    ((1, 5), 3, 1, 1, (0, 2), np.nan), ((3, 2), 3, 2, 1, (2, 1), np.inf),
    ((2, 9), 5, 3, 3, (0, 1), np.nan),
])
def test_weight_gradients_with_non_finite_dy(hw, k, levels, stride, opix, value):
    """The kernels make every tap of the channel non-finite; the oracle all taps except
    those that touch no pixel of their grid, which it leaves at exactly 0 (it never forms
    0 * NaN for them). The two agree on every other entry and on the other channels."""
    h, w = hw
    x, wts, dy = make_inputs(5, (2, 2, h, w), k, levels, stride)
    dy[1, 0][opix] = value
    _, dw = sim_backward(x, wts, dy, levels, stride, tuning=FAST)
    _, dw_ref = reference.backward(x, wts, dy, levels, stride)
    grids = level_grids(h, w, levels)
    convention = {name: np.zeros(np.shape(a), bool) for name, a in dw_ref._asdict().items()
                  if a is not None}
    convention["base_weight"][0] = structural_taps(k, grids[0])
    for j in range(1, levels + 1):
        convention["wavelet_weight"][j - 1, 0] = structural_taps(k, grids[j])[None]
    for name, want in dw_ref._asdict().items():
        if want is None:
            continue
        got_mask = nonfinite(getattr(dw, name))
        want_mask = nonfinite(want)
        axis = 1 if name.startswith("wavelet") else 0  # the channel axis
        others = (slice(None),) * axis + (slice(1, None),)
        assert not want_mask[others].any() and not got_mask[others].any(), (
            f"{name}: non-finite values in other channels")
        assert np.array_equal(got_mask, want_mask | convention[name]), (
            f"{name}: {describe_mask_diff(got_mask, want_mask)}")


def x_case(hw, k, levels, stride, pixel, value):
    label = "nan" if np.isnan(value) else "inf"
    return pytest.param(hw, k, levels, stride, pixel, value,
                        id=f"{hw[0]}x{hw[1]}-K{k}-L{levels}-s{stride}-x{pixel[0]},{pixel[1]}"
                           f"-{label}")


X_CASES = [
    x_case((5, 7), 3, 0, 1, (2, 6), np.nan),   # last column of an odd width (old leak)
    x_case((5, 7), 3, 1, 2, (0, 6), np.inf),
    x_case((5, 7), 5, 0, 1, (2, 5), np.nan),   # column W-2 with R = 2 (old leak)
    x_case((5, 7), 5, 1, 1, (4, 6), -np.inf),
    x_case((5, 7), 3, 1, 1, (2, 5), np.nan),   # column W-2 with R = 1
    x_case((5, 8), 3, 1, 1, (2, 7), np.nan),   # even width: no phantom column
    x_case((4, 6), 5, 2, 3, (3, 0), np.inf),
    x_case((3, 1), 3, 2, 1, (1, 0), np.nan),
]


@needs_simulator
@pytest.mark.parametrize("hw,k,levels,stride,pixel,value", X_CASES)
def test_backward_with_non_finite_x(hw, k, levels, stride, pixel, value):
    """A non-finite ``x`` pixel reaches the weight gradients of its channel only (dx does not
    depend on x)."""
    x, w, dy = make_inputs(6, (2, 2, *hw), k, levels, stride)
    x[0, 1][pixel] = value
    dx, dw = sim_backward(x, w, dy, levels, stride, tuning=FAST)
    dx_ref, dw_ref = reference.backward(x, w, dy, levels, stride)
    assert np.isfinite(dx).all() and np.isfinite(dx_ref).all()
    assert_same_nonfinite(dw, dw_ref)


# ---------------------------------------------------------------------------
# Isolation between planes: shared-memory groups and persistent scratch blocks
# ---------------------------------------------------------------------------

ISOLATION = {
    # several planes side by side in one block (shared memory)
    "smem-grouped": dict(shared_limit=SMEM, max_slots=2, tuning=Tuning()),
    # one persistent block walking every plane through one global-scratch slot
    "scratch-persistent": dict(shared_limit=0, max_slots=1,
                               tuning=Tuning(threads=32, planes_per_block=1)),
    # two persistent blocks of two planes each
    "scratch-grouped": dict(shared_limit=0, max_slots=4,
                            tuning=Tuning(threads=32, planes_per_block=2)),
}


@needs_simulator
@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("path", list(ISOLATION))
def test_non_finite_plane_does_not_leak_into_other_planes(path, value):
    """Plane (b=0, c=0) runs first; the planes after it reuse its buffers."""
    shape, k, levels, stride = (2, 3, 6, 6), 3, 2, 1
    x, w, dy = make_inputs(7, shape, k, levels, stride)
    x[0, 0, 2, 3] = value
    dy[0, 0, 4, 1] = value
    opts = ISOLATION[path]
    y = sim_forward(x, w, levels, stride, **opts)
    dx, dw = sim_backward(x, w, dy, levels, stride, **opts)
    y_ref = reference.forward(x, w, levels, stride)
    dx_ref, dw_ref = reference.backward(x, w, dy, levels, stride)
    pairs = {"y": (y, y_ref), "dx": (dx, dx_ref)}
    pairs.update({n: (getattr(dw, n), a) for n, a in dw_ref._asdict().items() if a is not None})
    for name, (got, want) in pairs.items():
        got_mask, want_mask = nonfinite(got), nonfinite(want)
        assert np.array_equal(got_mask, want_mask), (
            f"{name}: {describe_mask_diff(got_mask, want_mask)}")
    assert np.isfinite(y[:, 1:]).all() and np.isfinite(y[1]).all()


# ---------------------------------------------------------------------------
# float16: the float32 result overflows on the float16 store
# ---------------------------------------------------------------------------

F16_MAX_EDGE = 65520.0  # values at or above this magnitude round to Inf in float16


def compare_fp16_overflow(name, got, want64):
    """``got`` (float16 from the kernels) against the float64 oracle rounded to float16."""
    want = want64.astype(np.float16)
    ambiguous = np.abs(np.abs(want64) - F16_MAX_EDGE) < 1.0  # fp32 rounding may tip these
    got, want = got.astype(np.float64), want.astype(np.float64)
    keep = ~ambiguous
    assert np.array_equal(np.isnan(got), np.zeros_like(keep)), f"{name}: NaN in the result"
    assert np.array_equal(np.isinf(got)[keep], np.isinf(want)[keep]), f"{name}: Inf set differs"
    inf = np.isinf(want) & keep
    assert np.array_equal(np.sign(got[inf]), np.sign(want[inf])), f"{name}: Inf sign differs"
    fin = keep & ~np.isinf(want)
    ulp = np.spacing(np.abs(want[fin]).astype(np.float16)).astype(np.float64)
    assert (np.abs(got[fin] - want[fin]) <= ulp).all(), f"{name}: more than 1 ulp off"
    return int(inf.sum()), int(fin.sum())


@needs_simulator
def test_float16_overflow_on_store_gives_inf_like_the_rounded_oracle():
    rng = np.random.default_rng(8)
    shape, k, levels, stride = (2, 2, 6, 7), 3, 1, 1
    x = (rng.uniform(-1, 1, shape) * 3.0e4).astype(np.float16)
    w = cast_weights(random_weights(rng, 2, k, levels), np.float16)
    dy = (rng.uniform(-1, 1, out_shape(shape, stride)) * 3.0e4).astype(np.float16)
    y = sim_forward(x, w, levels, stride)
    infs, finite = compare_fp16_overflow("y", y, reference.forward(x, w, levels, stride))
    assert infs > 5 and finite > 5, (infs, finite)  # both regimes are exercised

    dx, dw = sim_backward(x, w, dy, levels, stride)
    dx_ref, dw_ref = reference.backward(x, w, dy, levels, stride)
    infs, finite = compare_fp16_overflow("dx", dx, dx_ref)
    assert infs > 5 and finite > 5, (infs, finite)
    for name, want in dw_ref._asdict().items():
        compare_fp16_overflow(name, getattr(dw, name), want)
    assert np.isinf(dw.base_weight.astype(np.float64)).any()  # products near 1e9 overflow


@needs_simulator
def test_float16_large_but_representable_results_stay_finite():
    """Results just below the float16 limit (accumulated in float32) store finite values."""
    x = np.full((1, 1, 4, 4), 16000.0, np.float16)
    w = cast_weights(random_weights(np.random.default_rng(9), 1, 1, 0), np.float16)
    w = w._replace(base_weight=np.full((1, 1, 1), 4.0, np.float16),
                   base_bias=np.full(1, 1.0, np.float16),
                   base_scale=np.ones(1, np.float16))
    y = sim_forward(x, w, 0, 1).astype(np.float64)  # 4 * 16000 + 1 = 64001 -> 64000
    assert np.array_equal(y, np.full(y.shape, 64000.0))
    w = w._replace(base_weight=np.full((1, 1, 1), 4.125, np.float16))  # 66001: overflow
    assert np.isposinf(sim_forward(x, w, 0, 1).astype(np.float64)).all()
