"""A forward tile that covers its plane loads it as one contiguous run and stores it
with compile-time sizes (``TileSpec.height``/``width``, ``tiles._emit_plane_load``).

The planner runs anywhere; the kernels run in numba's CUDA simulator against
the float64 oracle and bit for bit against the row-pair load of the same tile
(the values land in the same places: no sum changes). The simulator zeroes a
block's dynamic shared memory, a GPU does not: here it starts as NaN (the
``nan_shared`` fixture of ``conftest.py``), so a halo element the load leaves
unwritten shows.
"""

import os

import numpy as np
import pytest

from wtconv_cuda import reference
from wtconv_cuda.kernels.launch import Problem, Tuning, plan_split, plan_tiles, run_forward
from wtconv_cuda.kernels.tiles import TileSpec, spec_geometry, tile_kernel_source

from ._backends import RecordingBackend
from ._oracle import random_layer

simulator = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                               reason="needs numba's CUDA simulator")
LIMIT = 227 * 1024 - 1024


def test_planner_sets_the_plane_of_one_tile_per_plane_forwards():
    """The ConvNeXt-T stages' forward tiles (one per plane) load their plane as one run;
    tiles that share a plane and the backward's do not."""
    stage56 = Problem(64, 96, 56, 56, 5, 5, 1, "float32", True)
    spec = plan_tiles(stage56, LIMIT).spec  # inner levels, a tile fitted to 56
    assert (spec.height, spec.width, spec.tile, spec.threads, spec.strip) == (56, 56, 56, 128, 7)
    for h, levels, tile, threads, strip in ((28, 4, 32, 32, 4), (14, 3, 16, 32, 2)):
        problem = Problem(64, 384 * 14 // h, h, h, 5, levels, 1, "float32", True)
        spec = plan_split(problem, LIMIT).tiles.spec
        assert (spec.height, spec.width, spec.tile, spec.threads, spec.strip) == (
            h, h, tile, threads, strip)
    paper = plan_tiles(Problem(8, 64, 256, 256, 5, 3, 1, "float32", True), LIMIT)
    assert paper.ntiles > 1 and paper.spec.height == paper.spec.width == 0
    backward = plan_tiles(Problem(2, 3, 13, 11, 3, 1, 1, "float32", True), LIMIT,
                          Tuning(tiles=True, tile=16), backward=True)
    assert backward.ntiles == 1 and backward.spec.height == 0


@pytest.mark.parametrize("spec", [
    TileSpec(3, "float32", 1, 16, 32, 2, height=17, width=9),       # larger than the tile
    TileSpec(3, "float32", 1, 16, 32, 2, height=9, width=0),
    TileSpec(3, "float32", 1, 16, 32, 2, backward=True, height=9, width=9),
])
def test_plane_load_needs_a_forward_tile_over_the_plane(spec):
    with pytest.raises(ValueError, match="height and width"):
        tile_kernel_source(spec)


#: (shape, levels, k, tile, threads, storage): a partial last round of pixels (13 x 11
#: = 4 * 32 + 15), two warps and a grid wider than a warp, a plane of one row, float16,
#: no levels (the base convolution alone, an odd halo rounded up), three levels (two LL
#: grids whose halos the whole plane's tile keeps at 2P), K = 1 (no halos; z_1 still
#: over the LL grid).
CASES = [
    ((2, 2, 13, 11), 1, 3, 16, 32, "float32"),
    ((1, 2, 5, 6), 0, 7, 8, 32, "float32"),
    ((1, 2, 27, 30), 2, 5, 32, 64, "float32"),
    ((1, 1, 1, 7), 1, 3, 8, 32, "float32"),
    ((1, 3, 9, 12), 2, 3, 12, 32, "float16"),
    ((1, 2, 13, 16), 3, 3, 16, 32, "float32"),
    ((1, 2, 6, 8), 2, 1, 8, 32, "float32"),
]


@simulator
@pytest.mark.parametrize("shape,levels,k,tile,threads,storage", CASES)
def test_plane_load_gives_the_same_bits(rng, nan_shared, shape, levels, k, tile, threads,
                                       storage):
    """The planner's tile with the plane's sizes compile-time: the oracle's output, and
    bit for bit the same tile with run-time sizes (``height`` 0: row-pair load, checked
    stores), both on poisoned outputs."""
    dtype, tol = {"float32": (np.float32, 2e-6), "float16": (np.float16, 2e-3)}[storage]
    b, c, h, w = shape
    x, wts, weights, problem = random_layer(rng, shape, levels, k, 1, storage, True)
    backend = RecordingBackend()
    tuning = Tuning(tiles=True, tile=tile, threads=threads, strip=2)
    plan = plan_tiles(problem, backend.shared_limit, tuning)
    assert plan.ntiles == 1 and (plan.spec.height, plan.spec.width) == (h, w)
    y = np.full(shape, np.nan, dtype)
    run_forward(backend, problem, x, y, weights, tuning)
    assert "grid 0: zeros, then the plane's pixels" in tile_kernel_source(plan.spec)
    rows = plan.spec._replace(height=0, width=0)
    y_rows = np.full(shape, np.nan, dtype)
    backend.call(backend.kernel(rows), plan.grid, plan.block,
                 (x, y_rows, *weights, h, w, c, 1, 1, 1), 4 * spec_geometry(rows).floats)
    want = reference.forward(x, wts, levels, 1)
    assert np.isfinite(y).all()
    assert np.linalg.norm(y - want) / np.linalg.norm(want) < tol
    np.testing.assert_array_equal(y, y_rows)
