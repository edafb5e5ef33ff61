"""Edge shapes, exact against the float64 oracle.

CPU path (NumPy through :func:`wtconv_cuda.forward`): heights and widths of
1, 2 and 3, primes, ``H != W``, ``B = 0``, ``C = 1``, a very wide plane
(1 x 4097) and more levels than the image has halvings (1 x 1 coarse grids).
The CPU path *is* the oracle rounded once, so these also check the oracle's
two synthesis forms against each other on the same shapes.

Simulator (the generated GPU kernels through the real launch planner, outputs
poisoned with NaN): the same shapes, kept tiny, with a narrow 1 x 67 plane
instead of 1 x 4097; both the shared-memory and the global-scratch variants.
"""

from __future__ import annotations

import numpy as np
import pytest

import wtconv_cuda as wt
from wtconv_cuda import reference
from wtconv_cuda.kernels.launch import Tuning

from ..conftest import random_weights
from .helpers import (
    SMEM, STORAGE, TOL, assert_close, cast_weights, check_sim_against_oracle, level_grids, needs_simulator, out_shape,
    sim_forward,
)

CPU_SHAPES = [  # (B, C, H, W), K, L, stride
    ((2, 3, 1, 1), 3, 0, 1), ((1, 2, 1, 1), 5, 3, 1), ((2, 1, 1, 2), 3, 2, 2),
    ((1, 2, 2, 1), 3, 1, 1), ((2, 2, 2, 2), 7, 4, 1), ((1, 1, 3, 3), 5, 3, 3),
    ((1, 2, 1, 3), 3, 2, 1), ((1, 2, 3, 1), 1, 2, 2), ((2, 1, 2, 3), 3, 2, 2),
    ((1, 2, 7, 11), 3, 2, 1), ((2, 1, 13, 5), 5, 2, 2), ((1, 1, 11, 7), 7, 3, 3),
    ((1, 1, 17, 19), 5, 5, 1), ((0, 3, 7, 5), 3, 2, 1), ((0, 1, 1, 1), 1, 0, 2),
    ((1, 1, 1, 4097), 5, 5, 1), ((2, 2, 1, 4097), 3, 3, 3), ((1, 1, 4097, 1), 3, 2, 2),
    ((1, 1, 1, 1), 3, 6, 1), ((1, 3, 3, 2), 3, 5, 2),
]


