"""Split passes (coarse pre-pass, coarse problem, fine levels on tiles).

Planner rules run anywhere; the kernels run in numba's CUDA simulator against
the float64 oracle, on tiny odd planes with tiles forced small.
"""

import os

import numpy as np
import pytest

from wtconv_cuda import reference
from wtconv_cuda.kernels.codegen import FinalizeSpec
from wtconv_cuda.kernels.coarse import (
    CoarseOutSpec, CoarseSpec, coarse_in_source, coarse_layout, coarse_out_source,
)
from wtconv_cuda.kernels.launch import (
    SPLIT_FINE_LEVELS, Problem, Tuning, Weights, plan_split, plan_tiles, planned_specs,
    run_backward, run_forward, work_buffers,
)
from wtconv_cuda.kernels.tiles import TileSpec, tile_kernel_source

from ..conftest import random_weights
from ._backends import RecordingBackend

LIMIT = 227 * 1024 - 1024
simulator = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                               reason="needs numba's CUDA simulator")


#: (shape, levels, k, split, tile, threads, strip, storage, bias): odd planes with
#: partial edge tiles, splits at 1 and 2, K 3 and 5, float16, no bias, one or two
#: coarse values per thread.
SPLIT_CASES = [
    ((1, 2, 21, 19), 3, 3, 1, 8, 32, 2, "float32", True),
    ((1, 1, 20, 18), 4, 3, 2, 8, 32, 2, "float16", False),
    ((2, 1, 17, 12), 3, 5, 2, 8, 32, 4, "float32", True),
    ((1, 2, 12, 11), 3, 3, 2, 12, 32, 2, "float32", True),  # one tile fitted to the plane
    # 36 top-level coefficients per tile on 32 threads: two coarse values per thread
    ((1, 1, 23, 21), 3, 3, 1, 12, 32, 2, "float32", True),
]


@simulator
@pytest.mark.parametrize("shape,levels,k,split,tile,threads,strip,storage,bias", SPLIT_CASES)
def test_split_matches_oracle(rng, shape, levels, k, split, tile, threads, strip, storage,
                              bias):
    """Forward and backward, split: outputs and every gradient against the oracle, inputs
    untouched, work buffers as work_buffers() says."""
    dtype, tol = {"float32": (np.float32, 2e-6), "float16": (np.float16, 2e-3)}[storage]
    b, c, h, w = shape
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    wts = random_weights(rng, c, k, levels, bias=bias, dtype=dtype)
    weights = Weights(wts.base_weight, wts.base_bias if bias else wts.base_scale,
                      wts.base_scale, wts.wavelet_weight, wts.wavelet_scale)
    problem = Problem(b, c, h, w, k, levels, 1, storage, bias)
    tuning = Tuning(split=split, tile=tile, threads=threads, strip=strip)
    backend = RecordingBackend()
    for backward in (False, True):
        plan = plan_split(problem, backend.shared_limit, tuning, backward)
        assert plan is not None and plan.split == split and plan.tiles.spec.levels == split
        assert plan.tiles.spec.backward == backward and plan.coarse == Problem(
            b, c, -(-h >> split), -(-w >> split), k, levels - split, 1, "float32", False)
    before = [a.copy() for a in (x, dy, *weights)]

    y = np.full(shape, np.nan, dtype)
    run_forward(backend, problem, x, y, weights, tuning)
    assert tuple(backend.requests) == work_buffers(problem, False, backend.shared_limit,
                                                   backend.max_slots, tuning)
    backend.requests.clear()
    dx = np.full(shape, np.nan, dtype)
    grads = Weights(*(np.full(a.shape, np.nan, dtype) for a in weights))
    run_backward(backend, problem, x, dy, dx, weights, grads, tuning)
    assert tuple(backend.requests) == work_buffers(problem, True, backend.shared_limit,
                                                   backend.max_slots, tuning)
    for a, a_before in zip((x, dy, *weights), before):
        np.testing.assert_array_equal(a, a_before)

    dx_ref, dw_ref = reference.backward(x, wts, dy, levels, 1)
    pairs = {"y": (y, reference.forward(x, wts, levels, 1)), "dx": (dx, dx_ref)}
    for name in ("base_weight", "base_scale", "wavelet_weight", "wavelet_scale") + (
            ("base_bias",) if bias else ()):
        pairs[name] = (getattr(grads, name), getattr(dw_ref, name))
    for name, (got, want) in pairs.items():
        got = got.astype(np.float64)
        assert np.isfinite(got).all(), f"{name}: unwritten (NaN) elements"
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < tol, (name, err)


