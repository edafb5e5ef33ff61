"""The lane kernels (a plane to one or two threads) in numba's simulator.

The backward runs through the planner with the weight-gradient kernel forced (``dx``
from the forward kernels), the forward with the lane forward forced: every output
and gradient against the float64 oracle on the 14 x 14 stage's plane, odd planes
whose grids need the padded row and column, level counts up to past a 1 x 1 grid,
K 3 to 7, several channels and batch chunks, float16, with and without bias; outputs
poisoned with NaN. The layout's padding and bank rules and the planner's rules are
checked on the CPU.
"""

import os

import numpy as np
import pytest

from wtconv_cuda import reference
from wtconv_cuda.kernels import launch
from wtconv_cuda.kernels.launch import (
    LANES_FORCE_MAX_PIXELS, FinalizeSpec, LaneForwardSpec, LaneSpec, Problem, Tuning, Weights,
    lane_spec_fitted, plan_lanes, plan_lanes_forward, planned_specs, run_backward, run_forward,
    work_buffers,
)
from wtconv_cuda.kernels.lanes import (
    THREADS, lane_forward_source, lane_kernel_source, lane_layout, planes_per_block,
    shared_bytes,
)
from wtconv_cuda.kernels.registers import grids

from ._backends import RecordingBackend
from ._oracle import backward_errors, random_layer

simulator = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                               reason="needs numba's CUDA simulator")

TOLERANCE = {"float32": 1e-5, "float16": 2e-3}
LIMIT = 227 * 1024  # dynamic shared memory of a block, bytes
SLOTS = 1 << 30


def lane_backward(rng, shape, levels, k, lanes, storage="float32", bias=True, groups=None):
    """The backward with the lane kernel forced, after checking the launches and buffers
    against the planner's lists: the layer and its ``dy``, ``dx`` and gradients."""
    x, wts, weights, problem = random_layer(rng, shape, levels, k, 1, storage, bias)
    tuning = Tuning(lanes=lanes, dx_forward=True, registers=False, lane_groups=groups)
    lane_launch = plan_lanes(problem, LIMIT, SLOTS, tuning)
    assert lane_launch is not None and lane_launch.spec.groups == (groups or 1)
    dy = rng.standard_normal(shape).astype(x.dtype)
    dx = np.full(shape, np.nan, x.dtype)
    grads = Weights(*(np.full(a.shape, np.nan, x.dtype) for a in weights))
    backend = RecordingBackend(shared_limit=LIMIT, max_slots=SLOTS)
    x_before, dy_before = x.copy(), dy.copy()
    run_backward(backend, problem, x, dy, dx, weights, grads, tuning)
    assert backend.kernels == planned_specs(problem, True, LIMIT, SLOTS, tuning)
    assert backend.kernels[-2:] == [lane_launch.spec, FinalizeSpec(k, storage)]
    assert tuple(backend.requests) == work_buffers(problem, True, LIMIT, SLOTS, tuning)
    assert backend.requests[-1] == lane_launch.partial_floats
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(dy, dy_before)
    return x, wts, dy, dx, grads


def lane_backward_errors(rng, shape, levels, k, lanes, storage="float32", bias=True,
                         groups=None):
    """Relative errors of :func:`lane_backward`'s ``dx`` and every gradient."""
    x, wts, dy, dx, grads = lane_backward(rng, shape, levels, k, lanes, storage, bias, groups)
    return backward_errors(x, wts, dy, levels, 1, dx, grads, bias)


@simulator
@pytest.mark.parametrize("shape,levels,k,lanes", [
    ((16, 1, 14, 14), 3, 5, 2),   # the 14 x 14 stage's plane
    ((32, 2, 9, 6), 4, 5, 2),     # two channels of two chunks; odd grids, a 1 x 1 level
    ((32, 2, 5, 7), 3, 3, 1),     # one thread a plane; past a 1 x 1 grid
    ((16, 1, 2, 9), 0, 7, 2),     # no levels: base taps and bias only
    ((32, 1, 1, 3), 2, 3, 1),     # a single row
])
def test_lane_kernel_matches_oracle(rng, shape, levels, k, lanes):
    errors = lane_backward_errors(rng, shape, levels, k, lanes)
    bad = {n: e for n, e in errors.items() if not e < TOLERANCE["float32"]}
    assert not bad, bad


