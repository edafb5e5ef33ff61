"""Several planes of one channel a block for the forward tiles over their whole plane
(``TileSpec.planes``, ``Tuning(tile_planes=...)``).

The planner and the generated source are checked anywhere; the kernels run in numba's
CUDA simulator (shared memory poisoned with NaN) against the float64 oracle and bit for
bit against one plane a block: each plane's sums are the same, only where its buffer
lies and who folds the taps change.
"""

import os

import pytest

from wtconv_cuda.kernels.compiler import block_threads, spec_from_repr
from wtconv_cuda.kernels.launch import Problem, Tuning, plan_plane, plan_split, plan_tiles
from wtconv_cuda.kernels.tiles import (
    TileSpec, plane_floats, shared_floats, spec_geometry, tile_kernel_source,
)

from ._oracle import forwards_agree

simulator = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                               reason="needs numba's CUDA simulator")
LIMIT = 227 * 1024 - 1024
STAGE28 = TileSpec(5, "float32", 2, 32, 32, 4, 120, coarse=True, height=28, width=28)


def test_planner_puts_planes_of_one_channel_in_a_block():
    """At the 28 x 28 stage: four planes a block by default (its rule), a quarter of the
    blocks, the taps once and a data buffer per plane; one plane a block where asked, and
    where ``B`` is not a multiple of the planes."""
    stage = Problem(64, 192, 28, 28, 5, 4, 1, "float32", True)
    one = plan_split(stage, LIMIT, Tuning(tile_planes=1)).tiles
    four = plan_split(stage, LIMIT).tiles
    assert plan_split(stage, LIMIT, Tuning(tile_planes=4)).tiles == four
    assert one.spec.planes == 1 and four.spec == one.spec._replace(planes=4)
    assert (four.grid, four.block) == (one.grid // 4, 4 * one.block)
    geo = spec_geometry(one.spec)
    assert four.shared_bytes == 4 * shared_floats(four.spec) == 4 * (
        geo.ntaps + 4 * plane_floats(four.spec))
    assert one.shared_bytes == 4 * shared_floats(one.spec) == 4 * geo.floats
    assert plane_floats(four.spec) % 4 == 0 and plane_floats(four.spec) >= geo.floats - geo.ntaps
    odd_batch = stage._replace(batch=62)
    assert plan_split(odd_batch, LIMIT).tiles.spec.planes == 1


@pytest.mark.parametrize("planes", [1, 2, 4, 16])
def test_compiled_block_size_is_the_launch_block(planes):
    """The PTX's ``.maxntid`` (:func:`block_threads`) is the block the planner launches;
    a smaller one makes the driver refuse the launch (it did for ``planes`` > 1: 32)."""
    stage = Problem(64, 192, 28, 28, 5, 4, 1, "float32", True)
    tiles = plan_split(stage, LIMIT, Tuning(tile_planes=planes)).tiles
    assert tiles.spec.planes == planes
    assert block_threads(tiles.spec) == tiles.block == 32 * planes


def test_compiled_block_size_of_a_plane_kernel_counts_its_planes():
    small = Problem(8, 16, 14, 14, 5, 3, 1, "float32", True)
    plan = plan_plane(small, False, LIMIT, 1)
    assert plan.spec.planes_per_block > 1
    assert block_threads(plan.spec) == plan.block == plan.spec.threads * plan.spec.planes_per_block


def test_planes_need_a_forward_tile_over_its_whole_plane():
    for spec in (STAGE28._replace(planes=2, height=0, width=0),
                 STAGE28._replace(planes=2, backward=True, height=0, width=0, coarse=False),
                 TileSpec(5, "float32", 2, 56, 128, 7, 128, inner_levels=3, height=56,
                          width=56, planes=2),
                 STAGE28._replace(planes=0)):
        with pytest.raises(ValueError):
            tile_kernel_source(spec)


def test_source_of_a_block_of_planes():
    """One copy of the taps (``T``, folded by group 0); every other access offset by the
    group's buffer (``so``); one plane a block generates what it did before the field."""
    four = tile_kernel_source(STAGE28._replace(planes=4))
    assert "T = S" in four and f"so = wp * {plane_floats(STAGE28)}" in four
    assert "if wp == 0:" in four and "plane = (cb * 4 + wp) * C + (bid - cb * C)" in four
    body = four.split("bid = int64(cuda.blockIdx.x)")[1]
    assert "S[" in body and all(part.startswith("so + ") for part in body.split("S[")[1:])
    assert "T[" in body
    one = tile_kernel_source(STAGE28)
    assert "T[" not in one and "so" not in one.split()


def test_repr_leaves_out_one_plane():
    """Variant names and PTX cache keys of one plane a block are what they were."""
    assert "planes" not in repr(STAGE28)
    assert repr(STAGE28).endswith("height=28, width=28)")
    four = STAGE28._replace(planes=4)
    assert repr(four).endswith("width=28, planes=4)")
    for spec in (STAGE28, four):
        assert spec_from_repr(repr(spec)) == spec


@simulator
@pytest.mark.parametrize("shape,levels,k,storage,tuning", [
    ((4, 3, 28, 28), 4, 5, "float32", Tuning(split=2, tile=32, threads=32)),  # the stage's
    ((4, 2, 13, 15), 2, 3, "float16", Tuning(tiles=True, tile=16, threads=32)),
])
def test_planes_give_the_same_bits(rng, nan_shared, shape, levels, k, storage, tuning):
    tiles = forwards_agree(rng, shape, levels, k, storage,
                           [tuning._replace(tile_planes=planes) for planes in (1, 2, 4)])
    assert [[spec.planes for spec in run] for run in tiles] == [[1], [2], [4]]


def test_module_default_reaches_the_planner(monkeypatch):
    """``TILE_PLANES`` is the planner's default for whole-plane tiles that no small-plane
    rule sets; the 28 x 28 rule's own count (four) stands unless the rule is replaced, as
    ``benchmarks/ncu_target.py tile_planes=P`` does."""
    from wtconv_cuda.kernels import launch
    stage = Problem(64, 192, 28, 28, 5, 4, 1, "float32", True)
    small = Problem(4, 2, 13, 15, 3, 2, 1, "float16", True)
    forced = Tuning(tiles=True, tile=16, threads=32)
    assert plan_tiles(small, LIMIT, forced).spec.planes == 1
    monkeypatch.setattr(launch, "TILE_PLANES", 2)
    launch.clear_plan_caches()
    try:
        assert plan_tiles(small, LIMIT, forced).spec.planes == 2
        assert plan_split(stage, LIMIT).tiles.spec.planes == 4
        monkeypatch.setattr(launch, "SPLIT_SMALL_TILES", {
            edge: rule._replace(planes=16) for edge, rule in launch.SPLIT_SMALL_TILES.items()})
        launch.clear_plan_caches()
        assert plan_split(stage, LIMIT).tiles.spec.planes == 16
        assert plan_split(stage, LIMIT, Tuning(tile_planes=2)).tiles.spec.planes == 2
    finally:
        monkeypatch.undo()
        launch.clear_plan_caches()
    assert plan_split(stage, LIMIT).tiles.spec.planes == 4
