"""Shared bank conflicts of the forward tiles' strip phases: the order of their item rows
(``tiles.strip_order``) and wider grid pitches (``TileSpec.pitches``, ``launch.bank_pitched``).

The bank model and the planner's choices run anywhere; the kernels run in numba's
CUDA simulator against the float64 oracle and bit for bit against the natural
order and pitches (both move work between threads and values in shared memory,
never the order of a sum).
"""

import os

import numpy as np
import pytest

from wtconv_cuda import reference
from wtconv_cuda.kernels import launch
from wtconv_cuda.kernels.launch import (
    Problem, Tuning, bank_pitched, blocks_by_shared, plan_split, plan_tiles, run_forward,
)
from wtconv_cuda.kernels import compiler, tiles
from wtconv_cuda.kernels.tiles import (
    StripOrder, TileSpec, bank_pitch, grid_readers, phase_stride, phase_wavefronts,
    spec_geometry, strip_order, strip_wavefronts, tile_geometry, tile_kernel_source,
)

from ._backends import RecordingBackend
from ._oracle import random_layer

LIMIT = 227 * 1024 - 1024
simulator = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                               reason="needs numba's CUDA simulator")


@pytest.mark.parametrize("n,rows,pitch,threads,stride,want", [
    (16, 4, 24, 64, 1, 2.0),    # 28 x 28 stage, grid 0: two strip rows 96 words apart
    (16, 4, 24, 64, 2, 2.0),    # ... any two of them (4 * 24 = 0 modulo 32)
    (16, 4, 26, 64, 2, 1.0),    # 26 words: strip rows two apart are 208 = 16 + 6 * 32 apart
    (8, 1, 12, 64, 1, 2.0),     # four 8-item rows per warp
    (8, 1, 12, 64, 2, 1.0),     # ... 0, 24, 48 and 72 words: banks 0, 24, 16 and 8 on
    (14, 2, 18, 128, 1, 1.75),  # 56 x 56 level 2: rows of 14 items padded to 16
    (14, 2, 18, 128, 4, 1.0),
    (28, 7, 36, 128, 1, 1.0),   # one row of 28 items per warp
    (8, 8, 12, 32, 1, 1.0),     # one item row: nothing to conflict with
])
def test_strip_wavefronts(n, rows, pitch, threads, stride, want):
    assert strip_wavefronts(n, rows, pitch, threads, stride) == pytest.approx(want)


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
        assert phase_wavefronts(n, rows, pitch, threads) <= strip_wavefronts(
            n, rows, pitch, threads)


def test_bank_pitch_is_the_narrowest_conflict_free_pitch():
    assert bank_pitch(48, ((16, 4), (16, 4)), 64) == 26  # with strip rows two apart
    assert bank_pitch(24, ((8, 1),), 64) == 12           # the strip order alone clears it
    assert bank_pitch(36, ((14, 2),), 128) == 18
    assert bank_pitch(72, ((28, 7), (28, 4)), 128) == 36  # already free: natural


def test_grid_readers_of_the_28_stage_tile():
    spec = TileSpec(5, "float32", 2, 32, 64, 4, 128, coarse=True)
    assert grid_readers(spec) == (((16, 4), (16, 4)), ((8, 1),))


def test_geometry_with_wider_pitches():
    plain = tile_geometry(5, 2, 32, False, 64)
    wide = tile_geometry(5, 2, 32, False, 64, pitches=(28, 24))
    assert plain.pitches == (24, 12) and wide.pitches == (28, 24)
    assert [wide.pitch(i) for i in range(2)] == [28, 24]
    assert [wide.phase(i) for i in range(2)] == [phase_stride(48, 28), phase_stride(24, 24)]
    assert all(wide.phase(i) % 32 == 16 and wide.phase(i) >= 12 * wide.pitch(i) * (2 - i)
               for i in range(2))
    assert wide.floats == plain.floats + 4 * (wide.phase(0) - plain.phase(0)
                                              + wide.phase(1) - plain.phase(1))
    inner = tile_geometry(5, 2, 56, False, 128, 3, pitches=(36, 23))
    assert inner.inner.grids[0] == inner.z[-1] + 4 * 14 * 14  # first inner grid: new space
    for bad, kwargs in [((23, 12), {}), ((28,), {}), ((28, 24), {"backward": True})]:
        with pytest.raises(ValueError, match="pitches"):
            tile_geometry(5, 2, 32, pitches=bad, **kwargs)
    with pytest.raises(ValueError, match="pitches"):
        tile_kernel_source(TileSpec(5, "float32", 2, 32, 64, 4, pitches=(20, 12)))


def test_planner_widens_the_28_stage_tile():
    """28 x 28: grid 0 widens from 24 to 26 words (12 blocks per multiprocessor either
    way); grid 1 needs only its strip order."""
    stage28 = Problem(64, 192, 28, 28, 5, 4, 1, "float32", True)
    plan = plan_split(stage28, LIMIT)
    assert plan.tiles.spec.pitches == (26, 12)
    assert plan.tiles.shared_bytes == 4 * spec_geometry(plan.tiles.spec).floats
    assert blocks_by_shared(plan.tiles.shared_bytes, LIMIT) == 12
    assert plan_split(stage28, LIMIT, Tuning(bank_pitch=False)).tiles.spec.pitches == ()
    stage56 = Problem(64, 96, 56, 56, 5, 5, 1, "float32", True)
    assert plan_tiles(stage56, LIMIT, Tuning(bank_pitch=True)).spec.pitches == ()


