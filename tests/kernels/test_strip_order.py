"""Shared bank conflicts of the forward tiles' strip phases: the order of their item rows
(``tiles.strip_order``); and of the inner levels' convolutions: their planes' stride
(``tiles.inner_plane_stride``).

The bank model and the orders run anywhere; the kernels run in numba's CUDA
simulator against the float64 oracle and bit for bit against the natural order
(the order moves items between threads, never the order of a sum).
"""

import os

import numpy as np
import pytest

from wtconv_cuda import reference
from wtconv_cuda.kernels import compiler, tiles
from wtconv_cuda.kernels.launch import Tuning, Weights, plan_tiles, run_backward, run_forward
from wtconv_cuda.kernels.tiles import (
    StripOrder, TileSpec, inner_conv_wavefronts, inner_plane_stride, strip_order,
    strip_wavefronts, tile_geometry, tile_kernel_source,
)

from ._backends import RecordingBackend
from ._oracle import backward_errors, random_layer

simulator = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                               reason="needs numba's CUDA simulator")


@pytest.mark.parametrize("n,rows,pitch,stride,want", [
    (16, 4, 24, 1, 2.0),    # 28 x 28 stage, grid 0: two strip rows 96 words apart
    (16, 4, 24, 2, 2.0),    # ... any two of them (4 * 24 = 0 modulo 32)
    (16, 4, 26, 2, 1.0),    # a 26-word pitch: strip rows two apart 208 = 16 + 6 * 32
    (8, 1, 12, 1, 2.0),     # four 8-item rows per warp
    (8, 1, 12, 2, 1.0),     # ... 0, 24, 48 and 72 words: banks 0, 24, 16 and 8 on
    (14, 2, 18, 1, 1.75),   # 56 x 56 level 2: rows of 14 items padded to 16
    (14, 2, 18, 4, 1.0),
    (28, 7, 36, 1, 1.0),    # one row of 28 items per warp
    (8, 8, 12, 1, 1.0),     # one item row: nothing to conflict with
])
def test_strip_wavefronts(n, rows, pitch, stride, want):
    assert strip_wavefronts(n, rows, pitch, stride) == pytest.approx(want)


