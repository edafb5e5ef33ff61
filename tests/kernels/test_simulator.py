"""The generated kernels in numba's CUDA simulator against the float64 oracle.

The simulator executes the exact Python source that is compiled for the GPU,
through the same launch planner (:mod:`wtconv_cuda.kernels.launch`), on tiny
odd-sized planes. Outputs are poisoned with NaN before each launch.
"""

import os

import numpy as np
import pytest

from wtconv_cuda import reference
from wtconv_cuda.kernels.codegen import single_items_win
from wtconv_cuda.kernels.launch import (
    TILE_SOLO_THREADS, TILE_THREADS, Problem, SimulatorBackend, Tuning, Weights, plan_plane,
    plan_tiles, run_backward, run_forward, work_buffers,
)
from wtconv_cuda.kernels.layout import HEADER, LevelTapPlan, level_shapes, level_tap_plan
from wtconv_cuda.kernels.tiles import analysis_plan

from ..conftest import random_weights
from ._backends import RecordingBackend
from ._oracle import backward_errors

pytestmark = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                                reason="needs numba's CUDA simulator")

DTYPES = {"float32": (np.float32, 2e-6), "float16": (np.float16, 2e-3)}


def run_layer(rng, shape, levels, k, stride, storage="float32", bias=True,
              shared_limit=227 * 1024, tuning=Tuning(), backend=None):
    """Forward and backward in the simulator; returns errors against the oracle.

    The forward runs on the plane kernel (or the tiles) unless ``tuning.registers``
    says otherwise: the register kernel of tiny planes has its own tests
    (``test_registers.py``). ``backend`` (default: a new ``SimulatorBackend`` with
    ``shared_limit``) runs the kernels.
    """
    if tuning.registers is None:
        tuning = tuning._replace(registers=False)
    dtype, _ = DTYPES[storage]
    b, c, h, w = shape
    x = rng.standard_normal(shape).astype(dtype)
    wts = random_weights(rng, c, k, levels, bias=bias, dtype=dtype)
    kernel_weights = Weights(wts.base_weight,
                             wts.base_bias if bias else wts.base_scale,
                             wts.base_scale, wts.wavelet_weight, wts.wavelet_scale)
    problem = Problem(b, c, h, w, k, levels, stride, storage, bias)
    backend = backend or SimulatorBackend(shared_limit=shared_limit)
    out_shape = (b, c, -(-h // stride), -(-w // stride))
    dy = rng.standard_normal(out_shape).astype(dtype)
    x_before, dy_before = x.copy(), dy.copy()

    y = np.full(out_shape, np.nan, dtype)
    run_forward(backend, problem, x, y, kernel_weights, tuning)
    dx = np.full(shape, np.nan, dtype)
    grads = Weights(*(np.full(a.shape, np.nan, dtype) for a in kernel_weights))
    run_backward(backend, problem, x, dy, dx, kernel_weights, grads, tuning)

    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(dy, dy_before)
    y_ref = reference.forward(x, wts, levels, stride)
    assert np.isfinite(y).all(), "y: unwritten (NaN) elements"
    errors = {"y": np.linalg.norm(y.astype(np.float64) - y_ref) / np.linalg.norm(y_ref)}
    errors.update(backward_errors(x, wts, dy, levels, stride, dx, grads, bias))
    return errors


def float32_layer(rng, shape, k, levels):
    """A float32 stride-1 problem with bias, and random ``x``, ``dy`` and weights (drawn in
    that order): ``(problem, x, dy, WTConvWeights, Weights)``."""
    problem = Problem(*shape, k, levels, 1, "float32", True)
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    wts = random_weights(rng, shape[1], k, levels, dtype=np.float32)
    return problem, x, dy, wts, Weights(*wts)


def assert_close(errors, tol):
    bad = {name: err for name, err in errors.items() if not err < tol}
    assert not bad, f"relative errors above {tol}: {bad}"


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("levels", [0, 1, 2, 3])
def test_float32_matches_oracle(rng, levels, k, stride):
    assert_close(run_layer(rng, (2, 2, 9, 7), levels, k, stride), DTYPES["float32"][1])


def test_float16_matches_oracle(rng):
    assert_close(run_layer(rng, (1, 2, 7, 10), 2, 3, 1, "float16"), DTYPES["float16"][1])


def test_without_bias(rng):
    assert_close(run_layer(rng, (1, 2, 6, 5), 2, 3, 2, bias=False), DTYPES["float32"][1])


@pytest.mark.parametrize("stride,group", [(1, None), (3, None), (1, 3)])
def test_global_scratch_path(rng, stride, group):
    """Planes too large for shared memory use persistent blocks over global scratch; with
    3 planes per block, one block loops twice and adds each channel's 3 units from three
    scratch slots into its gradients."""
    tuning = Tuning(planes_per_block=group)
    if group:
        plan = plan_plane(Problem(3, 2, 7, 9, 3, 2, stride, "float32", True), True, 0, 2, tuning)
        assert (plan.grid, plan.units_per_partial, plan.spec.scratch) == (1, 3, True)
        assert plan.spec.fused_finalize  # the block's 3 units are its channel's 3
    errors = run_layer(rng, (3, 2, 7, 9), 2, 3, stride, shared_limit=0, tuning=tuning)
    assert_close(errors, DTYPES["float32"][1])


def test_deep_levels_on_tiny_plane(rng):
    """Levels past a 1x1 grid are valid (as in the published layer)."""
    assert_close(run_layer(rng, (1, 1, 3, 2), 4, 3, 1), DTYPES["float32"][1])


@pytest.mark.parametrize("dx_forward", [False, True])
def test_level_taps_in_phases(rng, dx_forward):
    """17 x 23 at L 5, K 5 on 32 threads: level 1's tap gradients alone, then levels 2-5
    side by side in one list (:func:`~wtconv_cuda.kernels.layout.level_tap_plan`), in
    the full plane backward and in the weights-only one."""
    tuning = Tuning(threads=32, dx_forward=dx_forward)
    problem = Problem(1, 2, 17, 23, 5, 5, 1, "float32", True)
    assert plan_plane(problem, True, 227 * 1024, 1, tuning).spec.weights_only == dx_forward
    plan = level_tap_plan(tuple(level_shapes(17, 23, 5)), 5, 32)
    assert plan == LevelTapPlan((5, 3, 1, 1, 1), (1, 5, 5, 5, 5), 30)
    assert_close(run_layer(rng, (1, 2, 17, 23), 5, 5, 1, tuning=tuning), DTYPES["float32"][1])


@pytest.mark.parametrize("shape,levels,k,threads,tail", [((2, 2, 9, 7), 2, 3, 32, 16),
                                                          ((2, 2, 9, 7), 2, 3, 16, 0)])
def test_weights_only_zeroes_its_slot_once(rng, nan_shared, shape, levels, k, threads, tail):
    """The weights-only kernel zeroes its slot's ``x`` pyramid and ``dy`` grids once per
    launch (``codegen._emit_zero_fill``: a constant count, ``threads`` a step, and a tail
    store where the count leaves one), then relies on their halos staying zero. With
    shared memory starting as NaN, as a GPU may leave it, its gradients still match the
    oracle; a fill that stops short by one round or skips the tail gives NaN."""
    tuning = Tuning(threads=threads, dx_forward=True)
    problem = Problem(*shape, k, levels, 1, "float32", True)
    plan = plan_plane(problem, True, 227 * 1024, 1, tuning)
    count = int(plan.geo[HEADER["p_off"]] - plan.geo[HEADER["a_off"]])
    assert plan.spec.weights_only and plan.spec.threads == threads
    assert count % threads == tail
    assert_close(run_layer(rng, shape, levels, k, 1, tuning=tuning), DTYPES["float32"][1])


@pytest.mark.parametrize("dx_forward", [False, True])
def test_kernel_wider_than_the_plane_threads(rng, dx_forward):
    """K 5 on 4-thread planes: more tap rows than threads, so threads take several
    base-tap and level-tap items in turn. (One item each, dropping the rows past the
    thread count, fails both cases; K 25 on 16 threads took 70 s in the simulator.)"""
    tuning = Tuning(threads=4, dx_forward=dx_forward)
    problem = Problem(2, 3, 11, 10, 5, 2, 1, "float32", True)
    spec = plan_plane(problem, True, 227 * 1024, 1, tuning).spec
    assert spec.threads == 4 and spec.weights_only == dx_forward
    assert_close(run_layer(rng, (2, 3, 11, 10), 2, 5, 1, tuning=tuning), DTYPES["float32"][1])


def test_both_analysis_decompositions(rng):
    """17x23 at K=3: strip items on levels 1-2, single items on level 3 (bitwise the same
    sums, but separate code)."""
    problem = Problem(1, 2, 17, 23, 3, 3, 1, "float32", True)
    spec = plan_plane(problem, False, 227 * 1024, 1).spec
    grids = [(9, 12), (5, 6), (3, 3)]
    modes = [single_items_win(h, w, 3, spec.strip, spec.threads) for h, w in grids]
    assert modes == [False, False, True]
    assert_close(run_layer(rng, (1, 2, 17, 23), 3, 3, 1), DTYPES["float32"][1])


@pytest.mark.parametrize("threads,batch_chunk,group,units_per_partial", [
    (32, 3, None, 2), (32, 5, None, 1), (64, 2, None, 1), (16, 3, None, 2), (32, 1, 5, 5)])
def test_batch_chunked_weight_gradients(rng, threads, batch_chunk, group, units_per_partial):
    """Backward work units of several batch entries: B = 5 gives a ragged last unit (rb 3, 2),
    or one unit per channel (rb 5); 32-thread planes run 8 groups per block (warp barriers),
    16-thread planes 16 (two per warp), 64-thread planes 2 (block barriers), and some groups
    are past the last unit. A block adds runs of gcd(groups, units per channel) units into
    one partial: runs of 2, of 1, and (5 groups of 5 one-plane units) of 5."""
    tuning = Tuning(threads=threads, batch_chunk=batch_chunk, planes_per_block=group,
                    fuse_finalize=False)
    problem = Problem(5, 3, 7, 9, 3, 2, 1, "float32", True)
    plan = plan_plane(problem, True, 227 * 1024, 2, tuning)
    assert plan.batch_chunk == batch_chunk and plan.units == 3 * -(-5 // batch_chunk)
    assert plan.units_per_partial == units_per_partial and not plan.spec.fused_finalize
    assert plan.partial_floats == plan.units // units_per_partial * plan.ntaps
    assert_close(run_layer(rng, (5, 3, 7, 9), 2, 3, 1, tuning=tuning), DTYPES["float32"][1])


def test_finalize_over_more_partials_than_its_unroll(rng):
    """wtconv_finalize issues FINALIZE_UNROLL partials' loads at once, then a tail: 11
    one-plane partials per channel take one unrolled round and three single ones. The sums
    are a plain loop's: a block holding a whole channel (11 groups, fused finalize), which
    adds its units one by one, gives the same bits."""
    from wtconv_cuda.kernels.codegen import FINALIZE_UNROLL
    shape, levels, k = (11, 2, 5, 4), 1, 3
    assert FINALIZE_UNROLL < shape[0] < 2 * FINALIZE_UNROLL
    problem, x, dy, wts, weights = float32_layer(rng, shape, k, levels)
    results = []
    for group in (1, shape[0]):  # one partial per plane; or a block per channel, fused
        tuning = Tuning(threads=16, planes_per_block=group, batch_chunk=1, registers=False)
        plan = plan_plane(problem, True, 227 * 1024, 2, tuning)
        assert plan.spec.fused_finalize == (group > 1)
        assert group > 1 or plan.finalize_dims[4] == shape[0]  # partials per channel
        dx = np.full(shape, np.nan, np.float32)
        grads = Weights(*(np.full(a.shape, np.nan, np.float32) for a in weights))
        run_backward(SimulatorBackend(), problem, x, dy, dx, weights, grads, tuning)
        assert_close(backward_errors(x, wts, dy, levels, 1, dx, grads, True),
                     DTYPES["float32"][1])
        results.append(grads)
    for two_launches, fused in zip(*results):
        np.testing.assert_array_equal(two_launches, fused)


@pytest.mark.parametrize("threads,batch_chunk,group,shared_limit,fused", [
    (32, 3, None, 227 * 1024, True),   # 2 units per channel, 8 groups: 4 channels a block
    (16, 5, None, 227 * 1024, True),   # 1 unit per channel, 16 groups, 3 of them valid
    (32, 1, 5, 227 * 1024, True),      # 5 one-plane units per channel, 5 groups
    (32, 2, None, 227 * 1024, False),  # 3 units per channel do not divide 8 groups
    (32, None, 5, 0, True),            # global scratch: 5 slots, one channel a pass
])
def test_fused_finalize_matches_two_launches(rng, threads, batch_chunk, group, shared_limit,
                                             fused):
    """A block that holds all of its channels' units writes their gradients itself, bit for
    bit what the partials and wtconv_finalize give; the planner fuses exactly then."""
    shape, levels, k = (5, 3, 7, 9), 2, 3
    problem, x, dy, _, weights = float32_layer(rng, shape, k, levels)
    backend = SimulatorBackend(shared_limit=shared_limit, max_slots=5)
    results = {}
    for fuse in (None, False):
        tuning = Tuning(threads=threads, batch_chunk=batch_chunk, planes_per_block=group,
                        fuse_finalize=fuse)
        plan = plan_plane(problem, True, shared_limit, 5, tuning)
        assert plan.spec.fused_finalize == (fused and fuse is None)
        assert (plan.partial_floats == 0) == plan.spec.fused_finalize
        assert (plan.finalize_dims is None) == plan.spec.fused_finalize
        dx = np.full(shape, np.nan, np.float32)
        grads = Weights(*(np.full(a.shape, np.nan, np.float32) for a in weights))
        run_backward(backend, problem, x, dy, dx, weights, grads, tuning)
        results[fuse] = (dx, *grads)
    for fused_array, two_launch_array in zip(results[None], results[False]):
        assert np.isfinite(fused_array).all()
        np.testing.assert_array_equal(fused_array, two_launch_array)


@pytest.mark.parametrize("levels,k,shared_limit,batch_chunk", [
    (0, 3, 227 * 1024, None), (2, 5, 227 * 1024, 3), (3, 3, 0, None), (3, 3, 227 * 1024, 2)])
def test_dx_from_the_forward_kernels(rng, levels, k, shared_limit, batch_chunk):
    """A stride-1 backward with dx from the forward kernels runs wtconv_flip, the forward on
    dy and the weights-only plane kernel; its weight gradients are bit for bit the full
    plane kernel's (same pyramids, same sums) and both match the oracle. (Problems this
    small take the full plane kernel by default.) Work units of several planes run them
    in one slot, one after the other: what one plane leaves there (its pyramids, the odd
    grids' zero padding read as halo) must not reach the next."""
    shape = (3, 2, 9, 7)
    problem, x, dy, wts, weights = float32_layer(rng, shape, k, levels)
    results = {}
    assert not plan_plane(problem, True, shared_limit, 2).spec.weights_only
    for dx_forward in (True, False):
        tuning = Tuning(dx_forward=dx_forward, batch_chunk=batch_chunk)
        backend = RecordingBackend(shared_limit=shared_limit)
        dx = np.full(shape, np.nan, np.float32)
        grads = Weights(*(np.full(a.shape, np.nan, np.float32) for a in weights))
        run_backward(backend, problem, x, dy, dx, weights, grads, tuning)
        names = [type(spec).__name__ for spec in backend.kernels]
        planes = [spec for spec in backend.kernels if type(spec).__name__ == "PlaneSpec"
                  and spec.backward]
        assert [spec.weights_only for spec in planes] == [dx_forward]
        assert ("FlipSpec" in names) == dx_forward
        errors = backward_errors(x, wts, dy, levels, 1, dx, grads, True)
        assert_close(errors, DTYPES["float32"][1])
        results[dx_forward] = grads
    for new, old in zip(results[True], results[False]):
        np.testing.assert_array_equal(new, old)


@pytest.mark.parametrize("shared_limit", [227 * 1024, 0])
def test_dx_forward_in_batch_chunks(rng, shared_limit):
    """dx from the forward kernels run over batch chunks (2, 2, 1) is bit for bit the
    one-run result, and both match the oracle; each chunk's forward writes only its
    own batch entries (the output is poisoned first). With no shared memory the
    forward works in global scratch, one buffer per chunk."""
    shape, levels, k = (5, 2, 9, 7), 2, 3
    problem, x, dy, wts, weights = float32_layer(rng, shape, k, levels)
    results = []
    for dx_batch, runs in ((None, 1), (2, 3)):
        backend = RecordingBackend(shared_limit=shared_limit)
        dx = np.full(shape, np.nan, np.float32)
        grads = Weights(*(np.full(a.shape, np.nan, np.float32) for a in weights))
        run_backward(backend, problem, x, dy, dx, weights, grads,
                     Tuning(dx_forward=True, dx_batch=dx_batch))
        forwards = [spec for spec in backend.kernels if getattr(spec, "backward", True) is False]
        assert len(forwards) == runs  # the register kernel, or the plane kernel in scratch
        assert_close(backward_errors(x, wts, dy, levels, 1, dx, grads, True),
                     DTYPES["float32"][1])
        results.append((dx, *grads))
    for chunked, whole in zip(results[1], results[0]):
        np.testing.assert_array_equal(chunked, whole)


@pytest.mark.parametrize("shared_limit,dx_forward,dx_batch", [
    (227 * 1024, None, None), (0, None, None), (227 * 1024, True, None), (0, True, 1)])
def test_work_buffers_match_requests(rng, shared_limit, dx_forward, dx_batch):
    """Bindings size their buffers with work_buffers(); it must match what runs ask for."""
    from wtconv_cuda.kernels.launch import work_buffers
    shape, levels, k = (2, 2, 7, 9), 2, 3
    backend = RecordingBackend(shared_limit=shared_limit)
    problem = Problem(*shape, k, levels, 1, "float32", True)
    x = rng.standard_normal(shape).astype(np.float32)
    wts = random_weights(rng, 2, k, levels, dtype=np.float32)
    weights = Weights(*wts)
    run_forward(backend, problem, x, np.empty_like(x), weights)
    assert tuple(backend.requests) == work_buffers(problem, False, shared_limit, backend.max_slots)
    backend.requests.clear()
    grads = Weights(*(np.empty_like(a) for a in weights))
    tuning = Tuning(dx_forward=dx_forward, dx_batch=dx_batch)
    run_backward(backend, problem, x, x.copy(), np.empty_like(x), weights, grads, tuning)
    assert tuple(backend.requests) == work_buffers(problem, True, shared_limit, backend.max_slots,
                                                   tuning)


@pytest.mark.parametrize("shape,levels,k,stride", [((3, 2, 7, 7), 2, 3, 1), ((2, 3, 9, 6), 1, 5, 2)])
def test_two_planes_per_warp(rng, shape, levels, k, stride):
    """16-thread planes, two per warp with warp barriers; a block of 4 planes (two warps)
    and a plane count that leaves groups past the last plane."""
    tuning = Tuning(threads=16, planes_per_block=4)
    problem = Problem(*shape, k, levels, stride, "float32", True)
    spec = plan_plane(problem, False, 227 * 1024, 2, tuning).spec
    assert spec.warp_sync and spec.threads == 16 and spec.planes_per_block == 4
    assert_close(run_layer(rng, shape, levels, k, stride, tuning=tuning), DTYPES["float32"][1])


def test_two_planes_per_warp_on_global_scratch(rng):
    """16-thread planes on the scratch path (persistent blocks of whole warps)."""
    tuning = Tuning(threads=16, planes_per_block=2)
    problem = Problem(2, 3, 6, 7, 3, 2, 1, "float32", True)
    spec = plan_plane(problem, True, 0, 2, tuning).spec
    assert spec.scratch and spec.warp_sync and spec.planes_per_block == 2
    errors = run_layer(rng, (2, 3, 6, 7), 2, 3, 1, shared_limit=0, tuning=tuning)
    assert_close(errors, DTYPES["float32"][1])


#: Tiled forwards, forced on tiny tiles: partial edge tiles on odd planes, every
#: level decomposition (single items, strips of 1, 2 and 4 rows), L = 0, a 1x1
#: kernel, float16, no bias. (shape, levels, k, tile, threads, strip, storage, bias)
TILE_CASES = [
    ((1, 2, 13, 11), 2, 3, 8, 32, 2, "float32", True),
    ((2, 1, 21, 19), 1, 3, 16, 32, 2, "float32", True),
    ((1, 1, 33, 20), 2, 3, 32, 32, 4, "float32", True),
    ((1, 1, 9, 16), 0, 3, 8, 32, 2, "float32", True),
    ((1, 2, 12, 9), 3, 3, 8, 32, 2, "float16", True),
    ((1, 1, 17, 8), 2, 1, 4, 32, 1, "float32", True),
    ((1, 1, 18, 30), 2, 3, 16, 64, 1, "float32", True),
    ((1, 1, 40, 35), 1, 3, 32, 64, 2, "float32", True),
    ((1, 1, 10, 13), 1, 5, 8, 32, 4, "float32", False),
    ((1, 2, 13, 11), 2, 3, 12, 32, 3, "float32", True),  # not a power of two; 3-row strips
    # 14-item rows padded to 16; 7-row strips in the output and the level-1 analysis
    ((1, 1, 27, 30), 1, 3, 28, 32, 7, "float32", True),
]


def test_tile_cases_cover_every_level_decomposition():
    from wtconv_cuda.kernels.tiles import TileSpec
    max_strip = TileSpec._field_defaults["analysis_strip"]
    plans = {analysis_plan(k, tile >> j, threads, max_strip)
             for _, levels, k, tile, threads, _, _, _ in TILE_CASES
             for j in range(1, levels + 1)}
    assert plans == {0, 1, 2, 4, 7, 8}


@pytest.mark.parametrize("shape,levels,k,tile,threads,strip,storage,bias", TILE_CASES)
def test_tiled_forward_matches_oracle(rng, shape, levels, k, tile, threads, strip, storage, bias):
    dtype, tol = DTYPES[storage]
    b, c, h, w = shape
    x = rng.standard_normal(shape).astype(dtype)
    wts = random_weights(rng, c, k, levels, bias=bias, dtype=dtype)
    weights = Weights(wts.base_weight, wts.base_bias if bias else wts.base_scale,
                      wts.base_scale, wts.wavelet_weight, wts.wavelet_scale)
    problem = Problem(b, c, h, w, k, levels, 1, storage, bias)
    tuning = Tuning(tiles=True, tile=tile, threads=threads, strip=strip)
    backend = RecordingBackend()
    plan = plan_tiles(problem, backend.shared_limit, tuning)
    assert plan is not None and plan.grid == b * c * -(-h // tile) * -(-w // tile)
    x_before = x.copy()
    y = np.full(shape, np.nan, dtype)
    run_forward(backend, problem, x, y, weights, tuning)
    np.testing.assert_array_equal(x, x_before)
    assert backend.requests == [] == list(work_buffers(problem, False, backend.shared_limit,
                                                       backend.max_slots, tuning))
    assert np.isfinite(y).all(), "unwritten (NaN) outputs"
    want = reference.forward(x, wts, levels, 1)
    assert np.linalg.norm(y.astype(np.float64) - want) / np.linalg.norm(want) < tol


def test_tiled_forward_keeps_a_nan_in_its_receptive_field(rng):
    """A NaN pixel poisons exactly the outputs whose receptive field holds it, also across
    tile edges (zero taps never meet it)."""
    shape, levels, k = (1, 1, 16, 16), 1, 3
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 0, 7, 8] = np.nan  # a level-1 block at tile rows 0..7, next to the tile edge
    wts = random_weights(rng, 1, k, levels, dtype=np.float32)
    weights = Weights(*wts)
    problem = Problem(*shape, k, levels, 1, "float32", True)
    y = np.full(shape, np.inf, np.float32)
    run_forward(SimulatorBackend(), problem, x, y, weights,
                Tuning(tiles=True, tile=8, threads=32, strip=2))
    x_clean = np.nan_to_num(x)
    want = reference.forward(x_clean, wts, levels, 1)
    # receptive field of (7, 8): base taps reach 1 pixel; level 1 reaches the 2x2 blocks of
    # the 3x3 coefficients around (3, 4), i.e. rows 4..9 and columns 6..11
    poisoned = np.zeros((16, 16), bool)
    poisoned[4:10, 6:12] = True
    assert np.isnan(y[0, 0][poisoned]).all()
    np.testing.assert_allclose(y[0, 0][~poisoned], want[0, 0][~poisoned], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("shape,levels,stride,tuning,tiled", [
    ((8, 64, 512, 512), 3, 1, Tuning(), True),  # paper grid, L 3: 2.25x reads
    ((8, 32, 128, 128), 1, 1, Tuning(), True),  # fits in shared, but large
    ((8, 64, 512, 512), 5, 1, Tuning(), False),  # halo of 64 pixels: 9x reads
    ((8, 64, 512, 512), 3, 2, Tuning(), False),  # stride 2
    ((64, 96, 56, 56), 3, 1, Tuning(), False),  # ConvNeXt-T stage: the plane kernel
    ((8, 64, 512, 512), 3, 1, Tuning(tiles=False), False),
    ((1, 1, 20, 20), 2, 1, Tuning(tiles=True), True),  # forced: smaller than a tile
])
def test_planner_takes_tiles_for_large_planes(shape, levels, stride, tuning, tiled):
    problem = Problem(*shape, 5, levels, stride, "float32", True)
    plan = plan_tiles(problem, 227 * 1024 - 1024, tuning)
    assert (plan is not None) == tiled
    if tiled:
        assert plan.spec.tile == 64 and plan.block == 128


def test_tiled_forward_with_eight_row_strips(rng):
    """Level analysis in strips of 8 rows (TileSpec.analysis_strip), launched directly."""
    from wtconv_cuda.kernels.tiles import TileSpec
    shape, levels, k = (1, 1, 20, 33), 1, 3
    x = rng.standard_normal(shape).astype(np.float32)
    wts = random_weights(rng, 1, k, levels, dtype=np.float32)
    problem = Problem(*shape, k, levels, 1, "float32", True)
    plan = plan_tiles(problem, 227 * 1024, Tuning(tiles=True, tile=32, threads=32))
    spec = plan.spec._replace(analysis_strip=8)
    assert analysis_plan(k, 16, 32, 8) == 8
    backend = SimulatorBackend()
    y = np.full(shape, np.nan, np.float32)
    args = (x, y, *Weights(*wts), 20, 33, 1, 1, plan.tiles_x, plan.ntiles)
    backend.call(backend.kernel(spec), plan.grid, plan.block, args, plan.shared_bytes)
    want = reference.forward(x, wts, levels, 1)
    assert np.linalg.norm(y - want) / np.linalg.norm(want) < DTYPES["float32"][1]


#: Tiled backwards (forced: these planes are small), forward and backward
#: on tiles: partial edge tiles, L = 0..4, K 1, 3, 5, float16, no bias.
TILE_BACKWARD_CASES = [
    ((1, 2, 13, 11), 2, 3, Tuning(tiles=True, tile=8, threads=32, strip=2), "float32", True),
    ((2, 1, 10, 13), 1, 5, Tuning(tiles=True, tile=8, threads=32, strip=4), "float32", True),
    ((1, 1, 9, 16), 0, 3, Tuning(tiles=True, tile=8, threads=32, strip=2), "float32", False),
    ((1, 2, 12, 9), 3, 3, Tuning(tiles=True, tile=8, threads=32, strip=2), "float16", True),
    ((3, 1, 18, 30), 2, 1, Tuning(tiles=True, tile=16, threads=64, strip=1), "float32", True),
    # (two channels: one bias sum of 360 values can cancel to ~1e-6 relative error)
    ((1, 2, 20, 18), 4, 3, Tuning(tiles=True, tile=16, threads=32, strip=2), "float32", True),
]


@pytest.mark.parametrize("shape,levels,k,tuning,storage,bias", TILE_BACKWARD_CASES)
def test_tiled_backward_matches_oracle(rng, shape, levels, k, tuning, storage, bias):
    problem = Problem(*shape, k, levels, 1, storage, bias)
    plan = plan_tiles(problem, 227 * 1024, tuning, backward=True)
    assert plan is not None and plan.spec.backward
    assert plan.finalize_dims[-1] == shape[0] * plan.ntiles  # one partial per tile
    errors = run_layer(rng, shape, levels, k, 1, storage, bias=bias, tuning=tuning)
    assert_close(errors, DTYPES[storage][1])


def test_tiled_backward_buffers_match_requests(rng):
    shape, levels, k = (2, 2, 12, 17), 1, 3
    tuning = Tuning(tiles=True, tile=8, threads=32, strip=2)
    backend = RecordingBackend()
    problem = Problem(*shape, k, levels, 1, "float32", True)
    x = rng.standard_normal(shape).astype(np.float32)
    weights = Weights(*random_weights(rng, 2, k, levels, dtype=np.float32))
    grads = Weights(*(np.empty_like(a) for a in weights))
    run_backward(backend, problem, x, x.copy(), np.empty_like(x), weights, grads, tuning)
    assert tuple(backend.requests) == work_buffers(problem, True, backend.shared_limit,
                                                   backend.max_slots, tuning)
    assert backend.requests == [2 * 2 * 2 * 3 * (9 * 5 + 1)]  # B C tiles_y tiles_x ntaps


def test_planner_takes_the_tiled_backward_for_large_planes():
    """The backward follows the forward's rule, except that one block per SM may do: then
    it gets more threads."""
    limit = 227 * 1024 - 1024
    for levels, threads in ((1, TILE_THREADS), (3, TILE_SOLO_THREADS)):
        problem = Problem(8, 64, 512, 512, 5, levels, 1, "float32", True)
        plan = plan_tiles(problem, limit, backward=True)
        assert plan is not None and plan.spec.backward and plan.block == threads
        assert (2 * plan.shared_bytes > limit) == (levels == 3)
        assert plan_tiles(problem, limit, Tuning(threads=64), backward=True).block == 64
    # K 9, L 3 fits one block of 128 threads (211 KB) but not of 256 (the reduction area)
    plan = plan_tiles(Problem(1, 1, 64, 64, 9, 3, 1, "float32", True), limit, Tuning(tiles=True),
                      backward=True)
    assert plan is not None and plan.block == TILE_THREADS
    # the halo rule (K 5, L 5: 3.0 pixels read per output pixel), small planes, stride 2
    assert plan_tiles(Problem(8, 64, 512, 512, 5, 5, 1, "float32", True), limit,
                      backward=True) is None
    assert plan_tiles(Problem(8, 64, 56, 56, 5, 1, 1, "float32", True), limit,
                      backward=True) is None
    assert plan_tiles(Problem(8, 64, 512, 512, 5, 1, 2, "float32", True), limit,
                      backward=True) is None
    assert plan_tiles(Problem(8, 64, 512, 512, 5, 1, 1, "float32", True), limit,
                      Tuning(tiles=False), backward=True) is None
    # more tap rows than threads: not the tiled backward (one correlation item a thread)
    wide = Problem(1, 1, 130, 130, 33, 1, 1, "float32", True)
    assert plan_tiles(wide, limit, Tuning(tiles=True, threads=32), backward=True) is None
    assert plan_tiles(wide, limit, Tuning(tiles=True, threads=32)) is not None