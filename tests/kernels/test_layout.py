"""The plane kernels' buffer layout: regions that never overlap, and what fits per SM."""

import pytest

from wtconv_cuda.kernels.launch import Problem, plan_plane
from wtconv_cuda.kernels.layout import (
    HEADER, LEVEL_BASE, LEVEL_FIELDS, LEVEL_STRIDE, PHASE_OVERHEAD, ROW_OVERHEAD, LevelTapPlan,
    level_shapes, level_tap_plan, plane_layout, row_chunks)

#: Shared memory of one H200 SM, and what the hardware keeps back per block.
SM_SHARED_BYTES = 228 * 1024
BLOCK_RESERVED_BYTES = 1024


def _level(geo, j, field):
    return int(geo[LEVEL_BASE + LEVEL_STRIDE * j + LEVEL_FIELDS.index(field)])


def _weights_only_regions(h, w, levels, k, strip, threads):
    """(name, start, stop) of every region of a weights_only slot, in float32 elements."""
    lay = plane_layout(h, w, levels, k, strip, threads, 1, 1, True, True)
    geo = lay.geo
    a_off, a_len = int(geo[HEADER["a_off"]]), int(geo[HEADER["a_len"]])
    regions = [("x pyramid", a_off, a_off + a_len)]
    for j, (hj, wj) in enumerate(level_shapes(h, w, levels)[:max(levels, 1)]):
        start, pitch = _level(geo, j, "gsrc"), _level(geo, j, "gpitch")
        phase = _level(geo, j, "gphase")
        assert pitch % 2 == 1 and pitch >= -(-wj // 2)  # odd pitch holds a phase row
        assert phase >= -(-hj // 2) * pitch  # a phase plane holds its rows
        regions.append((f"dy grid {j}", start, start + 4 * phase))
    p_off, w_off = int(geo[HEADER["p_off"]]), int(geo[HEADER["w_off"]])
    regions += [("partials", p_off, w_off), ("unit sums", w_off, w_off + lay.ntaps)]
    return lay, regions


@pytest.mark.parametrize("h,w,levels,k,strip,threads", [
    (56, 56, 5, 5, 4, 128), (28, 28, 4, 5, 2, 64), (9, 7, 3, 3, 1, 32), (17, 23, 0, 7, 2, 64),
    (6, 5, 1, 9, 1, 16)])
def test_weights_only_regions_are_disjoint_and_inside_the_slot(h, w, levels, k, strip, threads):
    """x pyramid, dy grids, partial sums and unit sums each have their own floats; the
    x pyramid is region A itself (xshift 0) and there are no folded weights."""
    lay, regions = _weights_only_regions(h, w, levels, k, strip, threads)
    assert regions[0][1] == 0
    assert int(lay.geo[HEADER["xb_off"]]) == int(lay.geo[HEADER["a_off"]])
    for (name, start, stop), (next_name, next_start, _) in zip(regions, regions[1:]):
        assert start < stop <= next_start, (name, next_name)
    assert regions[-1][2] <= lay.slot_floats


def test_dy_grids_repeat_region_a_outside_weights_only():
    """The one-kernel backward and the forward read dy (or their input) from region A."""
    for backward in (False, True):
        geo = plane_layout(17, 23, 3, 5, 2, 64, 1, 1, backward).geo
        for j in range(3):
            for own, grad in (("src", "gsrc"), ("pitch", "gpitch"), ("phase", "gphase")):
                assert _level(geo, j, grad) == _level(geo, j, own)


def test_weights_only_needs_a_backward_layout():
    with pytest.raises(ValueError, match="backward"):
        plane_layout(8, 8, 1, 3, 1, 32, 1, 1, False, True)


def test_weights_only_56x56_plane_fits_four_blocks_per_sm():
    """ConvNeXt-T's 56 x 56 stage (L 5, K 5): the weights-only backward's 128-thread block
    fits four times in an H200 SM's shared memory (three with the one-kernel layout),
    which its registers (at most 128 per thread) allow too."""
    problem = Problem(64, 96, 56, 56, 5, 5, 1, "float32", True)
    launch = plan_plane(problem, True, 227 * 1024, 4096)
    assert launch.spec.weights_only and launch.block == 128
    assert 4 * (launch.shared_bytes + BLOCK_RESERVED_BYTES) <= SM_SHARED_BYTES
    assert 4 * launch.block * launch.spec.max_registers <= 65536


def _sequential_cost(shapes, k, threads):
    """The level taps one level at a time, one item per thread: the plan's worst case."""
    cost = 0
    for hj, wj in shapes[1:]:
        rows = -(-hj // row_chunks(hj, k, threads))
        cost += rows * (wj + ROW_OVERHEAD) + PHASE_OVERHEAD
    return cost


def _plan_cost(shapes, plan):
    cost, j = 0, 1
    while j < len(shapes):
        last = plan.phase_last[j - 1]
        cost += PHASE_OVERHEAD + max(
            -(-shapes[i][0] // plan.chunks[i - 1]) * (shapes[i][1] + ROW_OVERHEAD)
            for i in range(j, last + 1))
        j = last + 1
    return cost


def test_level_taps_of_the_56x56_stage_run_in_one_phase():
    """ConvNeXt-T 56 x 56, L 5, K 5, 128 threads: every level at once, two rows of level 1
    per item (its longest), 115 of the 125 items level 1 alone used to take."""
    plan = level_tap_plan(tuple(level_shapes(56, 56, 5)), 5, 128)
    assert plan == LevelTapPlan((14, 5, 2, 1, 1), (5, 5, 5, 5, 5), 115)
    geo = plane_layout(56, 56, 5, 5, 4, 128, 1, 1, True, True).geo
    assert [_level(geo, j, "item0") for j in range(6)] == [0, 0, 70, 95, 105, 110]
    assert [_level(geo, j, "chunks") for j in range(6)] == [0, 14, 5, 2, 1, 1]
    assert [_level(geo, j, "phase_last") for j in range(6)] == [0, 5, 5, 5, 5, 5]


@pytest.mark.parametrize("k", [1, 3, 5, 7, 9])
@pytest.mark.parametrize("threads", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("h,w,levels", [(56, 56, 5), (28, 28, 4), (14, 14, 3), (7, 7, 2),
                                        (17, 23, 6), (3, 2, 4), (255, 257, 3), (1, 1, 2)])
def test_level_tap_plan_fits_and_never_loses_to_one_level_at_a_time(h, w, levels, k, threads):
    """Phases of consecutive levels, each a list of at most one item per thread whose
    partial sums fit the slot, item0 counting on within a phase; by the plan's cost count
    never longer than running the levels one by one."""
    shapes = level_shapes(h, w, levels)
    plan = level_tap_plan(tuple(shapes), k, threads)
    assert len(plan.chunks) == len(plan.phase_last) == levels
    lay = plane_layout(h, w, levels, k, 1, threads, 1, 1, True, True)
    geo, j = lay.geo, 1
    while j <= levels:
        last = plan.phase_last[j - 1]
        assert all(plan.phase_last[i - 1] == last for i in range(j, last + 1))
        assert _level(geo, j, "item0") == 0
        for i in range(j + 1, last + 1):
            assert _level(geo, i, "item0") == _level(geo, i - 1, "item0") + k * plan.chunks[i - 2]
        items = _level(geo, last, "item0") + k * plan.chunks[last - 1]
        assert items <= min(threads, plan.items)
        assert all(1 <= plan.chunks[i - 1] <= shapes[i][0] for i in range(j, last + 1))
        j = last + 1
    p_off, w_off = int(geo[HEADER["p_off"]]), int(geo[HEADER["w_off"]])
    assert p_off + plan.items * 4 * k <= w_off
    assert _plan_cost(shapes, plan) <= _sequential_cost(shapes, k, threads)
