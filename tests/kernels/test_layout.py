"""The plane kernels' buffer layout: regions that never overlap, and what fits per SM."""

import pytest

from wtconv_cuda.kernels.launch import Problem, plan_plane
from wtconv_cuda.kernels.layout import (
    HEADER, LEVEL_BASE, LEVEL_FIELDS, LEVEL_STRIDE, level_shapes, plane_layout)

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