def test_strip_order():
    """The smallest stride that clears the conflicts without another round; every strip
    row once, idle item rows only past the last."""
    order = strip_order(14, 2, 18, 128)
    assert order == StripOrder(16, 2, 4, 8)
    assert [order.strip_row(s) for s in range(8)] == [0, 4, 1, 5, 2, 6, 3, 7]
    assert strip_order(8, 1, 12, 64) == StripOrder(8, 4, 2, 8)
    assert strip_order(16, 4, 24, 64).stride == 1  # nothing helps: the natural order
    assert strip_order(32, 8, 40, 128) == StripOrder(32, 1, 1, 4)
    assert strip_order(14, 2, 18, 128).slots * 16 <= 128  # still one round
    for n, rows, pitch, threads in [(14, 2, 18, 128), (8, 1, 12, 64), (12, 2, 16, 64),
                                    (30, 2, 33, 96), (6, 1, 8, 32)]:
        order = strip_order(n, rows, pitch, threads)
        taken = sorted(order.strip_row(s) for s in range(order.slots))
        assert taken[:n // rows] == list(range(n // rows))
        assert all(r >= n // rows for r in taken[n // rows:])
        assert strip_wavefronts(n, rows, pitch, order.stride) <= strip_wavefronts(n, rows, pitch)


@simulator
def test_strip_order_gives_the_same_bits(rng, monkeypatch):
    """A 24-pixel tile on 64 threads whose output phase deals its item rows two strip
    rows apart (6 strip rows in 8 item rows: two idle): the oracle's output, and bit for
    bit the natural order's."""
    shape, levels, k = (1, 2, 30, 37), 2, 3
    x, wts, weights, problem = random_layer(rng, shape, levels, k, 1, "float32", True)
    backend = RecordingBackend()
    outputs = []
    for ordered in (True, False):
        if not ordered:  # every phase in the natural order, compiled afresh
            monkeypatch.setattr(tiles, "strip_order",
                                lambda n, rows, pitch, threads: tiles._strip_order(n, rows, 1))
            monkeypatch.setattr(compiler, "_loaded", {})
        tuning = Tuning(tiles=True, tile=24, threads=64, strip=2)
        spec = plan_tiles(problem, backend.shared_limit, tuning).spec
        source = tile_kernel_source(spec)
        assert ("strip rows apart" in source and "qy0 >= 12" in source) == ordered
        y = np.full(shape, np.nan, np.float32)
        run_forward(backend, problem, x, y, weights, tuning)
        outputs.append(y)
    ordered, natural = outputs
    want = reference.forward(x, wts, levels, 1)
    assert np.isfinite(ordered).all()
    assert np.linalg.norm(ordered - want) / np.linalg.norm(want) < 2e-6
    np.testing.assert_array_equal(ordered, natural)


@simulator
@pytest.mark.parametrize("backward", [False, True])
def test_strided_order_past_its_first_block(rng, backward):
    """A 32-pixel tile on 32 threads whose strip phases deal 8 or 16 item rows in blocks
    of 4 or 8: rows past the first block are placed from that block's start. (That
    start once read ``slot - (slot) & 3``, which is ``(slot - slot) & 3 = 0``: phases
    computed some strip rows twice and others never; the 24-pixel tile above, one block
    plus idle rows, could not see it. An H200 benchmark did: dx of 8 x 32 x 128 x 128,
    L 3, off by 0.43.)"""
    shape, levels, k = (1, 1, 37, 35), 2, 3
    x, wts, weights, problem = random_layer(rng, shape, levels, k, 1, "float32", True)
    tuning = Tuning(tiles=True, tile=32, threads=32, strip=2)
    spec = plan_tiles(problem, RecordingBackend().shared_limit, tuning, backward).spec
    source = tile_kernel_source(spec)
    assert "first = slot - ((slot) & 3)" in source
    assert "for it in range(tid, 128, 32):" in source  # 8 item rows of 16: two blocks
    backend = RecordingBackend()
    if not backward:
        y = np.full(shape, np.nan, np.float32)
        run_forward(backend, problem, x, y, weights, tuning)
        want = reference.forward(x, wts, levels, 1)
        assert np.isfinite(y).all()
        assert np.linalg.norm(y - want) / np.linalg.norm(want) < 2e-6
        return
    dy = rng.standard_normal(shape).astype(np.float32)
    dx = np.full(shape, np.nan, np.float32)
    grads = Weights(*(np.full(a.shape, np.nan, np.float32) for a in weights))
    run_backward(backend, problem, x, dy, dx, weights, grads, tuning)
    errors = backward_errors(x, wts, dy, levels, 1, dx, grads, True)
    assert all(e < 2e-6 for e in errors.values()), errors


@pytest.mark.parametrize("size,blocks,stride,want", [
    (4, 8, 64, 2.0),       # 14 x 14 level 2: a warp reads two planes 64 words apart
    (4, 8, 68, 1.0),       # ... 68 = 4 modulo 32 puts the second on the banks left free
    (2, 6, 36, 1.0),       # four 2 x 2 subbands in one warp, 36 = 4 modulo 32
    (7, 11, 121, 13 / 7),  # 56 x 56 level 3: rows of 7 at pitch 11 wrap onto themselves
    (1, 5, 25, 1.0),       # one coefficient per subband: four words, four banks
])
def test_inner_conv_wavefronts(size, blocks, stride, want):
    assert inner_conv_wavefronts(size, blocks, stride) == pytest.approx(want)


def test_inner_plane_stride():
    """The smallest stride with the fewest conflicts, never more conflicts than packed planes."""
    assert inner_plane_stride(4, 8) == 68
    assert inner_plane_stride(2, 6) == 36 and inner_plane_stride(7, 11) == 121
    for size in range(1, 15):
        for blocks in (size + 2, size + 4, size + 6):
            stride = inner_plane_stride(size, blocks)
            assert blocks ** 2 <= stride < blocks ** 2 + 32
            best = inner_conv_wavefronts(size, blocks, stride)
            assert best <= inner_conv_wavefronts(size, blocks, blocks ** 2)
            assert all(inner_conv_wavefronts(size, blocks, s) > best
                       for s in range(blocks ** 2, stride))


def test_inner_levels_read_their_planes_as_modelled():
    """The 14 x 14 stage's tile (split at level 1, two inner levels): the geometry takes
    the modelled strides, and the convolution's items take the coefficient fastest."""
    spec = TileSpec(5, "float32", 1, 16, 32, 2, 128, inner_levels=2, height=14, width=14)
    inner = tile_geometry(5, 1, 16, False, 32, 2).inner
    assert inner.strides == (68, 36)
    source = tile_kernel_source(spec)
    for m, n, grid, stride in zip(inner.sizes[1:], inner.blocks, inner.grids, inner.strides):
        assert f"k = ((it) >> {(m * m).bit_length() - 1})" in source
        assert f"q = it - k * {m * m}" in source
        assert f"base = {grid} + k * {stride} + qy * {n} + q" in source
        assert f"S[{grid + 3 * stride} + it] = u3" in source