@simulator
@pytest.mark.parametrize("shape,levels,k,lanes,groups,storage", [
    ((64, 1, 7, 6), 2, 3, 2, 2, "float32"),   # two blocks of two groups; odd grids
    ((48, 2, 5, 3), 3, 3, 2, 3, "float32"),   # three groups, two channels; a 1 x 1 level
    ((64, 1, 3, 5), 1, 5, 1, 2, "float16"),   # one thread a plane
])
def test_lane_kernel_groups_match_oracle(rng, shape, levels, k, lanes, groups, storage):
    errors = lane_backward_errors(rng, shape, levels, k, lanes, storage, groups=groups)
    bad = {n: e for n, e in errors.items() if not e < TOLERANCE[storage]}
    assert not bad, bad


@simulator
def test_lane_kernel_groups_add_as_the_finalize_does(rng):
    """A block of two groups writes the sum the finalize forms of two blocks' partials
    (nothing else is summed there: one partial per channel), so the bits agree."""
    one = lane_backward(np.random.default_rng(7), (32, 2, 6, 7), 2, 3, 2)
    two = lane_backward(np.random.default_rng(7), (32, 2, 6, 7), 2, 3, 2, groups=2)
    for a, b in zip(one[3:], two[3:]):
        for u, v in zip(a if isinstance(a, Weights) else (a,), b if isinstance(b, Weights)
                        else (b,)):
            np.testing.assert_array_equal(u, v)


@simulator
@pytest.mark.parametrize("bias", [True, False])
def test_lane_kernel_float16(rng, bias):
    errors = lane_backward_errors(rng, (16, 1, 3, 11), 2, 7 if bias else 3, 2, "float16", bias)
    bad = {n: e for n, e in errors.items() if not e < TOLERANCE["float16"]}
    assert not bad, bad


def lane_forward_error(rng, shape, levels, k, lanes, storage="float32", bias=True):
    """The forward with the lane forward forced: relative error of ``y``."""
    x, wts, weights, problem = random_layer(rng, shape, levels, k, 1, storage, bias)
    tuning = Tuning(lanes_forward=lanes, registers=False)
    lane_launch = plan_lanes_forward(problem, LIMIT, tuning)
    assert lane_launch is not None and lane_launch.spec.lanes == lanes
    y = np.full(shape, np.nan, x.dtype)
    backend = RecordingBackend(shared_limit=LIMIT, max_slots=SLOTS)
    x_before = x.copy()
    run_forward(backend, problem, x, y, weights, tuning)
    assert backend.kernels == [lane_launch.spec] == planned_specs(problem, False, LIMIT, SLOTS,
                                                                  tuning)
    assert backend.requests == [] and work_buffers(problem, False, LIMIT, SLOTS, tuning) == ()
    np.testing.assert_array_equal(x, x_before)
    got = y.astype(np.float64)
    assert np.isfinite(got).all(), "unwritten (NaN) outputs"
    want = reference.forward(x.astype(np.float64), wts, levels, 1)
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@simulator
@pytest.mark.parametrize("shape,levels,k,lanes", [
    ((16, 1, 14, 14), 3, 5, 2),   # the 14 x 14 stage's plane
    ((16, 2, 9, 6), 4, 5, 2),     # two channels; odd grids; blocks past the last row
    ((32, 2, 5, 7), 3, 3, 1),     # one thread a plane; past a 1 x 1 grid
    ((32, 1, 1, 3), 2, 7, 1),     # a single row
    ((8, 1, 14, 14), 3, 5, 4),    # four threads a plane: 14 rows, 7 and 2 of coefficients
    ((16, 1, 13, 11), 4, 3, 4),   # odd grids: the last row of blocks on thread 2, then 0
    ((8, 1, 3, 5), 2, 5, 4),      # fewer rows than threads
])
def test_lane_forward_matches_oracle(rng, shape, levels, k, lanes):
    assert lane_forward_error(rng, shape, levels, k, lanes) < TOLERANCE["float32"]


