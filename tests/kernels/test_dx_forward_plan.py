"""Planner rules for a backward that computes ``dx`` with the forward kernels.

They run anywhere (no kernels launch): which stages take that path, in how many
batch chunks, and that the chunks' work buffers stay within the memory budget.
"""

import pytest

from wtconv_cuda.kernels import launch
from wtconv_cuda.kernels.launch import (
    DX_FORWARD_BUFFER_FRACTION, DX_FORWARD_MAX_CHUNKS, DX_INNER, DX_NO_SPLIT, ITEMSIZE, DxForward,
    Problem,
    Tuning, dx_forward_batches, dx_forward_plan, dx_from_forward, plan_split, planned_specs,
    work_buffers,
)

LIMIT, SLOTS = 227 * 1024 - 1024, 264
#: The ConvNeXt-T stages at batch 64 with the published levels (7 x 7 runs on the
#: register kernel, which has no dx path of its own to choose).
STAGES = [(64, 96, 56, 56, 5), (64, 192, 28, 28, 4), (64, 384, 14, 14, 3)]


def _held_fraction(problem, batches, forward=Tuning()):
    """float32 bytes live while dx runs, as a fraction of the bytes of x."""
    elements = problem.batch * problem.channels * problem.height * problem.width
    held = launch.dx_forward_floats(problem, batches, LIMIT, SLOTS, forward)
    return 4 * held / (elements * ITEMSIZE[problem.storage])


