"""bfloat16 storage (raw ``uint16`` bits) in numba's CUDA simulator.

The kernels hold bfloat16 as its bits and convert with integer arithmetic, so
the simulator runs that code as it is compiled for the GPU. Here: the two
store emitters' rounding against an independent round-to-nearest-even over
special and random bit patterns, and a layer's forward and backward on the
plane, register and tiled kernels (and a split pass) against the float64 oracle.
"""

import os

import numpy as np
import pytest

from wtconv_cuda import reference
from wtconv_cuda.kernels.codegen import _Emitter, _store, build
from wtconv_cuda.kernels.launch import Tuning, Weights, run_backward, run_forward
from wtconv_cuda.kernels.registers import _store_rounded

from ._backends import RecordingBackend
from ._oracle import backward_errors, from_bits, random_layer, to_bits

pytestmark = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                                reason="needs numba's CUDA simulator")

QUIET_NAN = 0x7FC0


def nearest_even(value: np.float32) -> int:
    """bfloat16 bits nearest to a finite or infinite float32, ties to even, by comparing
    the two neighbours' values in float64 (2**128 stands in past the largest finite)."""
    bits = int(np.float32(value).view(np.uint32))
    sign, magnitude = bits & 0x80000000, bits & 0x7FFFFFFF
    if magnitude >= 0x7F800000:  # infinity
        return (sign >> 16) | 0x7F80
    low = magnitude >> 16

    def size(b):
        return 2.0 ** 128 if b == 0x7F80 else float(from_bits(np.uint16(b)))

    exact = abs(float(value))
    below, above = exact - size(low), size(low + 1) - exact
    pick = low if below < above else low + 1 if above < below else low + (low & 1)
    return (sign >> 16) | pick


def rounding_kernel():
    """A kernel storing ``src`` into ``plain`` with ``codegen._store`` and into
    ``branchless`` with the register kernel's ``_store_rounded``."""
    from wtconv_cuda.kernels._numba_compat import cuda
    e = _Emitter()
    e("def wtconv_round(src, plain, branchless, n):")
    with e.indent():
        e("i = cuda.grid(1)", "if i < n:")
        with e.indent():
            _store(e, "bfloat16", "plain[i]", "src[i]")
            _store_rounded(e, "bfloat16", "branchless[i]", "src[i]", "t")
    return cuda.jit(build(e.text(), "wtconv_round"))


def test_store_rounds_to_nearest_even():
    specials = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF,
                0x7F7F7FFF, 0x7F7F8000, 0x00000001, 0x00008000, 0x00018000, 0x00800000,
                0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0xBF808000, 0xBF818000,
                0x7F800001, 0xFFC00000, 0x7FFFFFFF, 0x7FC00001]
    rng = np.random.default_rng(7)
    patterns = np.concatenate([np.array(specials, np.uint32),
                               rng.integers(0, 1 << 32, 3000, dtype=np.uint32)])
    values = patterns.view(np.float32)
    plain = np.full(values.shape, 0xDEAD, np.uint16)
    branchless = plain.copy()
    rounding_kernel()[(values.size + 127) // 128, 128](values, plain, branchless, values.size)
    want = np.array([QUIET_NAN if np.isnan(v) else nearest_even(v) for v in values], np.uint16)
    for got in (plain, branchless):
        wrong = np.flatnonzero(got != want)
        assert wrong.size == 0, [(hex(patterns[i]), hex(got[i]), hex(want[i])) for i in wrong[:5]]


@pytest.mark.parametrize("shape,levels,tuning,kernel", [
    ((2, 2, 9, 7), 2, Tuning(registers=False), "PlaneSpec"),
    ((2, 2, 9, 7), 2, Tuning(), "RegisterSpec"),  # the register kernel's forward
    ((1, 2, 21, 19), 2, Tuning(tiles=True, tile=8, threads=32, strip=2), "TileSpec"),
    ((1, 2, 21, 19), 3, Tuning(split=1, tile=8, threads=32, strip=2), "CoarseSpec"),
], ids=["plane", "registers", "tiles", "split"])
def test_bfloat16_layer_matches_oracle(rng, shape, levels, tuning, kernel):
    """Forward and backward in bfloat16 on the kernel named (among others), against the
    oracle on the same bfloat16 inputs."""
    k = 3
    x32, wts32, _, problem = random_layer(rng, shape, levels, k, 1, "float32", True)
    problem = problem._replace(storage="bfloat16")
    x = to_bits(x32)
    wts = wts32._replace(**{name: to_bits(a) for name, a in wts32._asdict().items()})
    weights = Weights(wts.base_weight, wts.base_bias, wts.base_scale, wts.wavelet_weight,
                      wts.wavelet_scale)
    dy = to_bits(rng.standard_normal(shape))
    backend = RecordingBackend()
    y = np.full(shape, 0xFFFF, np.uint16)  # NaN bits: an unwritten element shows
    run_forward(backend, problem, x, y, weights, tuning)
    dx = np.full(shape, 0xFFFF, np.uint16)
    grads = Weights(*(np.full(a.shape, 0xFFFF, np.uint16) for a in weights))
    run_backward(backend, problem, x, dy, dx, weights, grads, tuning)
    assert kernel in {type(spec).__name__ for spec in backend.kernels}

    exact = wts._replace(**{name: from_bits(a) for name, a in wts._asdict().items()})
    y_ref = reference.forward(from_bits(x), exact, levels, 1)
    y = from_bits(y)
    assert np.isfinite(y).all()
    # one bfloat16 rounding of each output (2**-9 relative) on float32 arithmetic
    assert np.linalg.norm(y - y_ref) / np.linalg.norm(y_ref) < 4e-3
    errors = backward_errors(from_bits(x), exact, from_bits(dy), levels, 1, from_bits(dx),
                             Weights(*(from_bits(g) for g in grads)), True)
    assert max(errors.values()) < 4e-3, errors