@simulator
@pytest.mark.parametrize("bias", [True, False])
def test_lane_forward_float16(rng, bias):
    shape, levels = ((16, 1, 13, 11), 5) if bias else ((16, 1, 6, 10), 1)
    assert lane_forward_error(rng, shape, levels, 5 if bias else 3, 2, "float16",
                              bias) < TOLERANCE["float16"]


@simulator
def test_backward_on_both_lane_kernels(rng):
    """The forward's default rule (planes of up to 14 x 14) puts the backward's dx
    forward on the lane forward too: both lane kernels, then the finalize."""
    shape, levels, k = (16, 2, 11, 9), 3, 5  # above the register kernel's 64 pixels
    assert 11 * 9 <= launch.LANES_FORWARD_MAX_PIXELS
    x, wts, weights, problem = random_layer(rng, shape, levels, k, 1, "float32", True)
    dy = rng.standard_normal(shape).astype(x.dtype)
    dx = np.full(shape, np.nan, x.dtype)
    grads = Weights(*(np.full(a.shape, np.nan, x.dtype) for a in weights))
    backend = RecordingBackend(shared_limit=LIMIT, max_slots=SLOTS)
    tuning = Tuning(lanes=2, dx_forward=True)
    run_backward(backend, problem, x, dy, dx, weights, grads, tuning)
    kinds = [type(spec).__name__ for spec in backend.kernels]
    assert kinds == ["FlipSpec", "LaneForwardSpec", "LaneSpec", "FinalizeSpec"]
    errors = backward_errors(x, wts, dy, levels, 1, dx, grads, True)
    bad = {n: e for n, e in errors.items() if not e < TOLERANCE["float32"]}
    assert not bad, bad


def test_forward_planner_rules():
    stage = Problem(64, 384, 14, 14, 5, 3, 1, "float32", True)
    # the default rule takes 14 x 14 (timed on the H200) and nothing larger
    assert launch.LANES_FORWARD_MAX_PIXELS == 14 * 14 and launch.LANES_DEFAULT == 2
    forced = plan_lanes_forward(stage, LIMIT, Tuning(lanes_forward=2))
    assert plan_lanes_forward(stage, LIMIT) == forced
    assert plan_lanes_forward(stage._replace(height=15), LIMIT) is None
    assert plan_lanes_forward(stage._replace(height=15), LIMIT, Tuning(lanes_forward=2))
    assert forced.spec == LaneForwardSpec(5, "float32", 14, 14, 3, 2)
    assert forced.grid == 384 * 64 // 16 and forced.shared_bytes == shared_bytes(forced.spec)
    assert planned_specs(stage, False, LIMIT, SLOTS, Tuning(lanes_forward=2)) == [forced.spec]
    assert plan_lanes_forward(stage._replace(batch=40), LIMIT, Tuning(lanes_forward=2)) is None
    assert plan_lanes_forward(stage._replace(stride=2), LIMIT, Tuning(lanes_forward=2)) is None
    assert plan_lanes_forward(stage, LIMIT, Tuning(lanes_forward=0)) is None
    # the register kernel keeps tiny planes unless told otherwise
    tiny = stage._replace(height=7, width=7, levels=2)
    assert [type(s) for s in planned_specs(tiny, False, LIMIT, SLOTS,
                                           Tuning(lanes_forward=2))] != [LaneForwardSpec]


@pytest.mark.parametrize("height,width,levels", [(14, 14, 3), (7, 7, 2), (9, 6, 4), (1, 3, 2),
                                                 (13, 11, 5)])
