"""The weights-only plane kernel's register-blocked correlations (``PlaneSpec.blocked``).

Plans are checked on the host; the kernel runs in numba's CUDA simulator against the
float64 oracle (outputs poisoned), on odd planes whose grids have padding, with
several planes a work unit (the padding the butterflies overwrite must be zero again
for the next plane), folded and sliced reductions, and fused and separate finalizes.
"""

import os

import pytest

from wtconv_cuda.kernels import weight_blocks
from wtconv_cuda.kernels.codegen import PlaneSpec, plane_kernel_source
from wtconv_cuda.kernels.launch import Problem, Tuning, plan_plane
from wtconv_cuda.kernels.layout import HEADER, plane_layout
from wtconv_cuda.kernels.weight_blocks import BlockPhase, BlockRun, blocked_plan, spec_plan

from ._backends import RecordingBackend

SHARED = 227 * 1024 - 1024


def _plan(shape, levels, k, tuning=Tuning()):
    problem = Problem(*shape, k, levels, 1, "float32", True)
    return plan_plane(problem, True, SHARED, 264,
                      tuning._replace(blocked_weights=True, dx_forward=True, lanes=0))


def test_the_56_stage_plan():
    """64 x 96 x 56 x 56, L 5, K 5: base blocks of 2 x 14 pixels and level-1 blocks of
    1 x 28 coefficients, one column of 28 blocks a warp (28 lanes: every load of a warp
    meets 28 banks), levels 2-5 side by side; the slot's size, and so the four blocks
    per multiprocessor, stay those of the default correlations."""
    launch = _plan((64, 96, 56, 56), 5, 5)
    assert launch.spec.blocked
    plan = spec_plan(launch.spec)
    assert plan.phases == (
        BlockPhase((BlockRun(0, 2, 14, 56, 56),), 28, True, 4, 27),
        BlockPhase((BlockRun(1, 1, 28, 28, 28),), 28, True, 1, 25),
        BlockPhase((BlockRun(2, 2, 7, 14, 14), BlockRun(3, 1, 7, 7, 7), BlockRun(4, 1, 4, 4, 4),
                    BlockRun(5, 1, 2, 2, 2)), 28, True, 1, 25))
    assert [phase.items for phase in plan.phases] == [112, 112, 108]
    default = plan_plane(Problem(64, 96, 56, 56, 5, 5, 1, "float32", True), True, SHARED, 264)
    assert launch.shared_bytes == default.shared_bytes == 56000


def test_the_cost_model_sees_bank_conflicts():
    """At 56 x 56 the base blocks' loads meet 28 banks with a column of blocks a warp, and
    two ways (a second column's lanes) with 32 lanes; level 1's 2 x 14 blocks step two
    rows (an even pitch) between lanes and meet at least two ways either way."""
    layout = plane_layout(56, 56, 5, 5, 4, 128, 1, 1, True, True)
    grids = weight_blocks.grids_of(layout.geo, 5)
    base = (BlockRun(0, 2, 14, 56, 56),)
    issue = sum(weight_blocks._block_counts(5, 2, 14, True))
    assert weight_blocks.phase_cost(base, 28, 5, grids) == issue
    assert weight_blocks.phase_cost(base, 32, 5, grids) > issue
    rows1 = weight_blocks.phase_cost((BlockRun(1, 1, 28, 28, 28),), 28, 5, grids)
    rows2 = weight_blocks.phase_cost((BlockRun(1, 2, 14, 28, 28),), 28, 5, grids)
    assert rows1 < rows2


@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("h,w,levels", [(56, 56, 5), (28, 28, 4), (17, 23, 5), (9, 7, 2),
                                        (1, 7, 2), (55, 57, 5)])