def test_planner_splits_deep_levels_on_large_planes():
    """Default on large planes: the deepest split up to SPLIT_FINE_LEVELS that the tile
    rule takes; none where the tiles take the whole problem, at stride 2, or with the
    tiles or the split off."""
    plan = plan_split(Problem(8, 64, 512, 512, 5, 5, 1, "float32", True), LIMIT)
    assert plan.split == SPLIT_FINE_LEVELS == 2
    assert plan.tiles.spec == TileSpec(5, "float32", 2, 64, 128, 4, 128, coarse=True)
    assert plan.coarse == Problem(8, 64, 128, 128, 5, 3, 1, "float32", False)
    assert plan.coarse_in == CoarseSpec("float32", 2)
    assert plan_split(Problem(8, 64, 512, 512, 9, 5, 1, "bfloat16", True), LIMIT).split == 2
    assert plan_split(Problem(8, 64, 512, 512, 5, 4, 1, "float16", True), LIMIT).split == 2
    back = plan_split(Problem(8, 64, 512, 512, 5, 5, 1, "bfloat16", True), LIMIT, backward=True)
    assert back.split == 2 and back.tiles.spec.backward and back.coarse_in.pooled == 2
    assert back.coarse_out == CoarseOutSpec("bfloat16") and plan.coarse_out is None
    for problem, tuning in [
            (Problem(8, 64, 512, 512, 5, 3, 1, "float32", True), Tuning()),  # tiles whole
            (Problem(8, 64, 512, 512, 5, 5, 2, "float32", True), Tuning()),  # stride 2
            (Problem(8, 64, 512, 512, 5, 5, 1, "float32", True), Tuning(tiles=False)),
            (Problem(8, 64, 512, 512, 5, 5, 1, "float32", True), Tuning(split=0)),
            (Problem(8, 64, 512, 512, 5, 5, 1, "float32", True), Tuning(split=5)),
    ]:
        assert plan_split(problem, LIMIT, tuning) is None, (problem, tuning)


def test_planner_splits_convnext_stages_with_one_tile_per_plane():
    """Default forward on planes no larger than a tile: one tile that wastes little, a large
    enough problem; L >= 4 and c = 2 for 32 and 64 tiles, L >= 3 and c = 1 for 16 tiles (32
    threads, strip 2); planes of 33 to 64 pixels get a tile fitted to a multiple of 8."""
    plan = plan_split(Problem(64, 96, 56, 56, 5, 5, 1, "float32", True), LIMIT)
    assert plan.split == 2 and plan.tiles.spec.tile == 56 and plan.tiles.ntiles == 1
    assert plan.coarse == Problem(64, 96, 14, 14, 5, 3, 1, "float32", False)
    for (h, w), tile in [((50, 47), 56), ((40, 33), 40), ((60, 57), 64), ((64, 64), 64)]:
        plan = plan_split(Problem(64, 96, h, w, 5, 5, 1, "float16", True), LIMIT)
        assert plan.split == 2 and plan.tiles.spec.tile == tile and plan.tiles.ntiles == 1
    plan = plan_split(Problem(64, 192, 28, 28, 5, 4, 1, "bfloat16", True), LIMIT)
    assert plan.split == 2 and plan.tiles.spec.tile == 32 and plan.tiles.ntiles == 1
    assert plan.coarse == Problem(64, 192, 7, 7, 5, 2, 1, "float32", False)
    plan = plan_split(Problem(64, 384, 14, 14, 5, 3, 1, "float32", True), LIMIT)
    assert plan.split == 1 and plan.tiles.ntiles == 1
    spec = plan.tiles.spec
    assert (spec.tile, spec.threads, spec.strip, spec.levels) == (16, 32, 2, 1)
    assert plan.coarse == Problem(64, 384, 7, 7, 5, 2, 1, "float32", False)
    assert plan_split(Problem(2048, 8, 16, 16, 3, 4, 1, "float32", True), LIMIT).split == 1
    # the 56 x 56 stage's coarse problem: too few planes for a split at 1 (it would fill
    # 48 register-kernel blocks)
    assert plan_split(Problem(64, 96, 14, 14, 5, 3, 1, "float32", False), LIMIT) is None
    # not the backward: its work buffers cost more memory than its 2-19% of speed is worth
    for problem in [Problem(64, 96, 56, 56, 5, 5, 1, "float32", True),
                    Problem(64, 192, 28, 28, 5, 4, 1, "bfloat16", True)]:
        assert plan_split(problem, LIMIT, backward=True) is None
    # K 9: a 56 tile's halo reads 2.5x its pixels, the 64 tile's 2.25x
    plan = plan_split(Problem(64, 96, 56, 56, 9, 5, 1, "float32", True), LIMIT)
    assert plan.split == 2 and plan.tiles.spec.tile == 64
    plan = plan_split(Problem(64, 96, 56, 56, 7, 5, 1, "float32", True), LIMIT)
    assert plan.split == 2 and plan.tiles.spec.tile == 56
    for problem in [Problem(64, 192, 28, 28, 5, 3, 1, "float32", True),  # L 3 on a 32 tile
                    Problem(64, 384, 14, 14, 5, 2, 1, "float32", True),  # L 2 on a 16 tile
                    Problem(64, 768, 7, 7, 5, 2, 1, "float32", True),
                    Problem(64, 96, 40, 20, 5, 5, 1, "float32", True),  # a 40 tile wastes 2x
                    Problem(1, 8, 56, 56, 5, 5, 1, "float32", True),  # too small a problem
                    Problem(512, 8, 8, 8, 3, 4, 1, "float32", True),  # no rule for 8 tiles
                    Problem(64, 384, 14, 14, 7, 3, 1, "float32", True),  # halo: 3.1 reads
                    Problem(64, 192, 28, 28, 7, 4, 1, "float32", True),  # halo: 3.1 reads
                    Problem(64, 96, 56, 56, 5, 5, 1, "float32", True)._replace(stride=2)]:
        assert plan_split(problem, LIMIT) is None, problem
    assert plan_split(Problem(64, 96, 56, 56, 5, 5, 1, "float32", True), LIMIT,
                      Tuning(tile=32)) is None  # an explicit tile edge: no default split