@pytest.mark.parametrize("lanes", [1, 2])
def test_layout_reaches_every_butterfly_result(height, width, levels, lanes):
    """Every value a level's butterflies write lies in the pyramid's padded area, and a
    value of a missing row or column of grid ``j - 1`` lies outside the plane, where no
    grid element lives."""
    lay = lane_layout(LaneSpec(5, "float32", height, width, levels, lanes))
    sizes = grids(height, width, levels)
    for j in range(1, levels + 1):
        (hp, wp), (hj, wj), s = sizes[j - 1], sizes[j], 1 << (j - 1)
        for r in range(2 * hj):
            for col in range(2 * wj):
                row0, col0 = r * s, col * s
                assert row0 < lay.rows and col0 < lay.pitch
                if r >= hp or col >= wp:
                    assert row0 >= height or col0 >= width
    assert lay.dy >= lay.rows * lay.pitch and lay.slot >= lay.dy + lay.rows * lay.pitch


def banks(addresses) -> int:
    """Wavefronts of one warp's 32-bit shared loads: the most distinct words on a bank."""
    words = {}
    for a in set(addresses):
        words.setdefault(a % 32, set()).add(a)
    return max(len(v) for v in words.values())


@pytest.mark.parametrize("height,width,levels", [(14, 14, 3), (7, 7, 2), (13, 11, 5)])
def test_two_lanes_read_32_banks(height, width, levels):
    """With two threads a plane, a warp's reads hit 32 banks where the halves are an odd
    distance apart (rows, the two pyramids, level 1's subband columns); with one, the
    32 slots do."""
    lay = lane_layout(LaneSpec(5, "float32", height, width, levels, 2))
    assert lay.slot % 32 == 2 and lay.pitch % 2 == 1 and lay.dy % 2 == 1
    for offset in (lay.pitch, lay.dy, 1):  # what separates the halves' addresses
        for const in (0, 7, lay.pitch + 3):
            assert banks([(t >> 1) * lay.slot + (t & 1) * offset + const
                          for t in range(THREADS)]) == 1
    one = lane_layout(LaneSpec(5, "float32", height, width, levels, 1))
    assert banks([t * one.slot + 5 for t in range(THREADS)]) == 1


@pytest.mark.parametrize("height,width,levels", [(14, 14, 3), (7, 7, 2), (13, 11, 5)])
def test_four_lanes_read_32_banks_on_the_base_rows(height, width, levels):
    """Four threads a plane (the forward): 8 slots 4 mod 32 apart, the threads' rows an
    odd pitch apart, so a warp's base-convolution reads (and its stores to ``y``) hit
    32 banks; the levels' rows of coefficients, an even distance apart, two-way and
    more."""
    lay = lane_layout(LaneForwardSpec(5, "float32", height, width, levels, 4))
    assert lay.slot % 32 == 4 and lay.pitch % 2 == 1
    for const in (0, 7, lay.dy + 3):
        assert banks([(t >> 2) * lay.slot + (t & 3) * lay.pitch + const
                      for t in range(THREADS)]) == 1
    assert banks([(t >> 2) * lay.slot + (t & 3) * 2 * lay.pitch for t in range(THREADS)]) == 2


def test_tap_batch_fits_a_seventh_block():
    """At the 14 x 14 stage a 26-tap tile lets seven one-warp blocks share an H200
    multiprocessor (228 KB, 1 KB reserved per block); 27 or more taps fit six."""
    spec = lane_spec_fitted(LaneSpec(5, "float32", 14, 14, 3, 2))
    assert spec.tap_batch == 26
    capacity = 228 * 1024
    assert capacity // (shared_bytes(spec) + 1024) == 7
    assert capacity // (shared_bytes(spec._replace(tap_batch=27)) + 1024) == 6
    # the H200's backend limit (opt-in 227 KB less 1 KB of static allowance) takes it
    stage = Problem(64, 384, 14, 14, 5, 3, 1, "float32", True)
    assert plan_lanes(stage, 227 * 1024 - 1024, SLOTS, Tuning(lanes=2)).spec == spec