def cpu_case_id(case):
    (b, c, h, w), k, levels, stride = case
    return f"{b}x{c}x{h}x{w}-K{k}-L{levels}-s{stride}"


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape,k,levels,stride", CPU_SHAPES, ids=map(cpu_case_id, CPU_SHAPES))
def test_cpu_path_edge_shapes(rng, shape, k, levels, stride, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    w = random_weights(rng, shape[1], k, levels, dtype=dtype)
    tape = wt.Tape()
    y = wt.forward(x, w, stride=stride, tape=tape)
    assert y.shape == out_shape(shape, stride) and y.dtype == dtype
    y_ref = reference.forward(x, w, levels, stride)
    np.testing.assert_array_equal(y, y_ref.astype(dtype))
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx, dw = tape.backward(dy)
    dx_ref, dw_ref = reference.backward(x, w, dy, levels, stride)
    assert dx.shape == shape and dx.dtype == dtype
    np.testing.assert_array_equal(dx, dx_ref.astype(dtype))
    for name, g in dw._asdict().items():
        want = getattr(dw_ref, name).astype(dtype)
        assert g.shape == getattr(w, name).shape
        np.testing.assert_array_equal(g, want, err_msg=name)
        if shape[0] == 0:
            assert not g.any(), f"{name}: an empty batch has zero gradients"


@pytest.mark.parametrize("shape,k,levels", [
    ((1, 2, 1, 1), 3, 4), ((1, 1, 1, 4097), 5, 5), ((2, 1, 3, 2), 3, 5),
    ((1, 2, 7, 11), 3, 3), ((1, 1, 13, 5), 5, 4), ((1, 1, 2, 3), 7, 3),
])
def test_oracle_synthesis_forms_agree_on_edge_shapes(rng, shape, k, levels):
    """The chain and the closed form of SPEC.md agree where grids shrink to 1 x 1."""
    zs = [rng.standard_normal((*shape[:2], 4, *grid)) for grid in
          level_grids(*shape[2:], levels)[1:]]
    chain = reference.synthesis_chain(zs, shape[2:])
    closed = reference.closed_form_synthesis(zs, shape[2:])
    np.testing.assert_allclose(chain, closed, rtol=1e-12, atol=1e-12)


def test_levels_past_a_one_by_one_grid_keep_adding_the_raw_ll(rng):
    """On a 1 x 1 image every level's grid is 1 x 1: level j's four subbands all equal
    ``x / 2^j`` and only the centre taps touch them, so the output is an explicit sum."""
    x = rng.standard_normal((1, 1, 1, 1))
    levels, k = 4, 3
    w = random_weights(rng, 1, k, levels)
    y = reference.forward(x, w, levels)
    v = x[0, 0, 0, 0]
    centre = (k - 1) // 2
    want = w.base_scale[0] * (w.base_weight[0, centre, centre] * v + w.base_bias[0])
    ll = v  # the analysis of [[v, 0], [0, 0]] gives LL = LH = HL = HH = v / 2
    r = 0.0
    contributions = []
    for j in range(levels):
        ll = ll / 2  # all four subbands equal the previous LL / 2
        z = w.wavelet_scale[j, 0] * w.wavelet_weight[j, 0, :, centre, centre] * ll
        contributions.append(z)
    for z in reversed(contributions):  # synthesis, top-left pixel of each 2 x 2 block
        r = (z[0] + r + z[1] + z[2] + z[3]) / 2
    np.testing.assert_allclose(y[0, 0, 0, 0], want + r, rtol=1e-12)


# ---------------------------------------------------------------------------
# The generated kernels in the simulator
# ---------------------------------------------------------------------------

SIM_CASES = [  # (B, C, H, W), K, L, stride, storage, shared_limit
    ((1, 2, 1, 1), 3, 0, 1, "float32", SMEM),
    ((1, 1, 1, 1), 3, 3, 1, "float32", SMEM),        # L deeper than the image
    ((1, 2, 1, 2), 5, 2, 2, "float32", SMEM),
    ((2, 1, 2, 1), 3, 1, 1, "float32", 0),
    ((1, 1, 2, 3), 3, 2, 1, "float32", SMEM),
    ((1, 2, 3, 3), 5, 3, 3, "float32", SMEM),
    ((1, 1, 3, 1), 1, 2, 2, "float32", SMEM),
    ((1, 1, 1, 3), 3, 2, 1, "float16", SMEM),
    ((1, 1, 2, 2), 7, 4, 1, "float32", SMEM),        # K > H, W and 1 x 1 coarse grids
    ((1, 1, 7, 11), 3, 2, 1, "float32", SMEM),       # primes, H != W
    ((1, 1, 11, 7), 3, 3, 1, "float32", 0),
    ((1, 1, 13, 5), 5, 2, 2, "float32", SMEM),
    ((1, 1, 5, 13), 3, 2, 3, "float16", SMEM),
    ((1, 1, 1, 67), 3, 3, 1, "float32", SMEM),       # narrow and wide
    ((1, 1, 1, 67), 5, 2, 2, "float32", 0),
    ((1, 1, 67, 1), 3, 2, 1, "float16", SMEM),
]


def sim_case_id(case):
    (b, c, h, w), k, levels, stride, storage, shared = case
    path = "smem" if shared else "scratch"
    return f"{b}x{c}x{h}x{w}-K{k}-L{levels}-s{stride}-{storage}-{path}"


@needs_simulator
@pytest.mark.parametrize("shape,k,levels,stride,storage,shared_limit", SIM_CASES,
                         ids=map(sim_case_id, SIM_CASES))
def test_simulated_kernels_on_edge_shapes(rng, shape, k, levels, stride, storage,
                                          shared_limit):
    dtype = STORAGE[storage]
    x = rng.standard_normal(shape).astype(dtype)
    w = cast_weights(random_weights(rng, shape[1], k, levels), dtype)
    dy = rng.standard_normal(out_shape(shape, stride)).astype(dtype)
    # Two planes per block at most: the spare groups of the default eight only slow the
    # simulator down (they recompute the last plane and store nothing).
    check_sim_against_oracle(x, w, dy, levels, stride, TOL[storage], shared_limit=shared_limit,
                             tuning=Tuning(planes_per_block=2))


@needs_simulator
def test_simulated_kernels_default_grouping_on_one_by_one_planes(rng):
    """Default launch shape: eight 1 x 1 planes per block, with spare groups in the last."""
    shape, k, levels = (3, 3, 1, 1), 3, 2
    x = rng.standard_normal(shape).astype(np.float32)
    w = cast_weights(random_weights(rng, 3, k, levels), np.float32)
    y = sim_forward(x, w, levels, 1)
    assert_close("y", y, reference.forward(x, w, levels, 1), TOL["float32"])
