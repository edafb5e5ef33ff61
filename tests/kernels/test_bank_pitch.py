"""Wider grid pitches of the forward tiles (``TileSpec.pitches``, ``launch.bank_pitched``).

The bank model and the planner's choices run anywhere; the kernels with widened
pitches run in numba's CUDA simulator against the float64 oracle and bit for bit
against the natural pitches (a pitch moves values in shared memory, never the
order of a sum).
"""

import os

import numpy as np
import pytest

from wtconv_cuda import reference
from wtconv_cuda.kernels import launch
from wtconv_cuda.kernels.launch import (
    Problem, Tuning, bank_pitched, blocks_by_shared, plan_split, plan_tiles, run_forward,
)
from wtconv_cuda.kernels.tiles import (
    TileSpec, bank_pitch, grid_readers, phase_stride, spec_geometry, strip_wavefronts,
    tile_geometry, tile_kernel_source,
)

from ._backends import RecordingBackend
from ._oracle import random_layer

LIMIT = 227 * 1024 - 1024
simulator = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                               reason="needs numba's CUDA simulator")


@pytest.mark.parametrize("n,rows,pitch,threads,want", [
    (16, 4, 24, 64, 2.0),    # 28 x 28 stage, grid 0: two strip rows 96 words apart
    (16, 4, 28, 64, 1.0),    # ... 112 words apart: the other half of the banks
    (8, 1, 12, 64, 2.0),     # four 8-item rows per warp
    (8, 1, 24, 64, 1.0),
    (14, 2, 18, 128, 1.75),  # 56 x 56 level 2: rows of 14 items padded to 16
    (14, 2, 23, 128, 1.0),
    (28, 7, 36, 128, 1.0),   # one row of 28 items per warp
    (8, 8, 12, 32, 1.0),     # one item row: nothing to conflict with
])
def test_strip_wavefronts(n, rows, pitch, threads, want):
    assert strip_wavefronts(n, rows, pitch, threads) == pytest.approx(want)


def test_bank_pitch_is_the_narrowest_conflict_free_pitch():
    assert bank_pitch(48, ((16, 4), (16, 4)), 64) == 28
    assert bank_pitch(24, ((8, 1),), 64) == 24
    assert bank_pitch(36, ((14, 2),), 128) == 23
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


def test_planner_widens_the_28_stage_tile_and_keeps_the_56_stage_blocks():
    """28 x 28: both grids widen (ten blocks per multiprocessor either way, by the
    registers); 56 x 56: grid 1's wider pitch would drop a block (five to four), so only
    bank_pitch=True takes it."""
    stage28 = Problem(64, 192, 28, 28, 5, 4, 1, "float32", True)
    plan = plan_split(stage28, LIMIT)
    assert plan.tiles.spec.pitches == (28, 24)
    assert plan.tiles.shared_bytes == 4 * spec_geometry(plan.tiles.spec).floats
    assert blocks_by_shared(plan.tiles.shared_bytes, LIMIT) == 10
    assert plan_split(stage28, LIMIT, Tuning(bank_pitch=False)).tiles.spec.pitches == ()

    stage56 = Problem(64, 96, 56, 56, 5, 5, 1, "float32", True)
    inner = plan_tiles(stage56, LIMIT)
    assert inner.spec.inner_levels == 3 and inner.spec.pitches == ()
    forced = plan_tiles(stage56, LIMIT, Tuning(bank_pitch=True))
    assert forced.spec.pitches == (36, 23)
    assert forced.shared_bytes == 4 * spec_geometry(forced.spec).floats
    assert blocks_by_shared(forced.shared_bytes, LIMIT) == 4 < blocks_by_shared(
        inner.shared_bytes, LIMIT)

    backward = plan_tiles(Problem(8, 64, 512, 512, 5, 3, 1, "float32", True), LIMIT,
                          Tuning(bank_pitch=True), backward=True)
    assert backward.spec.pitches == ()
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