def test_planner_rules():
    stage = Problem(64, 384, 14, 14, 5, 3, 1, "float32", True)
    forced = plan_lanes(stage, LIMIT, SLOTS, Tuning(lanes=2))
    assert forced.spec.lanes == 2 and forced.grid == 384 * 64 // planes_per_block(forced.spec)
    assert forced.partial_floats == forced.grid * forced.ntaps == forced.grid * 326
    assert list(forced.finalize_dims) == [64, 384, 3, 1, 4]
    specs = planned_specs(stage, True, LIMIT, SLOTS, Tuning(lanes=2))
    assert specs[-2:] == [forced.spec, FinalizeSpec(5, "float32")]
    # batches that do not fill the blocks, stride 2, large planes, lanes 0
    assert plan_lanes(stage._replace(batch=40), LIMIT, SLOTS, Tuning(lanes=2)) is None
    assert plan_lanes(stage._replace(batch=48), LIMIT, SLOTS, Tuning(lanes=1)) is None
    assert plan_lanes(stage._replace(stride=2), LIMIT, SLOTS, Tuning(lanes=2)) is None
    big = stage._replace(height=33, width=33)
    assert 33 * 33 > LANES_FORCE_MAX_PIXELS
    assert plan_lanes(big, LIMIT, SLOTS, Tuning(lanes=2)) is None
    assert plan_lanes(stage, LIMIT, SLOTS, Tuning(lanes=0)) is None
    # no dx from the forward kernels (the one-kernel backward): no lane kernel
    assert plan_lanes(stage, LIMIT, SLOTS, Tuning(lanes=2, dx_forward=False)) is None
    # the default rule takes 14 x 14 (timed on the H200) and nothing larger
    assert launch.LANES_MAX_PIXELS == 14 * 14
    assert plan_lanes(stage, LIMIT, SLOTS).spec == forced.spec
    # ... with partials within PARTIAL_FRACTION of x: two threads a plane's are 0.10 x
    # in float32 (one group), 0.21 x in 16-bit storage with one group, 0.10 x with two
    x_bytes = 64 * 384 * 14 * 14 * 4
    assert forced.partial_floats * 4 <= launch.PARTIAL_FRACTION * x_bytes
    assert forced.spec.groups == 1
    for storage in ("bfloat16", "float16"):
        half = stage._replace(storage=storage)
        two = plan_lanes(half, LIMIT, SLOTS, Tuning(lanes=2))  # forced: taken as asked
        assert two.spec.groups == 1
        assert two.partial_floats * 4 > launch.PARTIAL_FRACTION * x_bytes / 2
        default = plan_lanes(half, LIMIT, SLOTS)
        assert (default.spec.lanes, default.spec.groups) == (2, 2)
        assert default.partial_floats * 4 <= launch.PARTIAL_FRACTION * x_bytes / 2
        # a batch two groups of 16 planes cannot fill: one thread a plane's 32 planes
        # cannot either, so the plane kernel
        assert plan_lanes(half._replace(batch=48), LIMIT, SLOTS) is None
        assert plan_lanes(half._replace(batch=48), LIMIT, SLOTS, Tuning(lanes=2)) is not None
    assert plan_lanes(stage._replace(height=15), LIMIT, SLOTS) is None
    assert plan_lanes(stage._replace(height=28, width=28), LIMIT, SLOTS) is None
    assert plan_lanes(stage, LIMIT, SLOTS, Tuning(lanes=0)) is None


def test_planner_rules_with_one_group(monkeypatch):
    """With at most one group of planes a block, 16-bit 14 x 14 planes fall back to one
    thread a plane (partials 0.10 x the bytes of ``x``, as c3f0885 measured)."""
    monkeypatch.setattr(launch, "LANE_GROUPS_MAX", 1)
    launch.clear_plan_caches()
    try:
        for storage in ("bfloat16", "float16"):
            half = Problem(64, 384, 14, 14, 5, 3, 1, storage, True)
            one = plan_lanes(half, LIMIT, SLOTS)
            assert (one.spec.lanes, one.spec.groups) == (1, 1)
            assert one.partial_floats * 4 <= launch.PARTIAL_FRACTION * 64 * 384 * 14 * 14 * 2
    finally:
        launch.clear_plan_caches()


