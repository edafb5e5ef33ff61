"""Split passes (coarse pre-pass, coarse problem, fine levels on tiles).

Planner rules run anywhere; the kernels run in numba's CUDA simulator against
the float64 oracle, on tiny odd planes with tiles forced small.
"""

import os

import numpy as np
import pytest

from wtconv_cuda import reference
from wtconv_cuda.kernels import launch
from wtconv_cuda.kernels.codegen import FinalizeSpec
from wtconv_cuda.kernels.coarse import (
    CoarseOutSpec, CoarseSpec, PartialSumSpec, coarse_in_source, coarse_layout,
    coarse_out_source,
)
from wtconv_cuda.kernels.launch import (
    SPLIT_FINE_LEVELS, Problem, Tuning, Weights, plan_registers, plan_split, plan_tiles,
    planned_specs, run_backward, run_forward, work_buffers,
)
from wtconv_cuda.kernels.tiles import TileSpec, spec_geometry, tile_geometry, tile_kernel_source

from ..conftest import random_weights
from ._backends import RecordingBackend
from ._oracle import random_layer

LIMIT = 227 * 1024 - 1024
#: The split rules, without the forward's inner levels that replace some of them.
SPLIT = Tuning(inner=False)
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
    _check_split(rng, shape, levels, k, split, Tuning(split=split, tile=tile, threads=threads,
                                                      strip=strip), storage, bias)


#: (shape, levels, k, split, tile, split_batch, storage, bias): the backward in batch
#: chunks, uneven (2 + 1 entries) and of one entry each.
CHUNK_CASES = [
    ((3, 2, 19, 21), 3, 3, 1, 8, 2, "float32", True),
    ((2, 1, 17, 12), 3, 5, 2, 8, 1, "float16", False),
]


@simulator
@pytest.mark.parametrize("shape,levels,k,split,tile,split_batch,storage,bias", CHUNK_CASES)
def test_split_backward_in_batch_chunks_matches_oracle(rng, shape, levels, k, split, tile,
                                                       split_batch, storage, bias):
    """The split backward in batch chunks (Tuning.split_batch): dx and every gradient
    against the oracle, its work buffers as work_buffers() says, one chunk sum each."""
    tuning = Tuning(split=split, tile=tile, threads=32, strip=2, split_batch=split_batch)
    problem = Problem(*shape, k, levels, 1, storage, bias)
    chunks = launch.split_batch_chunks(problem, 227 * 1024, 2, tuning)
    want = [split_batch] * (shape[0] // split_batch) + [shape[0] % split_batch] * (
        shape[0] % split_batch > 0)
    assert [plan.coarse.batch for plan in chunks] == want
    assert PartialSumSpec() in planned_specs(problem, True, 227 * 1024, 2, tuning)
    _check_split(rng, shape, levels, k, split, tuning, storage, bias)


def _check_split(rng, shape, levels, k, split, tuning, storage, bias):
    dtype, tol = {"float32": (np.float32, 2e-6), "float16": (np.float16, 2e-3)}[storage]
    b, c, h, w = shape
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    wts = random_weights(rng, c, k, levels, bias=bias, dtype=dtype)
    weights = Weights(wts.base_weight, wts.base_bias if bias else wts.base_scale,
                      wts.base_scale, wts.wavelet_weight, wts.wavelet_scale)
    problem = Problem(b, c, h, w, k, levels, 1, storage, bias)
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
    assert plan.coarse_in == CoarseSpec("float32", 2, height=128, width=128)
    assert plan_split(Problem(8, 64, 512, 512, 9, 5, 1, "bfloat16", True), LIMIT).split == 2
    assert plan_split(Problem(8, 64, 512, 512, 5, 4, 1, "float16", True), LIMIT).split == 2
    back = plan_split(Problem(8, 64, 512, 512, 5, 5, 1, "bfloat16", True), LIMIT, backward=True)
    assert back.split == 2 and back.tiles.spec.backward and back.coarse_in.pooled == 2
    assert back.coarse_out == CoarseOutSpec("bfloat16") and plan.coarse_out is None
    for problem, tuning in [
            (Problem(8, 64, 128, 128, 5, 3, 1, "float32", True), Tuning()),  # tiles whole
            (Problem(8, 64, 512, 512, 5, 5, 2, "float32", True), Tuning()),  # stride 2
            (Problem(8, 64, 512, 512, 5, 5, 1, "float32", True), Tuning(tiles=False)),
            (Problem(8, 64, 512, 512, 5, 5, 1, "float32", True), Tuning(split=0)),
            (Problem(8, 64, 512, 512, 5, 5, 1, "float32", True), Tuning(split=5)),
    ]:
        assert plan_split(problem, LIMIT, tuning) is None, (problem, tuning)