@pytest.mark.parametrize("storage", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("stage", STAGES)
def test_convnext_stages_take_dx_from_the_forward_within_the_budget(stage, storage):
    problem = Problem(*stage[:4], 5, stage[4], 1, storage, True)
    batches, forward = dx_forward_plan(problem, LIMIT, SLOTS)
    assert batches and sum(batches) == problem.batch
    assert len(batches) <= DX_FORWARD_MAX_CHUNKS
    assert max(batches) - min(batches) <= 1 and list(batches) == sorted(batches, reverse=True)
    assert _held_fraction(problem, batches, forward) <= DX_FORWARD_BUFFER_FRACTION
    # the fewest chunks that fit: half as many would not
    if len(batches) > 1:
        q, r = divmod(problem.batch, len(batches) // 2)
        fewer = (q + 1,) * r + (q,) * (len(batches) // 2 - r)
        assert _held_fraction(problem, fewer, forward) > DX_FORWARD_BUFFER_FRACTION
    assert dx_from_forward(problem, LIMIT, SLOTS)
    assert planned_specs(problem, True, LIMIT, SLOTS)[0].__class__.__name__ == "FlipSpec"


def test_chunks_follow_the_forward_work_buffers():
    """One chunk where the forward needs no work buffers (56 x 56 in both dtypes: its
    coarse levels run in the tiles' blocks; 14 x 14: the lane forward) or few (bfloat16
    at 28 x 28: its split pools in place, 0.14 x the bytes of x)."""
    fp32 = Problem(64, 96, 56, 56, 5, 5, 1, "float32", True)
    assert dx_forward_plan(fp32, LIMIT, SLOTS) == DxForward((64,), Tuning())
    assert dx_forward_batches(fp32._replace(storage="bfloat16"), LIMIT, SLOTS) == (64,)
    assert work_buffers(launch._dx_problem(fp32), False, LIMIT, SLOTS) == ()
    bf16 = Problem(64, 192, 28, 28, 5, 4, 1, "bfloat16", True)
    assert dx_forward_plan(bf16, LIMIT, SLOTS) == DxForward((64,), Tuning())
    assert _held_fraction(bf16, (64,)) < 0.15  # the band (0.13) and the flipped filters
    for storage in ("float32", "bfloat16"):
        stage = Problem(64, 384, 14, 14, 5, 3, 1, storage, True)
        assert dx_forward_plan(stage, LIMIT, SLOTS) == DxForward((64,), Tuning())
        specs = planned_specs(stage, True, LIMIT, SLOTS)
        assert [type(s).__name__ for s in specs] == ["FlipSpec", "LaneForwardSpec",
                                                     "LaneSpec", "FinalizeSpec"]
        assert work_buffers(launch._dx_problem(stage), False, LIMIT, SLOTS) == ()


@pytest.mark.usefixtures("without_lane_rule")
def test_inner_levels_keep_the_14x14_dx_forward_in_one_chunk():
    """Without the lane forward (off, or a batch it does not take), the 14 x 14 stage's
    split forward holds too much for a whole batch's ``dx`` (0.29 x the bytes of x in
    float32) and half a batch does not split: the tiles run the coarse levels in their
    blocks, the whole batch in one chunk with no work buffers, not two plane-kernel
    chunks."""
    for storage in ("float32", "bfloat16"):
        stage = Problem(64, 384, 14, 14, 5, 3, 1, storage, True)
        assert dx_forward_plan(stage, LIMIT, SLOTS) == DxForward((64,), DX_INNER)
        assert _held_fraction(stage, (64,)) > DX_FORWARD_BUFFER_FRACTION
        assert plan_split(launch._dx_problem(stage)._replace(batch=32), LIMIT) is None
        specs = planned_specs(stage, True, LIMIT, SLOTS)
        assert [type(s).__name__ for s in specs] == ["FlipSpec", "TileSpec", "PlaneSpec",
                                                     "FinalizeSpec"]
        assert (specs[1].levels, specs[1].inner_levels, specs[1].tile) == (1, 2, 16)
        assert work_buffers(stage, True, LIMIT, SLOTS)[1:] == (launch.plan_plane(
            stage, True, LIMIT, SLOTS).partial_floats,)
        # the forward itself still splits (faster there than its tiles alone)
        assert plan_split(stage, LIMIT) is not None


@pytest.mark.usefixtures("without_lane_rule")
def test_chunks_split_where_their_split_fits():
    """A split too large for the budget as a whole runs as smaller splits where those
    fit: twice the 14 x 14 stage's batch in float32 splits in two chunks of 64. In
    bfloat16 (twice the float32 work per byte of x) a split chunk of 64 does not fit
    and one of 32 does not split: the tiles with the coarse levels in their blocks
    take the whole batch."""
    fp32 = Problem(128, 384, 14, 14, 5, 3, 1, "float32", True)
    assert dx_forward_plan(fp32, LIMIT, SLOTS) == DxForward((64, 64), Tuning())
    assert plan_split(launch._dx_problem(fp32)._replace(batch=64), LIMIT) is not None
    assert _held_fraction(fp32, (64, 64)) <= DX_FORWARD_BUFFER_FRACTION
    assert _held_fraction(fp32, (128,)) > DX_FORWARD_BUFFER_FRACTION
    names = [type(s).__name__ for s in planned_specs(fp32, True, LIMIT, SLOTS)]
    assert names[:4] == ["FlipSpec", "CoarseSpec", "RegisterSpec", "TileSpec"]
    bf16 = fp32._replace(storage="bfloat16")
    assert dx_forward_plan(bf16, LIMIT, SLOTS) == DxForward((128,), DX_INNER)
    assert _held_fraction(bf16, (64, 64)) > DX_FORWARD_BUFFER_FRACTION
    assert plan_split(launch._dx_problem(bf16)._replace(batch=32), LIMIT) is None


def test_forced_chunks_and_the_paths_without_them():
    problem = Problem(5, 3, 33, 31, 5, 2, 1, "float32", True)
    assert dx_forward_batches(problem, LIMIT, SLOTS) == ()  # too small by default
    assert dx_forward_batches(problem, LIMIT, SLOTS, Tuning(dx_forward=True)) == (5,)
    assert dx_forward_batches(problem, LIMIT, SLOTS,
                              Tuning(dx_forward=True, dx_batch=2)) == (2, 2, 1)
    assert dx_forward_batches(problem, LIMIT, SLOTS,
                              Tuning(dx_forward=True, dx_batch=9)) == (5,)
    assert dx_forward_batches(problem, LIMIT, SLOTS, Tuning(dx_batch=2)) == ()
    large = Problem(64, 96, 56, 56, 5, 5, 1, "bfloat16", True)
    assert dx_forward_batches(large, LIMIT, SLOTS, Tuning(dx_forward=False)) == ()
    assert dx_forward_batches(large._replace(stride=2), LIMIT, SLOTS) == ()


def test_the_plane_kernel_takes_dx_where_no_tiles_do(monkeypatch, request):
    """A plane whose rule has no inner levels (28 x 28) and of whose split no chunk fits
    the budget (here made tiny) runs dx on the plane kernel."""
    problem = Problem(64, 192, 28, 28, 5, 4, 1, "bfloat16", True)
    assert launch.inner_tiles(launch._dx_problem(problem), LIMIT, DX_INNER) is None
    request.addfinalizer(launch.dx_forward_plan.cache_clear)
    monkeypatch.setattr(launch, "DX_FORWARD_BUFFER_FRACTION", 0.02)  # flipped filters: 0.008
    launch.dx_forward_plan.cache_clear()
    assert dx_forward_plan(problem, LIMIT, SLOTS) == DxForward((64,), DX_NO_SPLIT)


def test_dx_halves_to_run_beside_the_weight_gradients(monkeypatch):
    """At 28 x 28 in fp32 the one-chunk dx forward and the weight partials do not fit
    in the side-by-side budget together: with two streams the backward runs dx in two
    chunks, side by side; with one stream (or a fixed dx_batch) it keeps the planner's
    chunks. In 16 bits even two chunks do not fit (four would, but were slower): the
    parts run one after the other."""
    fp32 = Problem(64, 192, 28, 28, 5, 4, 1, "float32", True)
    monkeypatch.setattr(launch, "TWO_STREAMS", True)
    assert dx_forward_plan(fp32, LIMIT, SLOTS) == DxForward((64,), Tuning())
    assert launch.backward_dx_plan(fp32, LIMIT, SLOTS) == DxForward((32, 32), Tuning())
    assert dx_forward_batches(fp32, LIMIT, SLOTS) == (32, 32)
    assert launch.runs_side_by_side(fp32, LIMIT, SLOTS)
    fixed = Tuning(dx_forward=True, dx_batch=64)
    assert launch.backward_dx_plan(fp32, LIMIT, SLOTS, fixed).batches == (64,)
    assert not launch.runs_side_by_side(fp32, LIMIT, SLOTS, fixed)
    bf16 = fp32._replace(storage="bfloat16")
    assert launch.backward_dx_plan(bf16, LIMIT, SLOTS) == dx_forward_plan(bf16, LIMIT, SLOTS)
    assert not launch.runs_side_by_side(bf16, LIMIT, SLOTS)
    quarters = Tuning(dx_forward=True, dx_batch=16)  # fits, when forced
    assert launch.runs_side_by_side(bf16, LIMIT, SLOTS, quarters)
    stage56 = Problem(64, 96, 56, 56, 5, 5, 1, "bfloat16", True)  # fits with its one chunk
    assert launch.backward_dx_plan(stage56, LIMIT, SLOTS) == dx_forward_plan(stage56, LIMIT,
                                                                             SLOTS)
    assert launch.runs_side_by_side(stage56, LIMIT, SLOTS)
    monkeypatch.setattr(launch, "TWO_STREAMS", False)
    assert launch.backward_dx_plan(fp32, LIMIT, SLOTS) == DxForward((64,), Tuning())
    assert not launch.runs_side_by_side(fp32, LIMIT, SLOTS)


@pytest.mark.parametrize("storage", ["float32", "bfloat16"])
def test_weights_only_plane_backward_is_capped_at_168_from_k9(storage):
    """From K 9 the weights-only plane backward of the 56 x 56 and 28 x 28 stages is capped
    at PLANE_WEIGHTS_CAP_K9 (REGISTER_CAP spilled there); below K 9, where the plane kernel
    also computes dx, or with a Tuning cap, it keeps its own."""
    for stage in STAGES[:2]:
        for k, cap in ((5, launch.REGISTER_CAP), (7, launch.REGISTER_CAP), (9, 168)):
            problem = Problem(*stage[:4], k, stage[4], 1, storage, True)
            plane = launch.plan_plane(problem, True, LIMIT, SLOTS).spec
            assert plane.weights_only and plane.max_registers == cap, (stage, k)
        both = launch.plan_plane(problem, True, LIMIT, SLOTS, Tuning(dx_forward=False)).spec
        assert not both.weights_only and both.max_registers == launch.REGISTER_CAP, stage
        forced = launch.plan_plane(problem, True, LIMIT, SLOTS, Tuning(max_registers=128)).spec
        assert forced.weights_only and forced.max_registers == 128, stage
        # and the planner's backward launches it so (dx's forward kernels keep their caps)
        assert plane in planned_specs(problem, True, LIMIT, SLOTS), stage
    assert launch.PLANE_WEIGHTS_CAP_K9 == 168
