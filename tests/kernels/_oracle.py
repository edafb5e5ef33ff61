"""Comparison of the kernels' outputs with the float64 oracle, shared by the simulator tests."""

import numpy as np

from wtconv_cuda import reference
from wtconv_cuda.kernels.launch import Problem, Weights, run_forward
from wtconv_cuda.kernels.tiles import TileSpec

from ..conftest import random_weights
from ._backends import RecordingBackend


def random_layer(rng, shape, levels, k, stride, storage, bias):
    """Random ``x`` and parameters of ``storage``: ``(x, wts, weights, problem)``.

    ``wts`` is the oracle's :class:`~wtconv_cuda.WTConvWeights`, ``weights`` the
    kernels' :class:`~wtconv_cuda.kernels.launch.Weights` of the same arrays (the
    scale stands in for a missing bias).
    """
    dtype = np.dtype(storage)
    b, c, h, w = shape
    x = rng.standard_normal(shape).astype(dtype)
    wts = random_weights(rng, c, k, levels, bias=bias, dtype=dtype)
    weights = Weights(wts.base_weight, wts.base_bias if bias else wts.base_scale,
                      wts.base_scale, wts.wavelet_weight, wts.wavelet_scale)
    return x, wts, weights, Problem(b, c, h, w, k, levels, stride, storage, bias)


def forwards_agree(rng, shape, levels, k, storage, tunings) -> list:
    """Run the forward of one random stride-1 layer with bias once per tuning (simulator,
    outputs poisoned with NaN); the first output must be finite and near the float64
    oracle, every other one the same bits.

    Returns
    -------
    list of list of TileSpec
        The tile specs each run compiled, in order.
    """
    x, wts, weights, problem = random_layer(rng, shape, levels, k, 1, storage, True)
    outputs, tiles = [], []
    for tuning in tunings:
        backend = RecordingBackend()
        y = np.full(shape, np.nan, x.dtype)
        run_forward(backend, problem, x, y, weights, tuning)
        tiles.append([spec for spec in backend.kernels if isinstance(spec, TileSpec)])
        outputs.append(y)
    want = reference.forward(x.astype(np.float64), wts, levels, 1)
    assert np.isfinite(outputs[0]).all()
    tol = 2e-6 if storage == "float32" else 2e-3
    assert np.linalg.norm(outputs[0].astype(np.float64) - want) / np.linalg.norm(want) < tol
    for y in outputs[1:]:
        np.testing.assert_array_equal(y.view(np.uint8), outputs[0].view(np.uint8))
    return tiles


def backward_errors(x, wts, dy, levels, stride, dx, grads, bias) -> dict:
    """Relative errors of ``dx`` and every written gradient against the oracle.

    Fails on an unwritten (NaN) element.
    """
    dx_ref, dw_ref = reference.backward(x, wts, dy, levels, stride)
    pairs = {"dx": (dx, dx_ref), "base_weight": (grads.base_weight, dw_ref.base_weight),
             "base_scale": (grads.base_scale, dw_ref.base_scale)}
    if bias:
        pairs["base_bias"] = (grads.base_bias, dw_ref.base_bias)
    if levels:
        pairs["wavelet_weight"] = (grads.wavelet_weight, dw_ref.wavelet_weight)
        pairs["wavelet_scale"] = (grads.wavelet_scale, dw_ref.wavelet_scale)
    errors = {}
    for name, (got, want) in pairs.items():
        got = got.astype(np.float64)
        assert np.isfinite(got).all(), f"{name}: unwritten (NaN) elements"
        errors[name] = np.linalg.norm(got - want) / np.linalg.norm(want)
    return errors


def to_bits(values) -> np.ndarray:
    """float32 values as bfloat16 bits, truncated (inputs need not be rounded)."""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def from_bits(bits) -> np.ndarray:
    """bfloat16 bits as float32 (exact)."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)