def test_forced_split_on_convnext_planes():
    problem = Problem(64, 96, 56, 56, 5, 5, 1, "bfloat16", True)
    plan = plan_split(problem, LIMIT, Tuning(split=2, tile=32))
    assert plan.tiles.spec.tile == 32 and plan.tiles.ntiles == 4
    assert plan.coarse == Problem(64, 96, 14, 14, 5, 3, 1, "float32", False)
    assert plan_tiles(problem, LIMIT, Tuning(tile=32)) is None  # whole: the halo is too large


def test_planned_specs_of_a_split_pass():
    problem = Problem(8, 64, 512, 512, 5, 5, 1, "float32", True)
    plan = plan_split(problem, LIMIT)
    specs = planned_specs(problem, False, LIMIT, 264)
    assert specs[0] == plan.coarse_in and specs[-1] == plan.tiles.spec
    assert specs[1:-1] == planned_specs(plan.coarse, False, LIMIT, 264)
    back = plan_split(problem, LIMIT, backward=True)
    specs = planned_specs(problem, True, LIMIT, 264)
    assert specs[0] == back.coarse_in and specs[-3:] == [
        back.tiles.spec, FinalizeSpec(5, "float32", 128), back.coarse_out]
    assert specs[1:-3] == planned_specs(back.coarse, True, LIMIT, 264)


def test_coarse_layout_packs_the_buffers():
    lay = coarse_layout(2, 3, 5, 7, 5, 2)
    plane, K2 = 2 * 3 * 5 * 7, 25
    assert lay.pooled == (0,) and lay.pooled_floats == plane
    assert lay.out == 0 and lay.base_weight == plane
    assert lay.base_scale == lay.base_weight + 3 * K2
    assert lay.wavelet_weight == lay.base_scale + 3
    assert lay.wavelet_scale == lay.wavelet_weight + 2 * 3 * 4 * K2
    assert lay.floats == lay.wavelet_scale + 2 * 3 * 4 and lay.grads == 0
    back = coarse_layout(2, 3, 5, 7, 5, 2, backward=True)
    assert back.pooled == (0, plane) and back.pooled_floats == 2 * plane
    assert back.grads == lay.floats  # then weight, bias, scale and the levels' gradients
    assert back.floats == back.grads + (lay.floats - lay.base_weight) + 3


@pytest.mark.parametrize("spec,message", [
    (CoarseSpec("float64", 1), "storage"),
    (CoarseSpec("float32", 0), "split"),
    (CoarseSpec("float32", 1, 3), "pooled"),
    (CoarseSpec("float32", 1, 1, 48), "threads"),
])
def test_coarse_in_rejects_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        coarse_in_source(spec)


@pytest.mark.parametrize("spec,message", [(CoarseOutSpec("int8"), "storage"),
                                          (CoarseOutSpec("float32", 0), "threads")])
def test_coarse_out_rejects_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        coarse_out_source(spec)


def test_coarse_tiles_need_a_fine_level():
    with pytest.raises(ValueError, match="fine level"):
        tile_kernel_source(TileSpec(3, "float32", 0, 8, 32, 2, coarse=True))