def test_planner_keeps_the_blocks_per_multiprocessor(monkeypatch):
    """A pitch that would cost the 56 x 56 stage's tile a block (five to four) is taken
    only with bank_pitch=True; never by a backward."""
    monkeypatch.setattr(launch, "bank_pitch", lambda edge, readers, threads: edge // 2 + 8)
    stage56 = Problem(64, 96, 56, 56, 5, 5, 1, "float32", True)
    plain = plan_tiles.__wrapped__(stage56, LIMIT)
    assert plain.spec.inner_levels == 3 and plain.spec.pitches == ()
    forced = plan_tiles.__wrapped__(stage56, LIMIT, Tuning(bank_pitch=True))
    assert forced.spec.pitches == (44, 26)
    assert forced.shared_bytes == 4 * spec_geometry(forced.spec).floats
    assert blocks_by_shared(forced.shared_bytes, LIMIT) == 4 < blocks_by_shared(
        plain.shared_bytes, LIMIT) == 5
    backward = plan_tiles.__wrapped__(Problem(8, 64, 512, 512, 5, 3, 1, "float32", True),
                                      LIMIT, Tuning(bank_pitch=True), backward=True)
    assert backward.spec.backward and backward.spec.pitches == ()
    spec = TileSpec(5, "float32", 2, 32, 64, 4, backward=True)
    assert bank_pitched(spec, LIMIT, Tuning(bank_pitch=True)) is spec


#: (shape, levels, k, storage, bias, tuning): whole tiles on a plane of several tiles,
#: and a split with coarse values (float16, no bias).
WIDE_CASES = [
    ((1, 2, 19, 21), 2, 3, "float32", True, Tuning(tiles=True, tile=8, threads=32, strip=2)),
    ((1, 1, 20, 18), 4, 5, "float16", False,
     Tuning(split=2, tile=8, threads=32, strip=2, inner=False)),
]


def _widen(edge, readers, threads):
    return edge // 2 + 3


@simulator
@pytest.mark.parametrize("shape,levels,k,storage,bias,tuning", WIDE_CASES)
def test_wider_pitches_give_the_same_bits(rng, monkeypatch, shape, levels, k, storage, bias,
                                          tuning):
    """Every grid widened by an odd number of words: the oracle's output, and bit for bit
    the output with the natural pitches."""
    x, wts, weights, problem = random_layer(rng, shape, levels, k, 1, storage, bias)
    backend = RecordingBackend()
    outputs = []
    for wide in (False, True):
        if wide:
            monkeypatch.setattr(launch, "bank_pitch", _widen)
        y = np.full(shape, np.nan, np.dtype(storage))
        backend.kernels.clear()
        run_forward(backend, problem, x, y, weights, tuning._replace(bank_pitch=wide))
        tiles = [s for s in backend.kernels if isinstance(s, TileSpec)]
        assert len(tiles) == 1 and bool(tiles[0].pitches) == wide, backend.kernels
        outputs.append(y)
    _check(outputs, x, wts, levels, storage)


@simulator
def test_wider_pitches_in_a_tile_with_inner_levels(rng):
    """The 13 x 11 plane on one 16 tile, levels 3 and 4 inside the block (grid 1 feeds
    the inner levels' first blocks): widened grids give the natural pitches' bits."""
    shape, levels, k = (1, 2, 13, 11), 4, 3
    x, wts, weights, problem = random_layer(rng, shape, levels, k, 1, "float32", True)
    backend = RecordingBackend()
    fine = plan_split(problem, backend.shared_limit,
                      Tuning(split=2, tile=16, threads=32, strip=2, bank_pitch=False)).tiles
    spec = fine.spec._replace(coarse=False, inner_levels=levels - 2)
    outputs = []
    for pitches in ((), tuple(_widen(n, (), 32) for n in spec_geometry(spec).edges)):
        variant = spec._replace(pitches=pitches)
        y = np.full(shape, np.nan, np.float32)
        backend.call(backend.kernel(variant), fine.grid, fine.block,
                     (x, y, *weights, 13, 11, 2, 1, 1, 1), 4 * spec_geometry(variant).floats)
        outputs.append(y)
    _check(outputs, x, wts, levels, "float32")


def _check(outputs, x, wts, levels, storage):
    natural, wide = outputs
    want = reference.forward(x, wts, levels, 1)
    tol = {"float32": 2e-6, "float16": 2e-3}[storage]
    assert np.isfinite(wide).all()
    assert np.linalg.norm(wide - want) / np.linalg.norm(want) < tol
    np.testing.assert_array_equal(wide, natural)


@simulator
def test_strip_order_gives_the_same_bits(rng, monkeypatch):
    """A 24-pixel tile on 64 threads, whose strip phases deal their item rows two strip
    rows apart (with the natural pitches, the output phase's 6 strip rows take 8 item
    rows: two idle): the oracle's output, and bit for bit the natural order's."""
    shape, levels, k = (1, 2, 30, 37), 2, 3
    x, wts, weights, problem = random_layer(rng, shape, levels, k, 1, "float32", True)
    backend = RecordingBackend()
    outputs = []
    for ordered in (True, False):
        if not ordered:  # every phase in the natural order, compiled afresh
            monkeypatch.setattr(tiles, "strip_order",
                                lambda n, rows, pitch, threads: tiles._strip_order(n, rows, 1))
            monkeypatch.setattr(compiler, "_loaded", {})
        tuning = Tuning(tiles=True, tile=24, threads=64, strip=2, bank_pitch=False)
        spec = plan_tiles.__wrapped__(problem, backend.shared_limit, tuning).spec
        source = tile_kernel_source(spec)
        assert ("strip rows apart" in source and "qy0 >= 12" in source) == ordered
        y = np.full(shape, np.nan, np.float32)
        run_forward(backend, problem, x, y, weights, tuning)
        outputs.append(y)
    _check(outputs[::-1], x, wts, levels, "float32")
