"""Helpers of the reliability suite: simulator launches and oracle footprints.

The simulator helpers follow the pattern of ``tests/kernels/test_simulator.py``
(own copy, no cross-package import): the generated kernels run in numba's CUDA
simulator through the real launch planner, with every output poisoned with
NaN before the launch.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from wtconv_cuda import WTConvWeights, reference
from wtconv_cuda.kernels.launch import (
    Problem, SimulatorBackend, Tuning, Weights, run_backward, run_forward,
)

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
needs_simulator = pytest.mark.skipif(not SIMULATOR, reason="needs numba's CUDA simulator")

#: Shared memory of an H200 block (the planner's limit); 0 forces global scratch.
SMEM = 227 * 1024
#: storage -> host dtype
STORAGE = {"float32": np.float32, "float16": np.float16}
#: storage -> bound on max|got - want| / max|want| against the float64 oracle
#: evaluated on the same (rounded) inputs. float32: accumulation only;
#: float16: one rounding of the float32 result on store (2^-11 relative).
TOL = {"float32": 2e-5, "float16": 2e-3}


def out_shape(shape, stride):
    b, c, h, w = shape
    return (b, c, -(-h // stride), -(-w // stride))


def cast_weights(w: WTConvWeights, dtype) -> WTConvWeights:
    return WTConvWeights(*(None if a is None else np.ascontiguousarray(a, dtype=dtype)
                           for a in w))


def _kernel_weights(w: WTConvWeights) -> Weights:
    bias = w.base_scale if w.base_bias is None else w.base_bias
    return Weights(w.base_weight, bias, w.base_scale, w.wavelet_weight, w.wavelet_scale)


def _backend(shared_limit, max_slots):
    return SimulatorBackend(shared_limit=shared_limit, max_slots=max_slots)


def _problem(x, w, levels, stride):
    b, c, h, width = x.shape
    return Problem(b, c, h, width, w.kernel_size, levels, stride, x.dtype.name,
                   w.base_bias is not None)


def sim_forward(x, w, levels, stride, shared_limit=SMEM, max_slots=2, tuning=Tuning()):
    """Forward in the simulator; ``x`` and ``w`` already in the storage dtype."""
    assert x.dtype.name in STORAGE and x.flags.c_contiguous
    y = np.full(out_shape(x.shape, stride), np.nan, x.dtype)
    run_forward(_backend(shared_limit, max_slots), _problem(x, w, levels, stride), x, y,
                _kernel_weights(w), tuning)
    return y


def sim_backward(x, w, dy, levels, stride, shared_limit=SMEM, max_slots=2, tuning=Tuning()):
    """Backward in the simulator: ``(dx, dw)`` with ``dw.base_bias`` None without bias."""
    assert x.dtype == dy.dtype and dy.flags.c_contiguous
    dx = np.full(x.shape, np.nan, x.dtype)
    grads = Weights(*(np.full(a.shape, np.nan, x.dtype) for a in _kernel_weights(w)))
    run_backward(_backend(shared_limit, max_slots), _problem(x, w, levels, stride), x, dy, dx,
                 _kernel_weights(w), grads, tuning)
    bias = None if w.base_bias is None else grads.base_bias
    return dx, WTConvWeights(grads.base_weight, bias, grads.base_scale, grads.wavelet_weight,
                             grads.wavelet_scale)


def max_rel_err(got, want) -> float:
    """``max|got - want| / max|want|`` (``want``'s scale 1 when it is all zeros)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if want.size == 0:
        return 0.0
    scale = float(np.max(np.abs(want)))
    return float(np.max(np.abs(got - want))) / (scale if scale > 0 else 1.0)


def assert_close(name, got, want, tol):
    got = np.asarray(got, np.float64)
    assert got.shape == np.shape(want), f"{name}: shape {got.shape} != {np.shape(want)}"
    bad = np.argwhere(~np.isfinite(got))
    assert bad.size == 0, f"{name}: {len(bad)} non-finite (unwritten?) elements, first {bad[:4]}"
    err = max_rel_err(got, want)
    assert err <= tol, f"{name}: max relative error {err:.3g} > {tol:g}"


def check_sim_against_oracle(x, w, dy, levels, stride, tol, shared_limit=SMEM,
                             tuning=Tuning()):
    """Run forward and backward in the simulator; assert inputs unchanged and
    every output and gradient within ``tol`` of the oracle (``None`` for an
    absent bias on both sides)."""
    x0, dy0 = x.copy(), dy.copy()
    y = sim_forward(x, w, levels, stride, shared_limit=shared_limit, tuning=tuning)
    dx, dw = sim_backward(x, w, dy, levels, stride, shared_limit=shared_limit, tuning=tuning)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(dy, dy0)
    assert_close("y", y, reference.forward(x, w, levels, stride), tol)
    dx_ref, dw_ref = reference.backward(x, w, dy, levels, stride)
    assert_close("dx", dx, dx_ref, tol)
    for name, want in dw_ref._asdict().items():
        if want is None:
            assert getattr(dw, name) is None
        else:
            assert_close(name, getattr(dw, name), want, tol)


def nonfinite(a) -> np.ndarray:
    return ~np.isfinite(np.asarray(a, np.float64))


def assert_same_nonfinite(dw, dw_ref) -> None:
    """Every weight gradient of ``dw`` is non-finite exactly where ``dw_ref``'s is."""
    for name, want in dw_ref._asdict().items():
        if want is None:
            continue
        got_mask, want_mask = nonfinite(getattr(dw, name)), nonfinite(want)
        assert np.array_equal(got_mask, want_mask), (
            f"{name}: {describe_mask_diff(got_mask, want_mask)}")


def describe_mask_diff(got_mask, want_mask) -> str:
    extra = [tuple(int(i) for i in p) for p in np.argwhere(got_mask & ~want_mask)]
    missing = [tuple(int(i) for i in p) for p in np.argwhere(want_mask & ~got_mask)]
    return f"non-finite where the oracle is finite: {extra}; finite where the oracle is not: " \
           f"{missing}"


# ---------------------------------------------------------------------------
# Where one non-finite input pixel must show up (the operator's footprint)
# ---------------------------------------------------------------------------


def forward_footprint(h, w, k, levels, py, px):
    """Full-resolution outputs that depend on input pixel ``(py, px)``.

    Assumes every weight and scale is non-zero (then NaN or Inf in that pixel
    makes exactly these outputs non-finite). Base path: the ``K x K`` window
    around the pixel. Level ``j``: every output whose level-``j`` coefficient
    lies within ``R`` (Chebyshev) of the pixel's level-``j`` coefficient.
    The same set is the footprint of ``dx`` for an output-gradient pixel at
    full resolution (the adjoint has the same structure).
    """
    r = (k - 1) // 2
    oy, ox = np.arange(h)[:, None], np.arange(w)[None, :]
    mask = (np.abs(oy - py) <= r) & (np.abs(ox - px) <= r)
    for j in range(1, levels + 1):
        mask |= (np.abs((oy >> j) - (py >> j)) <= r) & (np.abs((ox >> j) - (px >> j)) <= r)
    return mask


def touching_taps(k, n):
    """Kernel offsets along one axis that touch at least one of ``n`` grid points."""
    r = (k - 1) // 2
    taps = np.zeros(k, bool)
    taps[max(0, r - n + 1):min(k, r + n)] = True
    return taps


def level_grids(h, w, levels):
    grids = [(h, w)]
    for _ in range(levels):
        h, w = -(-h // 2), -(-w // 2)
        grids.append((h, w))
    return grids