@pytest.mark.parametrize("levels", [1, 4])
def test_no_branch_per_tap(levels):
    """The only conditional expressions guard the last chunk of the staged planes: a
    conditional per level tap (400 at L 4) made numba's recursive walk of the
    control-flow graph overflow the stack (13 x 11, K 5)."""
    spec = LaneSpec(5, "float32", 13, 11, levels, 2)
    source = lane_kernel_source(spec)
    assert source.count(" else fz") == 2 * planes_per_block(spec)  # x and dy, per plane


def test_source_checks_its_spec():
    with pytest.raises(ValueError, match="lanes"):
        lane_kernel_source(LaneSpec(5, "float32", 14, 14, 3, 4))  # four: the forward only
    with pytest.raises(ValueError, match="lanes"):
        lane_forward_source(LaneForwardSpec(5, "float32", 14, 14, 3, 3))
    with pytest.raises(ValueError, match="odd"):
        lane_kernel_source(LaneSpec(4, "float32", 14, 14, 3, 2))
    with pytest.raises(ValueError, match="tap_batch"):
        lane_kernel_source(LaneSpec(5, "float32", 14, 14, 3, 2, tap_batch=33))
    with pytest.raises(ValueError, match="groups"):
        lane_kernel_source(LaneSpec(5, "float32", 14, 14, 3, 2, groups=0))


def test_groups_planner_rules():
    """``Tuning(lane_groups=n)``: n groups of planes a block, n times fewer blocks and
    partials, where the batch fills them; the default stays one group."""
    stage = Problem(64, 384, 14, 14, 5, 3, 1, "bfloat16", True)
    x_bytes = 64 * 384 * 14 * 14 * 2
    two = plan_lanes(stage, LIMIT, SLOTS, Tuning(lanes=2))
    paired = plan_lanes(stage, LIMIT, SLOTS, Tuning(lanes=2, lane_groups=2))
    assert paired.spec == two.spec._replace(groups=2)
    assert paired.grid * 2 == two.grid and paired.partial_floats * 2 == two.partial_floats
    assert list(paired.finalize_dims) == [64, 384, 3, 1, 2]
    # the default rule, and the default rule under two groups forced: two threads a
    # plane, within PARTIAL_FRACTION
    for tuning in (Tuning(), Tuning(lane_groups=2)):
        default = plan_lanes(stage, LIMIT, SLOTS, tuning)
        assert (default.spec, default.grid) == (paired.spec, paired.grid)
    assert paired.partial_floats * 4 <= launch.PARTIAL_FRACTION * x_bytes
    # float32: one group keeps two threads a plane within it
    assert plan_lanes(stage._replace(storage="float32"), LIMIT, SLOTS).spec.groups == 1
    # a batch that does not fill two groups of 16 planes
    assert plan_lanes(stage._replace(batch=48), LIMIT, SLOTS,
                      Tuning(lanes=2, lane_groups=2)) is None
    assert work_buffers(stage, True, LIMIT, SLOTS, Tuning(lanes=2, lane_groups=2))[-1] \
        == paired.partial_floats


@pytest.mark.parametrize("source", [
    lane_kernel_source(LaneSpec(5, "float32", 14, 14, 3, 2)),
    lane_forward_source(LaneForwardSpec(5, "float32", 14, 14, 3, 2)),
], ids=["weights", "forward"])
def test_hot_loops_address_shared_memory_by_constants(source):
    """Inside the correlations, convolutions and butterflies every shared-memory index
    is a row base plus a constant: no division, no modulo, no per-element index
    arithmetic (up to the forward's final store, which reuses the staging offsets)."""
    body = source.split("cuda.syncwarp()", 1)[1]  # after the planes are staged
    body = body.rsplit("cuda.syncwarp()", 1)[0] if "wtconv_lanes_forward" in source else body
    for line in body.splitlines():
        line = line.strip()
        assert "//" not in line and "%" not in line, line
        if "S[" in line:
            index = line.split("S[", 1)[1].split("]", 1)[0]
            base, *offset = index.split(" ")
            assert base in ("gr", "ur", "yr", "tr0", "tile_in", "tile_out"), line
            assert offset == [] or offset[0] in "+-" and offset[1].isdigit(), line