@pytest.mark.parametrize("threads", [32, 64, 128])
def test_plans_keep_one_block_per_thread(h, w, levels, k, threads):
    """Every phase has at most one block per thread, every block fits the register budget,
    and the blocks of a run cover its plane."""
    plan = blocked_plan(h, w, levels, k, 2, threads)
    if plan is None:  # K 7's 49 sums leave small blocks: too many for 32 or 64 threads
        assert k == 7 or threads == 32
        return
    shapes = [(h, w)] + [(-(-h // 2 ** j), -(-w // 2 ** j)) for j in range(1, levels + 1)]
    assert [r.level for phase in plan.phases for r in phase.runs] == list(range(levels + 1))
    for phase in plan.phases:
        assert phase.threads <= threads and phase.width % 2 == 1
        for run in phase.runs:
            assert (run.height, run.width) == shapes[run.level]
            assert weight_blocks._fits(k, run.rows, run.cols)
            assert run.level or (run.rows == 2 and run.cols % 2 == 0)
            covered = {(bi, bj): run.shape(bi, bj) for u in range(run.blocks)
                       for _, bi, bj in [run.decode(u)]}
            assert sum(r * c for r, c in covered.values()) == run.height * run.width


def test_no_plan_where_the_sums_do_not_fit():
    """K 9 has 81 tap sums: more than a block's register budget; the planner keeps the
    default correlations."""
    assert blocked_plan(28, 28, 4, 9, 2, 128) is None
    assert not _plan((2, 4, 28, 28), 4, 9).spec.blocked


def test_layout_grows_only_where_the_phases_need_it():
    """At 17 x 23 on 32 threads the default region is smaller than a phase's slots; the
    blocked layout takes what the plan says, the default one is unchanged."""
    base = plane_layout(17, 23, 5, 5, 2, 32, 1, 1, True, True)
    grown = plane_layout(17, 23, 5, 5, 2, 32, 1, 1, True, True, True)
    region = int(base.geo[HEADER["w_off"]] - base.geo[HEADER["p_off"]])
    plan = blocked_plan(17, 23, 5, 5, 2, 32)
    assert int(grown.geo[HEADER["w_off"]] - grown.geo[HEADER["p_off"]]) == max(
        region, plan.partial_floats)
    with pytest.raises(ValueError, match="weights_only"):
        plane_layout(17, 23, 5, 5, 2, 32, 1, 1, True, False, True)


def test_blocked_needs_a_compiled_plane():
    spec = PlaneSpec(5, "float32", backward=True, weights_only=True, blocked=True)
    with pytest.raises(ValueError, match="blocked"):
        plane_kernel_source(spec)


def test_repr_leaves_out_blocked_false():
    """Variants without the field keep their names (and their PTX cache keys)."""
    spec = PlaneSpec(5, "float32", backward=True, weights_only=True, plane=(9, 7, 2))
    assert "blocked" not in repr(spec)
    assert repr(spec._replace(blocked=True)).endswith("plane=(9, 7, 2), blocked=True)")


SIMULATED = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                               reason="needs numba's CUDA simulator")


@SIMULATED
@pytest.mark.parametrize("shape,levels,k,tuning,storage", [
    # odd sizes (padding in grids 0 and 1), K 3, two planes a unit
    ((3, 2, 9, 7), 2, 3, Tuning(threads=32, batch_chunk=3), "float32"),
    # five levels on 32 threads: folded and sliced reductions, levels 2-5 in one phase
    ((2, 2, 17, 23), 5, 5, Tuning(threads=32, batch_chunk=2), "float32"),
    # two planes a block (64 threads each), partials and a separate finalize
    ((4, 2, 12, 10), 3, 5, Tuning(threads=64, batch_chunk=2, fuse_finalize=False), "float32"),
    # the 56 x 56 stage's own plan (test_the_56_stage_plan), two planes a unit
    ((2, 1, 56, 56), 5, 5, Tuning(batch_chunk=2), "float32"),
    # 16-thread planes, several a warp (warp barriers)
    ((4, 2, 7, 6), 2, 3, Tuning(threads=16, batch_chunk=2), "float32"),
    # K 7 (4-column base blocks), 16-bit storage
    ((2, 1, 11, 9), 2, 7, Tuning(threads=32, batch_chunk=2), "float16"),
])
def test_blocked_weights_match_oracle(rng, shape, levels, k, tuning, storage):
    from .test_simulator import DTYPES, assert_close, run_layer
    tuning = tuning._replace(blocked_weights=True, dx_forward=True, lanes=0)
    assert _plan(shape, levels, k, tuning).spec.blocked
    backend = RecordingBackend()
    errors = run_layer(rng, shape, levels, k, 1, storage, tuning=tuning, backend=backend)
    assert any(getattr(s, "blocked", False) for s in backend.kernels)
    assert_close(errors, DTYPES[storage][1])


@SIMULATED
def test_blocked_weights_in_global_scratch(rng):
    """Slots in global scratch (no shared memory), two persistent blocks walking the
    units: the same code on ``scratch`` instead of shared memory."""
    from .test_simulator import DTYPES, assert_close, run_layer
    tuning = Tuning(threads=32, batch_chunk=1, blocked_weights=True, dx_forward=True, lanes=0)
    backend = RecordingBackend(shared_limit=0)
    errors = run_layer(rng, (3, 2, 9, 7), 2, 3, 1, tuning=tuning, backend=backend)
    assert [s.scratch for s in backend.kernels if getattr(s, "blocked", False)] == [True]
    assert_close(errors, DTYPES["float32"][1])


def _non_finite_x_cases():
    from ..reliability.test_numerics import X_CASES
    return [case for case in X_CASES if case.values[3] == 1]


@SIMULATED
@pytest.mark.parametrize("hw,k,levels,stride,pixel,value", _non_finite_x_cases())
def test_non_finite_x_reaches_the_taps_the_oracle_says(hw, k, levels, stride, pixel, value):
    """A non-finite ``x`` pixel makes exactly the oracle's weight gradients non-finite: a
    block cut at the plane's edge multiplies no ``x`` with the zeros past it (0 * Inf)."""
    from wtconv_cuda import reference

    from ..reliability.helpers import assert_same_nonfinite, sim_backward
    from ..reliability.test_numerics import make_inputs
    x, w, dy = make_inputs(6, (2, 2, *hw), k, levels, stride)
    x[0, 1][pixel] = value
    tuning = Tuning(threads=32, blocked_weights=True, dx_forward=True, lanes=0)
    assert _plan((2, 2, *hw), levels, k, tuning).spec.blocked
    _, dw = sim_backward(x, w, dy, levels, stride, tuning=tuning)
    _, dw_ref = reference.backward(x, w, dy, levels, stride)
    assert_same_nonfinite(dw, dw_ref)
