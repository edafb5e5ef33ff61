"""Split tiles that read the coarse problem's output only before their syntheses
(``TileSpec.late_coarse``, ``Tuning(late_coarse=True)``), for programmatic dependent launch.

The planner and the generated source are checked anywhere; the kernels run in numba's CUDA
simulator (shared memory poisoned with NaN), where the grid dependency calls do nothing,
against the float64 oracle and bit for bit against the default tiles: the same sums are
added in the same order (``acc + coarse``), only later.
"""

import os

import pytest

from wtconv_cuda.kernels import grid_dependency
from wtconv_cuda.kernels.compiler import spec_from_repr
from wtconv_cuda.kernels.launch import Problem, Tuning, plan_split
from wtconv_cuda.kernels.tiles import TileSpec, tile_kernel_source

from ._oracle import forwards_agree

simulator = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                               reason="needs numba's CUDA simulator")
LIMIT = 227 * 1024 - 1024
STAGE28 = TileSpec(5, "float32", 2, 32, 32, 4, 120, coarse=True, height=28, width=28)


def test_planner_sets_it_on_the_forward_tiles_of_a_split_only():
    stage = Problem(64, 192, 28, 28, 5, 4, 1, "float32", True)
    default = plan_split(stage, LIMIT)
    late = plan_split(stage, LIMIT, Tuning(late_coarse=True))
    assert not default.tiles.spec.late_coarse
    assert late.tiles.spec == default.tiles.spec._replace(late_coarse=True)
    assert late.tiles._replace(spec=default.tiles.spec) == default.tiles
    deep = Problem(8, 32, 128, 128, 5, 5, 1, "float32", True)  # splits both ways
    assert plan_split(deep, LIMIT, Tuning(late_coarse=True)).tiles.spec.late_coarse
    backward = plan_split(deep, LIMIT, Tuning(late_coarse=True), backward=True)
    assert backward is not None and not backward.tiles.spec.late_coarse


def test_repr_leaves_out_the_default():
    """Variant names and PTX cache keys of the default tiles are what they were."""
    assert "late_coarse" not in repr(STAGE28)
    late = STAGE28._replace(late_coarse=True, planes=4)
    assert repr(late).endswith("planes=4, late_coarse=True)")
    for spec in (STAGE28, late):
        assert spec_from_repr(repr(spec)) == spec


def test_source_waits_after_every_convolution():
    """No coarse load before the syntheses' phase; there the wait, then the trigger, then
    the loads and the adds; the default source calls neither."""
    default = tile_kernel_source(STAGE28)
    late = tile_kernel_source(STAGE28._replace(late_coarse=True))
    assert grid_dependency.WAIT not in default and grid_dependency.TRIGGER not in default
    assert late.count(f"{grid_dependency.WAIT}()") == 1
    assert late.count(f"{grid_dependency.TRIGGER}()") == 1
    wait = late.index(f"{grid_dependency.WAIT}()")
    assert wait < late.index(f"{grid_dependency.TRIGGER}()") < late.index("coarse[")
    assert late.count("coarse[") == default.count("coarse[")
    assert "# level 1:" in late[:wait] and "synthesis" not in late[:wait].lower().split(
        "def wtconv_tile")[1]
    # the strips write the LL sums; the late phase adds the coarse output to them
    assert "+ S[zq]" in default and "+ S[zq]" not in late
    assert "] + cv0" in late


@pytest.mark.parametrize("spec", [STAGE28._replace(coarse=False, late_coarse=True),
                                  TileSpec(3, "float16", 1, 32, 128, 2, 128, backward=True,
                                           coarse=True, late_coarse=True)])
def test_it_needs_a_forward_tile_with_a_coarse_pre_pass(spec):
    with pytest.raises(ValueError, match="late_coarse"):
        tile_kernel_source(spec)


def test_simulator_builds_the_calls_as_no_ops():
    names = grid_dependency.namespace(f"{grid_dependency.WAIT}()", simulator=True)
    assert set(names) == {grid_dependency.WAIT}
    assert names[grid_dependency.WAIT]() is None
    assert grid_dependency.namespace("S[0] = fz", simulator=True) == {}


@simulator
@pytest.mark.parametrize("shape,levels,k,storage,tuning", [
    # the 28 x 28 stage's split (one tile per plane), one and four planes a block
    ((4, 3, 28, 28), 4, 5, "float32", Tuning(split=2, tile=32, threads=32)),
    ((4, 2, 28, 28), 4, 5, "float32", Tuning(split=2, tile=32, threads=32, tile_planes=4)),
    # several tiles per plane, an odd plane, the split at one level
    ((2, 2, 21, 19), 3, 3, "float16", Tuning(split=1, tile=16, threads=64)),
])
def test_late_tiles_give_the_same_bits(rng, nan_shared, shape, levels, k, storage, tuning):
    tiles = forwards_agree(rng, shape, levels, k, storage,
                           [tuning._replace(late_coarse=late) for late in (False, True)])
    assert [[spec.late_coarse for spec in run] for run in tiles] == [[False], [True]]