@pytest.mark.parametrize("storage", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(8, 32, 128, 128), (8, 128, 256, 256), (8, 64, 512, 512),
                                   (7, 64, 512, 512)])
def test_split_backward_chunks_keep_its_buffers_within_the_budget(shape, storage):
    """A split backward whose whole batch would hold more than
    SPLIT_BACKWARD_BUFFER_FRACTION of x's bytes runs in the fewest batch chunks, as even
    as they go, that hold no more (the paper grid's L 5: two chunks in fp32; in 16 bits,
    whose x has half the bytes, three or four); each chunk's plan is the split of its
    entries."""
    from wtconv_cuda.kernels.launch import (ITEMSIZE, SPLIT_BACKWARD_BUFFER_FRACTION,
                                            split_batch_chunks, split_live_floats)
    slots = 264
    problem = Problem(*shape, 5, 5, 1, storage, True)
    budget = SPLIT_BACKWARD_BUFFER_FRACTION * np.prod(shape) * ITEMSIZE[storage]
    split = plan_split(problem, LIMIT, backward=True)
    assert 4 * split_live_floats(split, (), LIMIT, slots) > budget
    chunks = split_batch_chunks(problem, LIMIT, slots)
    assert 4 * split_live_floats(split, chunks, LIMIT, slots) <= budget
    size = chunks[0].coarse.batch
    assert [plan.coarse.batch for plan in chunks] == [size] * (shape[0] // size) + (
        [shape[0] % size] if shape[0] % size else [])
    fewer = -(-shape[0] // (len(chunks) - 1))  # one chunk fewer, as even as they go
    larger = split_batch_chunks(problem, LIMIT, slots, Tuning(split_batch=fewer))
    assert 4 * split_live_floats(split, larger, LIMIT, slots) > budget
    if storage == "float32" and shape[0] == 8:
        assert size == 4
    for plan in chunks:
        assert plan == launch._split_plan(
            problem._replace(batch=plan.coarse.batch), 2,
            split.tiles._replace(grid=plan.tiles.grid, finalize_dims=None), LIMIT, True)
        assert plan.tiles.grid == plan.coarse.batch * shape[1] * split.tiles.ntiles


def test_split_backward_runs_whole_where_it_cannot_or_need_not_chunk():
    """No chunks: one batch entry, a batch forced whole, a forward, no split."""
    from wtconv_cuda.kernels.launch import split_batch_chunks
    deep = Problem(1, 64, 512, 512, 5, 5, 1, "float32", True)
    assert plan_split(deep, LIMIT, backward=True) is not None
    assert split_batch_chunks(deep, LIMIT, 264) == ()
    deep = deep._replace(batch=8)
    assert split_batch_chunks(deep, LIMIT, 264, Tuning(split_batch=8)) == ()
    assert split_batch_chunks(deep, LIMIT, 264, Tuning(split_batch=64)) == ()
    assert len(split_batch_chunks(deep, LIMIT, 264, Tuning(split_batch=3))) == 3
    assert split_batch_chunks(deep, LIMIT, 264, Tuning(split=0)) == ()
    assert PartialSumSpec() not in planned_specs(deep, False, LIMIT, 264)
    assert PartialSumSpec() in planned_specs(deep, True, LIMIT, 264)


def test_planner_splits_three_levels_on_large_planes_within_the_buffer_budget():
    """Whole tiles take L 3, but on planes of at least SPLIT_SHALLOW_MIN_EDGE pixels a
    side the pass splits at SPLIT_FINE_LEVELS where the split's float32 buffers can fit
    SPLIT_SHALLOW_BUFFER_FRACTION of x's bytes: both passes, the backward in batch chunks
    (its whole batch holds 0.19 of an fp32 x, 0.38 of a 16-bit one; chunks of one entry
    hold a few hundredths), but for a 16-bit backward of one entry. Not on
    smaller planes, not at L 2 (a split at 1 holds 0.76 of x), not where whole tiles
    load fewer than SPLIT_SHALLOW_MIN_READ pixels per output pixel (K 3 at L 3: 1.56;
    at L 4 they load 2.25, as K 5 at L 3), and only where whole tiles would run."""
    from wtconv_cuda.kernels.launch import (ITEMSIZE, SPLIT_SHALLOW_BUFFER_FRACTION,
                                            SPLIT_SHALLOW_MIN_EDGE)
    assert SPLIT_SHALLOW_MIN_EDGE == 256
    at_fine = Tuning(split=SPLIT_FINE_LEVELS)
    for edge in (256, 512):
        for storage in ("float32", "bfloat16", "float16"):
            problem = Problem(8, 128, edge, edge, 5, 3, 1, storage, True)
            assert plan_tiles(problem, LIMIT) is not None
            forward = plan_split(problem, LIMIT)
            assert forward.split == SPLIT_FINE_LEVELS and forward.coarse.levels == 1
            assert forward.tiles.spec == plan_split(problem, LIMIT, at_fine).tiles.spec
            back = plan_split(problem, LIMIT, backward=True)
            assert back.split == SPLIT_FINE_LEVELS and back.tiles.spec.backward
            forced = plan_split(problem, LIMIT, at_fine, backward=True)
            whole = forced.layout.floats + max(forced.layout.pooled_floats,
                                               forced.tiles.partial_floats)
            fits_whole = 4 * whole <= SPLIT_SHALLOW_BUFFER_FRACTION * problem.batch * \
                problem.channels * edge * edge * ITEMSIZE[storage]
            assert fits_whole == (storage == "float32"), (problem, whole)
            one = problem._replace(batch=1)  # no chunks: whole in fp32 only
            assert (plan_split(one, LIMIT, backward=True) is not None) == (
                storage == "float32")
    for problem in (Problem(8, 128, 128, 128, 5, 3, 1, "float32", True),  # small planes
                    Problem(8, 128, 512, 200, 5, 3, 1, "float32", True),  # one short side
                    Problem(8, 128, 512, 512, 5, 2, 1, "float32", True),  # L 2
                    Problem(8, 128, 512, 512, 3, 3, 1, "float32", True)):  # reads 1.56
        assert plan_tiles(problem, LIMIT) is not None
        assert plan_split(problem, LIMIT) is None, problem
        assert plan_split(problem, LIMIT, backward=True) is None, problem
    assert plan_split(Problem(8, 128, 512, 512, 5, 3, 1, "float32", True), LIMIT,
                      Tuning(tiles=False)) is None
    k3 = Problem(8, 64, 256, 256, 3, 4, 1, "float32", True)  # timed: the split won
    assert plan_tiles(k3, LIMIT) is not None
    assert plan_split(k3, LIMIT).split == SPLIT_FINE_LEVELS
    assert plan_split(k3, LIMIT, backward=True).split == SPLIT_FINE_LEVELS
    assert plan_split(k3._replace(storage="bfloat16"), LIMIT, backward=True).split == 2


def test_planner_splits_convnext_stages_with_one_tile_per_plane():
    """Default forward on planes no larger than a tile: one tile that wastes little, a large
    enough problem; L >= 4 and c = 2 for 32 and 64 tiles, L >= 3 and c = 1 for 16 tiles (32
    threads, strip 2); planes of 33 to 64 pixels get a tile fitted to a multiple of 8. (With a split at 2 the
    forward runs its coarse levels in the tile's block instead, see
    test_planner_runs_inner_levels_where_one_tile_covers_the_plane: these rules are those
    of the split it replaces, Tuning(inner=False).)"""
    plan = plan_split(Problem(64, 96, 56, 56, 5, 5, 1, "float32", True), LIMIT, SPLIT)
    assert plan.split == 2 and plan.tiles.spec.tile == 56 and plan.tiles.ntiles == 1
    assert plan.coarse == Problem(64, 96, 14, 14, 5, 3, 1, "float32", False)
    for (h, w), tile in [((50, 47), 56), ((40, 33), 40), ((60, 57), 64), ((64, 64), 64)]:
        plan = plan_split(Problem(64, 96, h, w, 5, 5, 1, "float16", True), LIMIT, SPLIT)
        assert plan.split == 2 and plan.tiles.spec.tile == tile and plan.tiles.ntiles == 1
    plan = plan_split(Problem(64, 192, 28, 28, 5, 4, 1, "bfloat16", True), LIMIT, SPLIT)
    assert plan.split == 2 and plan.tiles.spec.tile == 32 and plan.tiles.ntiles == 1
    assert plan.coarse == Problem(64, 192, 7, 7, 5, 2, 1, "float32", False)
    plan = plan_split(Problem(64, 384, 14, 14, 5, 3, 1, "float32", True), LIMIT, SPLIT)
    assert plan.split == 1 and plan.tiles.ntiles == 1
    spec = plan.tiles.spec
    assert (spec.tile, spec.threads, spec.strip, spec.levels) == (16, 32, 2, 1)
    assert plan.coarse == Problem(64, 384, 7, 7, 5, 2, 1, "float32", False)
    assert plan_split(Problem(2048, 8, 16, 16, 3, 4, 1, "float32", True), LIMIT, SPLIT).split == 1
    # the 56 x 56 stage's coarse problem: too few planes for a split at 1 (it would fill
    # 48 register-kernel blocks)
    assert plan_split(Problem(64, 96, 14, 14, 5, 3, 1, "float32", False), LIMIT, SPLIT) is None
    # not the backward: its work buffers cost more memory than its 2-19% of speed is worth
    for problem in [Problem(64, 96, 56, 56, 5, 5, 1, "float32", True),
                    Problem(64, 192, 28, 28, 5, 4, 1, "bfloat16", True)]:
        assert plan_split(problem, LIMIT, SPLIT, backward=True) is None
    # K 7 and 9: the halo of a tile over its whole plane is 2P wide on every grid, so
    # the fitted 56 tile stays (1.65 pixels a pixel at K 9; 2.47 with the halos of a
    # tile inside a plane), and the 32 tile at 28 x 28 reads 1.9 at K 7; the 28 x 28
    # rule stops at K 7 (max_kernel_size: its tile spills at K 9 and lost there)
    for k in (7, 9):
        plan = plan_split(Problem(64, 96, 56, 56, k, 5, 1, "float32", True), LIMIT, SPLIT)
        assert plan.split == 2 and plan.tiles.spec.tile == 56
    plan = plan_split(Problem(64, 192, 28, 28, 7, 4, 1, "float32", True), LIMIT, SPLIT)
    assert plan.split == 2 and plan.tiles.spec.tile == 32 and plan.tiles.ntiles == 1
    for problem in [Problem(64, 192, 28, 28, 5, 3, 1, "float32", True),  # L 3 on a 32 tile
                    Problem(64, 384, 14, 14, 5, 2, 1, "float32", True),  # L 2 on a 16 tile
                    Problem(64, 768, 7, 7, 5, 2, 1, "float32", True),
                    Problem(64, 96, 40, 20, 5, 5, 1, "float32", True),  # a 40 tile wastes 2x
                    Problem(1, 8, 56, 56, 5, 5, 1, "float32", True),  # too small a problem
                    Problem(512, 8, 8, 8, 3, 4, 1, "float32", True),  # no rule for 8 tiles
                    Problem(64, 384, 14, 14, 7, 3, 1, "float32", True),  # halo: 3.1 reads
                    Problem(64, 192, 28, 28, 9, 4, 1, "float32", True),  # max_kernel_size
                    Problem(64, 96, 56, 56, 5, 5, 1, "float32", True)._replace(stride=2)]:
        assert plan_split(problem, LIMIT, SPLIT) is None, problem
    assert plan_split(Problem(64, 96, 56, 56, 5, 5, 1, "float32", True), LIMIT,
                      Tuning(tile=32, inner=False)) is None  # an explicit tile edge: no default split


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
    whole = Tuning(split_batch=8)
    specs = planned_specs(problem, True, LIMIT, 264, whole)
    assert specs[0] == back.coarse_in and specs[-3:] == [
        back.tiles.spec, FinalizeSpec(5, "float32", 128), back.coarse_out]
    assert specs[1:-3] == planned_specs(back.coarse, True, LIMIT, 264)
    # in batch chunks (the default here: two of four entries, and with three an uneven
    # last one), each chunk size's coarse specs, then the chunks' partial sums
    for tuning, sizes in [(Tuning(), [4]), (Tuning(split_batch=3), [3, 2])]:
        specs = planned_specs(problem, True, LIMIT, 264, tuning)
        assert specs[0] == back.coarse_in and specs[-4:] == [
            back.tiles.spec, PartialSumSpec(), FinalizeSpec(5, "float32", 128),
            back.coarse_out]
        assert specs[1:-4] == [s for n in sizes for s in planned_specs(
            back.coarse._replace(batch=n), True, LIMIT, 264)]


@pytest.mark.usefixtures("without_lane_rule")  # (it takes the 14 x 14 forward)
def test_split_forward_pools_in_place_when_the_coarse_pass_runs_on_registers():
    """The ConvNeXt-T 28 x 28 and 14 x 14 forwards' coarse problems (7 x 7) run on the
    register kernel, over the pooled band: one work buffer, the coarse output and the
    parameters. Larger coarse planes, and every backward, keep the pooled buffer."""
    for problem in [Problem(64, 192, 28, 28, 5, 4, 1, "bfloat16", True),
                    Problem(64, 384, 14, 14, 5, 3, 1, "float32", True)]:
        plan = plan_split(problem, LIMIT, SPLIT)
        assert plan.in_place and plan_registers(plan.coarse, LIMIT) is not None
        assert work_buffers(problem, False, LIMIT, 264, SPLIT) == (plan.layout.floats,)
        assert plan.layout.floats < plan.layout.plane + plan.layout.pooled_floats
        whole = Tuning(split=plan.split, split_batch=problem.batch)
        back = plan_split(problem, LIMIT, whole, backward=True)
        assert not back.in_place
        assert work_buffers(problem, True, LIMIT, 264, whole)[:2] == (
            back.layout.pooled_floats, back.layout.floats)
    big = Problem(8, 64, 512, 512, 5, 5, 1, "float32", True)
    plan = plan_split(big, LIMIT)
    assert not plan.in_place
    assert work_buffers(big, False, LIMIT, 264)[:2] == (plan.layout.pooled_floats,
                                                        plan.layout.floats)


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
    (CoarseSpec("float64", 1, height=4, width=4), "storage"),
    (CoarseSpec("float32", 0, height=4, width=4), "split"),
    (CoarseSpec("float32", 1, 3, height=4, width=4), "pooled"),
    (CoarseSpec("float32", 1, 1, 48, height=4, width=4), "threads"),
    (CoarseSpec("float32", 1), "height and width"),
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


#: (shape, levels, k, split, tile, threads, storage, bias): one tile per plane, the levels
#: above the split in the block. Inner bands of odd size (7 -> 4 -> 2 -> 1, 3 -> 2 -> 1),
#: a plane smaller than its tile, K 3 and 5, float16, no bias; a split at 1, whose inner
#: levels cannot reuse grid 0 (x, read by the output phase), as the 14 x 14 stage's.
INNER_CASES = [
    ((1, 2, 13, 11), 4, 3, 2, 16, 32, "float32", True),
    ((2, 1, 12, 12), 5, 5, 2, 12, 32, "float32", True),
    ((1, 1, 28, 27), 5, 3, 2, 28, 64, "float32", False),
    ((1, 2, 9, 7), 3, 3, 2, 12, 32, "float16", True),
    ((1, 2, 14, 13), 3, 5, 1, 16, 32, "float32", True),
    ((1, 1, 7, 8), 3, 3, 1, 8, 32, "float16", False),
]


@simulator
@pytest.mark.parametrize("shape,levels,k,split,tile,threads,storage,bias", INNER_CASES)
def test_inner_levels_match_oracle_and_the_split(rng, monkeypatch, shape, levels, k, split,
                                                 tile, threads, storage, bias):
    """A tile running the levels above the split in its block (TileSpec.inner_levels),
    launched directly: the oracle's output, and bit for bit the split pass's (coarse
    pre-pass, coarse problem, tiles) with the same tile when the plane kernel runs the
    coarse problem (the register kernel, which these tiny coarse planes would get, sums
    in another order)."""
    monkeypatch.setattr(launch, "plan_registers", lambda *args, **kwargs: None)
    dtype, tol = {"float32": (np.float32, 2e-6), "float16": (np.float16, 2e-3)}[storage]
    b, c, h, w = shape
    x, wts, weights, problem = random_layer(rng, shape, levels, k, 1, storage, bias)
    tuning = Tuning(split=split, tile=tile, threads=threads, strip=2)
    backend = RecordingBackend()
    fine = plan_split(problem, backend.shared_limit, tuning).tiles
    assert fine.ntiles == 1
    spec = fine.spec._replace(coarse=False, inner_levels=levels - split)
    floats = spec_geometry(spec).floats
    y = np.full(shape, np.nan, dtype)
    backend.call(backend.kernel(spec), fine.grid, fine.block,
                 (x, y, *weights, h, w, c, int(bias), 1, 1), 4 * floats)
    y_split = np.full(shape, np.nan, dtype)
    run_forward(backend, problem, x, y_split, weights, tuning)
    want = reference.forward(x, wts, levels, 1)
    assert np.isfinite(y).all()
    assert np.linalg.norm(y - want) / np.linalg.norm(want) < tol
    np.testing.assert_array_equal(y, y_split)


@pytest.mark.parametrize("shape,levels,inner", [
    ((64, 96, 56, 56), 5, 3),   # ConvNeXt-T stages: one fitted 56 tile, levels 3..5 inside
    ((64, 192, 28, 28), 4, 0),  # one 32 tile: the split (faster there)
    ((64, 384, 14, 14), 3, 0),  # 2^22 pixels or more: split at 1, the coarse problem alone
    ((32, 384, 14, 14), 3, 2),  # fewer: one 16 tile, levels 2 and 3 inside
    ((32, 200, 15, 13), 3, 2),  # odd planes in the 16 tile
    ((8, 64, 512, 512), 5, 0),  # many tiles per plane: the split runs
    ((4, 8, 56, 56), 5, 0),     # too small to split: the plane kernel
])
@pytest.mark.usefixtures("without_lane_rule")  # (it takes the 14 x 14 forwards)
def test_planner_runs_inner_levels_where_one_tile_covers_the_plane(shape, levels, inner):
    problem = Problem(*shape, 5, levels, 1, "float32", True)
    plan = plan_tiles(problem, LIMIT)
    if inner:
        assert plan.spec.inner_levels == inner and plan.ntiles == 1
        assert plan.spec.levels + inner == levels and not plan.spec.coarse
        assert plan_split(problem, LIMIT) is None
        assert planned_specs(problem, False, LIMIT, 264) == [plan.spec]
        assert work_buffers(problem, False, LIMIT, 264) == ()
        assert plan.shared_bytes == 4 * spec_geometry(plan.spec).floats
        # off: the split where its own size rule takes the problem (at 14 x 14 from 2^22
        # pixels; the plane kernel below), else; forced splits and the backward split
        assert plan_tiles(problem, LIMIT, Tuning(inner=False)) is None
        off = plan_split(problem, LIMIT, Tuning(inner=False))
        assert (off is not None) == (shape[2] > 16)
        assert plan_split(problem, LIMIT, Tuning(split=2)) is not None
        assert plan_tiles(problem, LIMIT, Tuning(), True) is None
    else:
        assert plan is None or plan.spec.inner_levels == 0


def test_inner_max_pixels_bounds_the_default_only():
    """The 14 x 14 rule: from 2^22 pixels the forward splits, but Tuning(inner=True) (the
    backward's dx forward where the split's buffers do not fit) still runs the inner
    levels; below SPLIT_MIN_PIXELS the plane kernel runs."""
    stage = Problem(64, 384, 14, 14, 5, 3, 1, "float32", True)
    assert plan_tiles(stage, LIMIT) is None and plan_split(stage, LIMIT) is not None
    forced = plan_tiles(stage, LIMIT, Tuning(inner=True))
    assert (forced.spec.levels, forced.spec.inner_levels, forced.ntiles) == (1, 2, 1)
    small = stage._replace(batch=8)
    assert plan_tiles(small, LIMIT) is None and plan_split(small, LIMIT) is None


def test_small_tile_rule_caps_the_registers(monkeypatch, request):
    """SmallTileSplit.max_registers reaches the tile of the split and the inner-level tile
    (0: REGISTER_CAP); a Tuning cap still overrides it."""
    stage = Problem(32, 384, 14, 14, 5, 3, 1, "float32", True)
    assert plan_tiles(stage, LIMIT).spec.max_registers == launch.REGISTER_CAP
    rules = dict(launch.SPLIT_SMALL_TILES)
    rules[16] = rules[16]._replace(max_registers=64)
    monkeypatch.setattr(launch, "SPLIT_SMALL_TILES", rules)
    request.addfinalizer(launch.clear_plan_caches)  # no plan of the patched rule outlives it
    launch.clear_plan_caches()
    assert plan_tiles(stage, LIMIT).spec.max_registers == 64
    big = stage._replace(batch=64)
    assert plan_split(big, LIMIT).tiles.spec.max_registers == 64
    assert plan_tiles(stage, LIMIT, Tuning(max_registers=72)).spec.max_registers == 72


def test_28_rule_caps_the_registers_by_kernel_size():
    """The 28 x 28 rule's tile is capped at 120 registers up to K 5 and at 168 at K 7
    (SmallTileSplit.max_registers_k7); a Tuning cap still overrides both."""
    rule = launch.SPLIT_SMALL_TILES[32]
    assert [rule.register_cap(k) for k in (3, 5, 7, 9)] == [120, 120, 168, 168]
    assert rule._replace(max_registers_k7=0).register_cap(7) == 120
    for k, cap in ((3, 120), (5, 120), (7, 168)):
        stage = Problem(64, 192, 28, 28, k, 4, 1, "float32", True)
        assert plan_split(stage, LIMIT).tiles.spec.max_registers == cap, k
        forced = plan_split(stage, LIMIT, Tuning(max_registers=96))
        assert forced.tiles.spec.max_registers == 96, k


def test_solo_backward_tiles_are_capped_at_168_from_k9():
    """The split backward's tile of the paper grid holds so much shared memory at K 9 that
    one 256-thread block runs an SM; its cap is then TILE_SOLO_CAP_K9 (REGISTER_CAP
    spilled there). Below K 9, with other threads, where two blocks fit, forward or with a
    Tuning cap, it is not."""
    for levels in (3, 5):
        problem = Problem(8, 64, 256, 256, 9, levels, 1, "float32", True)
        tiles = plan_split(problem, LIMIT, backward=True).tiles
        assert tiles.spec.threads == launch.TILE_SOLO_THREADS, levels
        assert tiles.spec.max_registers == launch.TILE_SOLO_CAP_K9 == 168, levels
        assert plan_split(problem, LIMIT).tiles.spec.max_registers == launch.REGISTER_CAP
        for tuning in (Tuning(max_registers=128), Tuning(threads=128)):
            other = plan_split(problem, LIMIT, tuning, backward=True).tiles.spec
            assert other.max_registers == launch.REGISTER_CAP, (levels, tuning)
        for k in (5, 7):
            below = plan_split(problem._replace(kernel_size=k), LIMIT, backward=True)
            assert below.tiles.spec.max_registers == launch.REGISTER_CAP, (levels, k)
    # 256 threads asked for where two blocks fit an SM: the registers are not there
    shallow = Problem(8, 64, 256, 256, 9, 1, 1, "float32", True)
    tiles = plan_tiles(shallow, LIMIT, Tuning(tiles=True, threads=256), backward=True)
    assert 2 * tiles.shared_bytes <= LIMIT and tiles.spec.threads == 256
    assert tiles.spec.max_registers == launch.REGISTER_CAP


def test_inner_geometry_reuses_the_dead_grid():
    """At 56 x 56 (tile 56, split 2, three inner levels) only the first inner grid takes
    new space: the taps, deeper grids and subbands fit in grid 1, dead by then."""
    plain = tile_geometry(5, 2, 56, False, 128)
    geo = tile_geometry(5, 2, 56, False, 128, 3)
    inner = geo.inner
    assert inner.sizes == (14, 7, 4, 2) and inner.blocks == (11, 8, 6)
    assert geo.floats == plain.floats + 4 * 11 * 11 and inner.grids[0] == plain.floats
    start, stop = plain.grids[1], plain.z[0]
    assert start <= inner.taps and inner.z[-1] + 4 * 2 * 2 <= stop
    with pytest.raises(ValueError, match="inner levels"):
        tile_geometry(5, 0, 56, False, 128, 3)


def test_inner_geometry_of_a_split_at_one_keeps_x():
    """At 14 x 14 (tile 16, split 1, two inner levels) grid 0 holds x until the output
    phase: everything of the inner levels goes past the tile's own buffer, disjoint."""
    plain = tile_geometry(5, 1, 16, False, 32)
    geo = tile_geometry(5, 1, 16, False, 32, 2)
    inner = geo.inner
    assert inner.sizes == (8, 4, 2) and inner.blocks == (8, 6)
    regions = sorted([(inner.taps, 2 * 4 * 25)]
                     + [(g, 4 * s) for g, s in zip(inner.grids, inner.strides)]
                     + [(z, 4 * m * m) for z, m in zip(inner.z, inner.sizes[1:])])
    assert regions[0][0] == plain.floats
    for (start, size), (following, _) in zip(regions, regions[1:]):
        assert start + size <= following
    assert geo.floats == regions[-1][0] + regions[-1][1]


@pytest.mark.parametrize("spec", [TileSpec(3, "float32", 2, 8, 32, 2, inner_levels=-1),
                                  TileSpec(3, "float32", 2, 8, 32, 2, backward=True,
                                           inner_levels=1),
                                  TileSpec(3, "float32", 2, 8, 32, 2, coarse=True,
                                           inner_levels=1),
                                  TileSpec(3, "float32", 0, 8, 32, 2, inner_levels=1)])
def test_inner_levels_reject_bad_specs(spec):
    with pytest.raises(ValueError, match="inner_levels"):
        tile_kernel_source(spec)
