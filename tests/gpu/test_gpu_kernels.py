"""Fused kernels on a real GPU against the float64 oracle.

Runs only where CuPy sees a GPU and ``WTCONV_TEST_GPU=1`` (the device script
sets it). Every case poisons its outputs with NaN, checks that inputs are
unchanged, compares every output with the oracle evaluated on the same
rounded inputs, and checks that two backward runs agree bit for bit.

The oracle is evaluated on a few sampled channels (all batch entries): the
operator is depthwise, so each channel's outputs and weight gradients depend
only on that channel's input and weights.
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

if os.environ.get("WTCONV_TEST_GPU") != "1":
    pytest.skip("GPU tests run with WTCONV_TEST_GPU=1", allow_module_level=True)

cupy = pytest.importorskip("cupy")
ml_dtypes = pytest.importorskip("ml_dtypes")

from wtconv_cuda import reference  # noqa: E402
from wtconv_cuda.kernels import launch as planner  # noqa: E402
from wtconv_cuda.kernels.launch import (  # noqa: E402
    DX_INNER, CupyBackend, DxForward, Problem, Tuning, Weights, dx_forward_plan, plan_lanes,
    plan_lanes_forward, plan_plane, plan_registers, plan_split, plan_tiles, run_backward,
    run_forward, split_batch_chunks,
)
from wtconv_cuda.weights import WTConvWeights  # noqa: E402

SHAPES = [(2, 3, 17, 23), (4, 96, 56, 56), (8, 64, 255, 257), (1, 4, 1, 7)]
LEVELS = list(range(7))
#: WTCONV_TEST_KS="3,5" narrows the sweep (a shorter device run); default: all.
KERNEL_SIZES = [int(k) for k in os.environ.get("WTCONV_TEST_KS", "3,5,7,9").split(",")]
STRIDES = [1, 2]
#: storage -> (host dtype used to round, tolerance on relative error)
DTYPES = {"float32": (np.float32, 1e-5), "float16": (np.float16, 2e-3),
          "bfloat16": (ml_dtypes.bfloat16, 1e-2)}

_backend = None


def backend():
    global _backend
    if _backend is None:
        _backend = CupyBackend()
    return _backend


def to_device(a: np.ndarray, storage: str):
    """Round ``a`` to ``storage``; return (device array, rounded float64 copy)."""
    host = a.astype(DTYPES[storage][0])
    rounded = host.astype(np.float64)
    if storage == "bfloat16":
        host = host.view(np.uint16)
    return cupy.asarray(np.ascontiguousarray(host)), rounded


def to_host(a, storage: str) -> np.ndarray:
    host = cupy.asnumpy(a)
    if storage == "bfloat16":
        host = host.view(ml_dtypes.bfloat16)
    return host.astype(np.float64)


def poisoned(shape, storage: str):
    if storage == "bfloat16":
        return cupy.full(shape, 0x7FC1, dtype=cupy.uint16)  # a NaN pattern
    return cupy.full(shape, np.nan, dtype=DTYPES[storage][0])


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    assert np.isfinite(got).all(), "output contains NaN/Inf (unwritten or corrupted elements)"
    scale = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / (scale if scale > 0 else 1.0))


def sample_channels(c: int) -> list[int]:
    return sorted({0, c // 2, c - 1})


def select_channels(w: WTConvWeights, chans) -> WTConvWeights:
    return WTConvWeights(w.base_weight[chans],
                         None if w.base_bias is None else w.base_bias[chans],
                         w.base_scale[chans], w.wavelet_weight[:, chans], w.wavelet_scale[:, chans])


def random_inputs(rng, shape, levels, k, storage, bias):
    """``x`` and the parameters, rounded to ``storage``: (x_dev, x, wts, wdev, dev).

    ``x`` and ``wts`` are the rounded float64 host copies (the oracle's inputs),
    ``wdev`` the kernels' :class:`Weights` and ``dev`` the five device arrays.
    """
    c = shape[1]
    x_dev, x = to_device(rng.standard_normal(shape), storage)
    params = [rng.uniform(-1, 1, (c, k, k)), rng.uniform(-1, 1, c), rng.uniform(0.5, 1.5, c),
              rng.uniform(-1, 1, (levels, c, 4, k, k)), rng.uniform(-0.5, 0.5, (levels, c, 4))]
    dev, host = zip(*(to_device(p, storage) for p in params))
    wts = WTConvWeights(host[0], host[1] if bias else None, *host[2:])
    wdev = Weights(dev[0], dev[1] if bias else dev[2], *dev[2:])
    return x_dev, x, wts, wdev, dev


def check_forward(shape, levels, k, storage, tuning, bias=True):
    """Forward only (stride 1) against the oracle on sampled channels; returns the output."""
    b, c, h, w = shape
    rng = np.random.default_rng(zlib.crc32(repr((shape, levels, k, storage, "fwd")).encode()))
    x_dev, x, wts, wdev, _ = random_inputs(rng, shape, levels, k, storage, bias)
    x_before = x_dev.copy()
    y_dev = poisoned(shape, storage)
    run_forward(backend(), Problem(b, c, h, w, k, levels, 1, storage, bias), x_dev, y_dev, wdev,
                tuning)
    chans = sample_channels(c)
    y_ref = reference.forward(x[:, chans], select_channels(wts, chans), levels, 1)
    y = to_host(y_dev, storage)
    assert np.isfinite(y).all(), "forward left unwritten (NaN) outputs"
    assert rel_err(y[:, chans], y_ref) < DTYPES[storage][1]
    assert bool(cupy.array_equal(x_before, x_dev))
    return y_dev


def run_case(shape, levels, k, stride, storage, bias=True, seed=0, tuning=Tuning()):
    """Forward and backward against the oracle. The forward runs on the plane kernel (or
    tiles) unless ``tuning.registers`` says otherwise: the register kernel of tiny planes
    has its own cases (``test_register_kernel_matches_oracle``)."""
    if tuning.registers is None:
        tuning = tuning._replace(registers=False)
    b, c, h, w = shape
    rng = np.random.default_rng(zlib.crc32(repr((shape, levels, k, stride, storage, seed)).encode()))
    _, tol = DTYPES[storage]
    x_dev, x, wts, wdev, dev = random_inputs(rng, shape, levels, k, storage, bias)
    problem = Problem(b, c, h, w, k, levels, stride, storage, bias)
    ho, wo = -(-h // stride), -(-w // stride)
    dy_dev, dy = to_device(rng.standard_normal((b, c, ho, wo)), storage)
    inputs_before = [a.copy() for a in (x_dev, dy_dev, *dev)]

    y_dev = poisoned((b, c, ho, wo), storage)
    run_forward(backend(), problem, x_dev, y_dev, wdev, tuning)
    chans = sample_channels(c)
    wsub = select_channels(wts, chans)
    y_ref = reference.forward(x[:, chans], wsub, levels, stride)
    y = to_host(y_dev, storage)
    assert np.isfinite(y).all(), "forward left unwritten (NaN) outputs"
    assert rel_err(y[:, chans], y_ref) < tol

    results = []
    for _ in range(2):
        dx_dev = poisoned(shape, storage)
        grads = Weights(*(poisoned(a.shape, storage) for a in wdev))
        run_backward(backend(), problem, x_dev, dy_dev, dx_dev, wdev, grads, tuning)
        results.append((dx_dev, grads))
    dx_ref, dw_ref = reference.backward(x[:, chans], wsub, dy[:, chans], levels, stride)
    (dx_dev, grads), (dx2_dev, grads2) = results
    dx = to_host(dx_dev, storage)
    assert np.isfinite(dx).all(), "backward left unwritten (NaN) dx"
    assert rel_err(dx[:, chans], dx_ref) < tol
    got = dict(base_weight=to_host(grads.base_weight, storage)[chans],
               base_scale=to_host(grads.base_scale, storage)[chans],
               wavelet_weight=to_host(grads.wavelet_weight, storage)[:, chans],
               wavelet_scale=to_host(grads.wavelet_scale, storage)[:, chans])
    if bias:
        got["base_bias"] = to_host(grads.base_bias, storage)[chans]
    for name, value in got.items():
        want = getattr(dw_ref, name)
        assert rel_err(value, want) < tol, name
    # Determinism: the second run matches the first bit for bit.
    assert bool(cupy.array_equal(dx_dev, dx2_dev))
    for name in got:
        assert bool(cupy.array_equal(getattr(grads, name), getattr(grads2, name))), name
    # Inputs untouched.
    for before, after in zip(inputs_before, (x_dev, dy_dev, *dev)):
        assert bool(cupy.array_equal(before, after))
    return dx_dev, grads


CASES = [(s, L, k, st) for s in SHAPES for L in LEVELS for k in KERNEL_SIZES for st in STRIDES]


def case_id(case):
    """``8x64x255x257-L3-K5-s1``: ids that ``pytest -k`` (``TEST_FILTER``) can select by shape."""
    shape, levels, k, stride = case
    return f"{'x'.join(map(str, shape))}-L{levels}-K{k}-s{stride}"


@pytest.mark.parametrize("storage", list(DTYPES))
@pytest.mark.parametrize("shape,levels,k,stride", CASES, ids=[case_id(c) for c in CASES])
def test_matches_oracle(shape, levels, k, stride, storage):
    run_case(shape, levels, k, stride, storage)


#: The tiled forward, forced: partial edge tiles (odd sizes), planes narrower
#: than a tile, 16-pixel tiles for 4 levels, and no bias.
TILE_CASES = [((2, 3, 130, 67), L, k, 64) for L in range(4) for k in KERNEL_SIZES]
TILE_CASES += [((1, 2, 45, 200), 2, k, 32) for k in KERNEL_SIZES]
TILE_CASES += [((3, 2, 70, 51), 4, k, 16) for k in KERNEL_SIZES]


@pytest.mark.parametrize("storage", list(DTYPES))
@pytest.mark.parametrize("shape,levels,k,tile", TILE_CASES)
def test_tiled_forward_matches_oracle(shape, levels, k, tile, storage):
    kernels = backend()
    tuning = Tuning(tiles=True, tile=tile)
    assert plan_tiles(Problem(*shape, k, levels, 1, storage, True), kernels.shared_limit,
                      tuning) is not None
    check_forward(shape, levels, k, storage, tuning)
    if levels == 2:
        check_forward(shape, levels, k, storage, tuning, bias=False)


@pytest.mark.parametrize("storage", list(DTYPES))
def test_tiled_forward_is_the_default_for_large_planes(storage):
    """The planner's own choice at a paper-grid-like plane: tiles, and the oracle holds;
    the plane kernel (tiles off) gives the same bits (both add every product in the same
    order)."""
    if 5 not in KERNEL_SIZES:
        pytest.skip("K = 5 runs in another GPU process")
    shape, levels = (2, 4, 257, 300), 3
    problem = Problem(*shape, 5, levels, 1, storage, True)
    assert plan_tiles(problem, backend().shared_limit) is not None
    tiled = check_forward(shape, levels, 5, storage, Tuning())
    plane = check_forward(shape, levels, 5, storage, Tuning(tiles=False))
    assert bool(cupy.array_equal(tiled, plane))


#: Split passes, forced: coarse pre-pass, coarse levels on the pooled planes, fine
#: levels on tiles. (shape, levels, k, split, tile): odd planes with partial edge
#: tiles, splits at 1, 2 and 3, a ConvNeXt-T stage plane, and tiles fitted to a
#: plane (edges that are not powers of two: item rows padded to whole warps).
SPLIT_CASES = [((2, 3, 130, 67), 3, k, 1, 32) for k in KERNEL_SIZES]
SPLIT_CASES += [((2, 3, 130, 67), 5, k, 2, 32) for k in KERNEL_SIZES]
SPLIT_CASES += [((3, 2, 70, 51), 6, k, 3, 16) for k in KERNEL_SIZES]
SPLIT_CASES += [((4, 8, 56, 56), 5, k, 2, 32) for k in KERNEL_SIZES]
SPLIT_CASES += [((4, 8, 56, 55), 5, k, 2, 56) for k in KERNEL_SIZES]
SPLIT_CASES += [((2, 3, 27, 28), 4, k, 2, 28) for k in KERNEL_SIZES]


@pytest.mark.parametrize("storage", list(DTYPES))
@pytest.mark.parametrize("shape,levels,k,split,tile", SPLIT_CASES)
def test_split_matches_oracle(shape, levels, k, split, tile, storage):
    """Forward and backward (dx, every gradient, determinism) of a forced split, the
    batch whole."""
    tuning = Tuning(split=split, tile=tile, split_batch=shape[0])
    problem = Problem(*shape, k, levels, 1, storage, True)
    for backward in (False, True):
        plan = plan_split(problem, backend().shared_limit, tuning, backward)
        assert plan is not None and plan.split == split
    assert split_batch_chunks(problem, backend().shared_limit, backend().max_slots,
                              tuning) == ()
    run_case(shape, levels, k, 1, storage, tuning=tuning)
    if k == 3:
        run_case(shape, levels, k, 1, storage, bias=False, tuning=tuning)


@pytest.mark.parametrize("storage", list(DTYPES))
@pytest.mark.parametrize("shape,levels,k,split,tile,split_batch",
                         [((3, 3, 130, 67), 5, k, 2, 32, 2) for k in KERNEL_SIZES]
                         + [((4, 8, 56, 55), 5, k, 2, 56, 1) for k in KERNEL_SIZES])
def test_split_backward_in_batch_chunks_matches_oracle(shape, levels, k, split, tile,
                                                       split_batch, storage):
    """A forced split's backward in batch chunks (uneven: 2 + 1; and of one entry):
    dx and every gradient against the oracle, twice alike."""
    tuning = Tuning(split=split, tile=tile, split_batch=split_batch)
    problem = Problem(*shape, k, levels, 1, storage, True)
    chunks = split_batch_chunks(problem, backend().shared_limit, backend().max_slots, tuning)
    assert len(chunks) == -(-shape[0] // split_batch)
    run_case(shape, levels, k, 1, storage, bias=k == 3, tuning=tuning)


@pytest.mark.parametrize("storage", list(DTYPES))
@pytest.mark.parametrize("planes", [2, 4, 16])
def test_tile_planes_match_one_plane_a_block(planes, storage):
    """The 28 x 28 stage's split with several planes of a channel a block
    (``Tuning(tile_planes=...)``): the oracle, and bit for bit one plane a block."""
    if 5 not in KERNEL_SIZES:
        pytest.skip("K = 5 runs in another GPU process")
    shape, levels = (32, 48, 28, 28), 4
    problem = Problem(*shape, 5, levels, 1, storage, True)
    plan = plan_split(problem, backend().shared_limit, Tuning(tile_planes=planes))
    assert plan.tiles.spec.planes == planes
    ys = [check_forward(shape, levels, 5, storage, Tuning(tile_planes=p)) for p in (planes, 1)]
    assert bool(cupy.array_equal(ys[0], ys[1]))


@pytest.mark.parametrize("storage", list(DTYPES))
@pytest.mark.parametrize("shape,levels,k,tile,split,backward_splits", [
    ((2, 4, 257, 300), 5, 5, 64, 2, DTYPES),
    ((2, 4, 257, 300), 3, 5, 64, 2, DTYPES),  # whole tiles would take it
    ((2, 4, 257, 300), 4, 3, 64, 2, DTYPES),  # likewise at K 3
    ((32, 48, 28, 28), 4, 5, 32, 2, ()),
    ((32, 48, 28, 28), 4, 7, 32, 2, ()),  # a whole plane's halos: 1.9 reads at K 7
    ((64, 384, 14, 14), 3, 5, 16, 1, ())])
def test_split_is_the_default_for_deep_levels(shape, levels, k, tile, split, backward_splits,
                                              storage):
    """The planner's own split (large planes: both passes, the backward in batch chunks
    of one entry; the 28 x 28 and 14 x 14 stages, one tile per plane: the forward)."""
    if k not in KERNEL_SIZES:
        pytest.skip(f"K = {k} runs in another GPU process")
    problem = Problem(*shape, k, levels, 1, storage, True)
    plan = plan_split(problem, backend().shared_limit)
    assert plan.split == split and plan.tiles.spec.tile == tile
    back = plan_split(problem, backend().shared_limit, backward=True)
    assert (back is not None) == (storage in backward_splits)
    if back is not None:  # the whole batch's buffers would pass the budget: one entry each
        assert len(split_batch_chunks(problem, backend().shared_limit,
                                      backend().max_slots)) == shape[0]
    run_case(shape, levels, k, 1, storage)


@pytest.mark.parametrize("storage", list(DTYPES))
@pytest.mark.parametrize("shape,levels,tile,inner", [((8, 48, 56, 56), 5, 56, 3),
                                                     ((16, 48, 50, 47), 5, 56, 3),
                                                     ((64, 16, 40, 33), 4, 40, 2),
                                                     ((16, 384, 14, 14), 3, 16, 2),
                                                     ((32, 200, 15, 13), 3, 16, 2)])
def test_inner_levels_are_the_default_where_one_tile_covers_the_plane(shape, levels, tile,
                                                                      inner, storage):
    """Planes of 33 to 64 pixels (the 56 x 56 ConvNeXt-T stage), and of 9 to 16 below
    2^22 pixels (the 14 x 14 stage at small batches): one tile per plane runs the levels
    above its own in its block (forward and the backward's dx); against the oracle,
    and at 56 x 56 bit for bit the split it replaces (whose coarse problem runs on the
    plane kernel there)."""
    if 5 not in KERNEL_SIZES:
        pytest.skip("K = 5 runs in another GPU process")
    problem = Problem(*shape, 5, levels, 1, storage, True)
    plan = plan_tiles(problem, backend().shared_limit)
    assert (plan.spec.tile, plan.spec.inner_levels, plan.ntiles) == (tile, inner, 1)
    assert plan_split(problem, backend().shared_limit) is None
    run_case(shape, levels, 5, 1, storage)
    if shape[2] == 56:
        rng = np.random.default_rng(7)
        x_dev, _, _, wdev, _ = random_inputs(rng, shape, levels, 5, storage, True)
        ys = []
        for tuning in (Tuning(), Tuning(inner=False)):
            ys.append(poisoned(shape, storage))
            run_forward(backend(), problem, x_dev, ys[-1], wdev, tuning)
        assert bool(cupy.array_equal(ys[0], ys[1]))


#: The tiled backward, forced (these planes are small): dx and every
#: weight gradient against the oracle, two runs bit for bit, partial edge tiles.
TILE_BACKWARD_CASES = [((2, 3, 130, 67), L, k, 64) for L in (0, 1, 3) for k in KERNEL_SIZES]
TILE_BACKWARD_CASES += [((3, 2, 70, 51), 2, k, 32) for k in KERNEL_SIZES]


@pytest.mark.parametrize("storage", list(DTYPES))
@pytest.mark.parametrize("shape,levels,k,tile", TILE_BACKWARD_CASES)
def test_tiled_backward_matches_oracle(shape, levels, k, tile, storage):
    tuning = Tuning(tiles=True, tile=tile)
    problem = Problem(*shape, k, levels, 1, storage, True)
    assert plan_tiles(problem, backend().shared_limit, tuning, backward=True) is not None
    run_case(shape, levels, k, 1, storage, tuning=tuning)


@pytest.mark.parametrize("storage", list(DTYPES))
@pytest.mark.parametrize("levels", [1, 3])
def test_tiled_backward_is_the_default_for_large_planes(levels, storage):
    """The planner's own choice at a paper-grid-like plane: the tiled backward (at L 3 one
    block per SM, `TILE_SOLO_THREADS` threads), and the oracle holds."""
    if 5 not in KERNEL_SIZES:
        pytest.skip("K = 5 runs in another GPU process")
    shape = (2, 3, 257, 300)
    problem = Problem(*shape, 5, levels, 1, storage, True)
    assert plan_tiles(problem, backend().shared_limit, backward=True) is not None
    run_case(shape, levels, 5, 1, storage)


#: Backward work units of several batch entries: ragged last units (B not a
#: multiple of rb), one unit per channel (rb = B), 32-, 64- and 128-thread planes.
BATCH_CHUNK_CASES = [((5, 3, 17, 23), 3, 3, 1, 2), ((5, 3, 17, 23), 3, 3, 2, 5),
                     ((4, 96, 56, 56), 5, 5, 1, 3), ((7, 8, 28, 28), 4, 5, 1, 4),
                     ((9, 16, 7, 7), 2, 5, 1, 4)]
# Each GPU process of the device script takes the cases of its kernel sizes.
BATCH_CHUNK_CASES = [case for case in BATCH_CHUNK_CASES if case[2] in KERNEL_SIZES]


@pytest.mark.parametrize("storage", list(DTYPES))
@pytest.mark.parametrize("shape,levels,k,stride,batch_chunk", BATCH_CHUNK_CASES)
def test_batch_chunked_backward(shape, levels, k, stride, batch_chunk, storage):
    run_case(shape, levels, k, stride, storage, tuning=Tuning(batch_chunk=batch_chunk))


#: Backwards whose blocks hold whole channels (the planner fuses the finalize):
#: 7x7 planes, 16 groups of 16 threads holding one channel's 16 units, 32-thread
#: 14x14 planes (4 channels a block), stride 2, and a global-scratch plane (B = 1).
FUSED_CASES = [((16, 16, 7, 7), 2, 5, 1), ((2, 7, 14, 14), 3, 5, 1),
               ((2, 3, 17, 23), 4, 3, 2), ((1, 4, 255, 257), 3, 3, 1)]
FUSED_CASES = [case for case in FUSED_CASES if case[2] in KERNEL_SIZES]


@pytest.mark.parametrize("storage", list(DTYPES))
@pytest.mark.parametrize("shape,levels,k,stride", FUSED_CASES)
def test_fused_finalize_matches_two_launches(shape, levels, k, stride, storage):
    """The fused backward passes the oracle and gives the bits of partials + finalize."""
    kernels = backend()
    problem = Problem(*shape, k, levels, stride, storage, True)
    assert plan_plane(problem, True, kernels.shared_limit, kernels.max_slots).spec.fused_finalize
    fused = run_case(shape, levels, k, stride, storage)
    two_launches = run_case(shape, levels, k, stride, storage, tuning=Tuning(fuse_finalize=False))
    (dx_a, grads_a), (dx_b, grads_b) = fused, two_launches
    assert bool(cupy.array_equal(dx_a, dx_b))
    for a, b in zip(grads_a, grads_b):
        assert bool(cupy.array_equal(a, b))


#: Stride-1 backwards on the plane kernel: odd planes of every level count's
#: kind (none, one, a chain, down to 1 x 1 grids), and the ConvNeXt-T 56 x 56
#: and 14 x 14 stages' launch shapes.
DX_CASES = [((2, 3, 17, 23), levels, k, 1) for levels in (0, 1, 3, 6) for k in KERNEL_SIZES]
DX_CASES += [((3, 4, 56, 56), 5, 5, 1), ((4, 6, 14, 14), 3, 5, 1), ((2, 3, 9, 6), 0, 3, 1)]
DX_CASES = [case for case in DX_CASES if case[2] in KERNEL_SIZES]


#: Launch shapes forced on both paths: work units of several planes (one slot runs
#: them in turn) on odd grids, where the zero padding one plane reads must still be
#: zero for the next; planes of 160 threads (five warps).
DX_TUNED_CASES = [((5, 3, 17, 23), 4, k, 1, Tuning(batch_chunk=3)) for k in KERNEL_SIZES]
DX_TUNED_CASES += [((2, 3, 17, 23), 3, k, 1, Tuning(threads=160)) for k in KERNEL_SIZES]
# dx from the forward in batch chunks of 2, 2 and 1 (each chunk's forward on its entries)
DX_TUNED_CASES += [((5, 3, 17, 23), 3, k, 1, Tuning(dx_batch=2)) for k in KERNEL_SIZES]
DX_TUNED_CASES += [((3, 4, 56, 56), 5, 5, 1, Tuning(threads=160))] if 5 in KERNEL_SIZES else []


@pytest.mark.parametrize("storage", list(DTYPES))
@pytest.mark.parametrize("shape,levels,k,stride,tuning",
                         [case + (Tuning(),) for case in DX_CASES] + DX_TUNED_CASES)
def test_dx_in_the_plane_kernel_or_the_forward(shape, levels, k, stride, tuning, storage):
    """A stride-1 backward with dx from the forward kernels (the plane kernel for the weight
    gradients alone) and the plane kernel doing both both pass the oracle; the weight
    gradients are bit for bit the same (same pyramids, same sums)."""
    tunings = [tuning._replace(dx_forward=flag) for flag in (True, False)]
    _, forward_grads = run_case(shape, levels, k, stride, storage, tuning=tunings[0])
    _, plane_grads = run_case(shape, levels, k, stride, storage, tuning=tunings[1])
    for a, b in zip(forward_grads, plane_grads):
        assert bool(cupy.array_equal(a, b))


@pytest.mark.parametrize("storage", ["bfloat16", "float16"])
def test_planner_dx_forward_chunks_at_convnext_stage(storage, monkeypatch):
    """The planner's own choice at the 28 x 28 and 14 x 14 stages in 16-bit storage:
    dx from the forward kernels in one batch chunk. At 28 x 28 its split forward pools
    in place (its float32 work buffer stays within the memory budget); at 14 x 14 the
    lane forward (no work buffers) takes the whole batch, and without its rule no split
    fits, even on half the batch, so the tiles with the coarse levels in their blocks
    would; at 56 x 56 the forward runs the coarse levels in the tiles' blocks anyway
    (no work buffers)."""
    if 5 not in KERNEL_SIZES:
        pytest.skip("K = 5 runs in another GPU process")
    kernels = backend()
    limits = kernels.shared_limit, kernels.max_slots
    problem = Problem(64, 96, 56, 56, 5, 5, 1, storage, True)
    assert dx_forward_plan(problem, *limits) == DxForward((64,), Tuning())
    problem = Problem(64, 384, 14, 14, 5, 3, 1, storage, True)
    assert plan_lanes_forward(problem, limits[0]) is not None
    assert dx_forward_plan(problem, *limits) == DxForward((64,), Tuning())
    run_case((64, 384, 14, 14), 3, 5, 1, storage)
    with monkeypatch.context() as rule_off:
        rule_off.setattr(planner, "LANES_FORWARD_MAX_PIXELS", 0)
        planner.clear_plan_caches()
        try:
            assert dx_forward_plan(problem, *limits) == DxForward((64,), DX_INNER)
        finally:  # no plan made without the rule outlives it
            planner.clear_plan_caches()
    problem = Problem(64, 192, 28, 28, 5, 4, 1, storage, True)
    assert dx_forward_plan(problem, *limits) == DxForward((64,), Tuning())
    run_case((64, 192, 28, 28), 4, 5, 1, storage)


#: Two 16-thread planes per warp (warp barriers shared by both), 16 planes per
#: block: small planes, ragged plane counts, stride 2, and the ConvNeXt-T 7x7
#: and 14x14 stage planes with the tune sweep's strips.
SUBWARP_CASES = [((3, 5, 7, 7), 2, 5, 1, 1), ((2, 7, 14, 14), 3, 5, 1, 2),
                 ((5, 3, 9, 13), 1, 3, 2, 1), ((9, 16, 7, 7), 2, 5, 1, 1)]
SUBWARP_CASES = [case for case in SUBWARP_CASES if case[2] in KERNEL_SIZES]


@pytest.mark.parametrize("storage", list(DTYPES))
@pytest.mark.parametrize("shape,levels,k,stride,strip", SUBWARP_CASES)
def test_two_planes_per_warp(shape, levels, k, stride, strip, storage):
    run_case(shape, levels, k, stride, storage, tuning=Tuning(threads=16, strip=strip))


@pytest.mark.parametrize("shape,levels", [((64, 384, 14, 14), 3), ((64, 768, 7, 7), 2)])
def test_planner_batch_chunk_at_convnext_stages(shape, levels):
    """The planner's own choice at the small ConvNeXt-T stages (several planes per unit)."""
    if 5 not in KERNEL_SIZES:
        pytest.skip("K = 5 runs in another GPU process")
    kernels = backend()
    problem = Problem(*shape, 5, levels, 1, "float32", True)
    assert plan_plane(problem, True, kernels.shared_limit, kernels.max_slots).batch_chunk > 1
    run_case(shape, levels, 5, 1, "float32")


#: The register kernel (one thread per plane): the ConvNeXt-T 7 x 7 stage's
#: variant in every storage (several blocks, a ragged last one), odd and
#: single-row planes, levels past a 1 x 1 grid, stride 2, no bias, and the
#: 128-register cap that spills.
REGISTER_CASES = [((64, 40, 7, 7), 2, 5, 1, s, True, Tuning()) for s in DTYPES]
REGISTER_CASES += [((5, 7, 8, 8), 3, 3, 1, "float32", True, Tuning()),
                   ((3, 5, 5, 6), 1, 7, 2, "float16", False, Tuning()),
                   ((9, 11, 7, 7), 0, 5, 1, "bfloat16", True, Tuning()),
                   ((2, 3, 1, 7), 4, 9, 1, "float32", True, Tuning()),
                   ((33, 4, 7, 7), 2, 5, 1, "float32", True,
                    Tuning(registers=True, max_registers=128))]
REGISTER_CASES = [case for case in REGISTER_CASES if case[2] in KERNEL_SIZES]


@pytest.mark.parametrize("shape,levels,k,stride,storage,bias,tuning", REGISTER_CASES)
def test_register_kernel_matches_oracle(shape, levels, k, stride, storage, bias, tuning):
    problem = Problem(*shape, k, levels, stride, storage, bias)
    assert plan_registers(problem, backend().shared_limit, tuning) is not None
    b, c, h, w = shape
    rng = np.random.default_rng(zlib.crc32(repr((shape, levels, k, stride, storage)).encode()))
    x_dev, x, wts, wdev, dev = random_inputs(rng, shape, levels, k, storage, bias)
    inputs_before = [a.copy() for a in (x_dev, *dev)]
    y_dev = poisoned((b, c, -(-h // stride), -(-w // stride)), storage)
    run_forward(backend(), problem, x_dev, y_dev, wdev, tuning)
    y = to_host(y_dev, storage)
    assert np.isfinite(y).all(), "forward left unwritten (NaN) outputs"
    assert rel_err(y, reference.forward(x, wts, levels, stride)) < DTYPES[storage][1]
    for before, after in zip(inputs_before, (x_dev, *dev)):
        assert bool(cupy.array_equal(before, after))


#: The register kernel's backward (and forward), through run_case: dx, every
#: gradient, determinism. The ConvNeXt-T 7 x 7 stage's variants in float32 and
#: bfloat16 (two channels per block), float16 at stride 2 without bias, and a
#: batch of 96 (three warps per channel, a 96-thread block) at both register
#: caps the planner has used (168 spills; 255 does not); at K 9 the 7 x 7 stage's
#: variant at 168 (184 B of spills in fp32) and at 200 (none; the default from K 9).
REGISTER_BACKWARD_CASES = [((64, 40, 7, 7), 2, 5, 1, s, True, Tuning(registers=True))
                           for s in ("float32", "bfloat16")]
REGISTER_BACKWARD_CASES += [((32, 6, 5, 6), 1, 3, 2, "float16", False, Tuning(registers=True))]
REGISTER_BACKWARD_CASES += [((96, 5, 7, 7), 2, 5, 1, "float32", True,
                             Tuning(registers=True, max_registers=cap)) for cap in (168, 255)]
REGISTER_BACKWARD_CASES += [((64, 6, 7, 7), 2, 9, 1, s, True,
                             Tuning(registers=True, max_registers=cap))
                            for s in ("float32", "bfloat16") for cap in (168, 200)]
REGISTER_BACKWARD_CASES = [c for c in REGISTER_BACKWARD_CASES if c[2] in KERNEL_SIZES]


@pytest.mark.parametrize("shape,levels,k,stride,storage,bias,tuning", REGISTER_BACKWARD_CASES)
def test_register_backward_matches_oracle(shape, levels, k, stride, storage, bias, tuning):
    problem = Problem(*shape, k, levels, stride, storage, bias)
    assert plan_registers(problem, backend().shared_limit, tuning, True) is not None
    run_case(shape, levels, k, stride, storage, bias=bias, tuning=tuning)


#: The lane kernels, forced (the weight gradients with dx from the forward kernels, and
#: the forward): one and two threads per plane, the 14 x 14 stage's plane, odd planes
#: whose grids need the padded row and column, every level count up to a 1 x 1 grid,
#: several chunks per channel, 16-bit storage. (The 14 x 14 cases take the dtypes whose
#: variants scripts/build_ptx_cache.sh lanes compiles ahead: minutes each otherwise.)
LANE_CASES = [((64, 6, 14, 14), 3, 5, lanes, s) for lanes in (1, 2)
              for s in ("float32", "bfloat16")]
LANE_CASES += [((32, 5, 13, 11), L, k, 2, "float32") for L in (0, 1, 2, 4) for k in (3, 5)]
LANE_CASES += [((48, 3, 9, 15), 3, 7, 2, "float16"), ((32, 3, 7, 7), 2, 5, 1, "bfloat16"),
               ((16, 2, 16, 16), 4, 9, 2, "float32"), ((32, 2, 1, 9), 3, 3, 1, "float32")]
# (weights' threads a plane, forward's): the forward with four
LANE_CASES += [((64, 6, 14, 14), 3, 5, (2, 4), s) for s in ("float32", "bfloat16")]
LANE_CASES += [((32, 5, 13, 11), 4, 5, (2, 4), "float32"),
               ((16, 3, 3, 5), 2, 3, (2, 4), "float16")]
LANE_CASES = [c for c in LANE_CASES if c[2] in KERNEL_SIZES]


@pytest.mark.parametrize("shape,levels,k,lanes,storage", LANE_CASES)
def test_lane_kernel_matches_oracle(shape, levels, k, lanes, storage):
    """The weight gradients on the lane kernel, and the forward on its forward (the
    backward's dx forward plans with its own tuning: the plane kernel's or tiles).
    ``lanes``: threads a plane of both, or of (the weights, the forward)."""
    weights_lanes, forward_lanes = lanes if isinstance(lanes, tuple) else (lanes, lanes)
    tuning = Tuning(lanes=weights_lanes, lanes_forward=forward_lanes, dx_forward=True)
    problem = Problem(*shape, k, levels, 1, storage, True)
    limits = (backend().shared_limit, backend().max_slots)
    assert plan_lanes(problem, *limits, tuning) is not None
    assert plan_lanes_forward(problem, limits[0], tuning) is not None  # (run_case: no registers)
    run_case(shape, levels, k, 1, storage, tuning=tuning)


#: The lane kernel's weight gradients in groups of planes (LaneSpec.groups, forced):
#: the 14 x 14 stage's plane with two threads and two groups (16-bit storage's
#: candidate default), three groups, one thread a plane, odd planes, four levels.
LANE_GROUP_CASES = [((64, 6, 14, 14), 3, 5, 2, 2, s) for s in ("float32", "bfloat16")]
LANE_GROUP_CASES += [((48, 3, 9, 15), 3, 7, 2, 3, "float16"),
                     ((64, 5, 13, 11), 4, 5, 1, 2, "float32"),
                     ((64, 2, 7, 7), 2, 3, 2, 4, "bfloat16")]
LANE_GROUP_CASES = [c for c in LANE_GROUP_CASES if c[2] in KERNEL_SIZES]


@pytest.mark.parametrize("shape,levels,k,lanes,groups,storage", LANE_GROUP_CASES)
def test_lane_kernel_groups_match_oracle(shape, levels, k, lanes, groups, storage):
    """The weight gradients on the lane kernel, a block taking ``groups`` groups of
    planes in turn (each later group adds to the block's partial)."""
    tuning = Tuning(lanes=lanes, lane_groups=groups, dx_forward=True)
    problem = Problem(*shape, k, levels, 1, storage, True)
    launch = plan_lanes(problem, backend().shared_limit, backend().max_slots, tuning)
    assert launch is not None and launch.spec.groups == groups
    run_case(shape, levels, k, 1, storage, tuning=tuning)


#: The weights-only plane kernel on register blocks (Tuning(blocked_weights=True)):
#: the 56 x 56 and 28 x 28 stages' planes (fewer channels), odd planes whose grids have
#: padding, K 3 and 7 (on 64-thread planes: 32 threads are too few for its blocks).
BLOCKED_CASES = [((4, 8, 56, 56), 5, 5, s, None) for s in ("float32", "bfloat16")]
BLOCKED_CASES += [((6, 16, 28, 28), 4, 5, "float16", None),
                  ((5, 6, 27, 31), 4, 3, "float32", None),
                  ((3, 4, 21, 19), 3, 7, "bfloat16", 64),
                  ((4, 3, 55, 57), 5, 5, "float32", None)]
BLOCKED_CASES = [c for c in BLOCKED_CASES if c[2] in KERNEL_SIZES]


@pytest.mark.parametrize("shape,levels,k,storage,threads", BLOCKED_CASES)
def test_blocked_weights_match_oracle(shape, levels, k, storage, threads):
    """The weight gradients on register blocks (``PlaneSpec.blocked``), against the oracle."""
    tuning = Tuning(blocked_weights=True, dx_forward=True, lanes=0, threads=threads)
    problem = Problem(*shape, k, levels, 1, storage, True)
    spec = plan_plane(problem, True, backend().shared_limit, backend().max_slots, tuning).spec
    assert spec.blocked
    run_case(shape, levels, k, 1, storage, tuning=tuning)


@pytest.mark.parametrize("shape", [(2, 3, 17, 23), (3, 5, 33, 31)])
def test_without_bias(shape):
    run_case(shape, 3, 5, 1, "float32", bias=False)
    run_case(shape, 2, 3, 2, "float16", bias=False)


@pytest.mark.parametrize("k", [1, 11, 15])
def test_other_kernel_sizes(k):
    run_case((2, 3, 19, 21), 3, k, 1, "float32")


def test_public_api_on_cupy():
    import wtconv_cuda as wt
    rng = np.random.default_rng(7)
    w64 = wt.init_weights(6, 5, 3, dtype=np.float64, seed=3)
    x64 = rng.standard_normal((2, 6, 29, 30))
    w = WTConvWeights(*(None if a is None else cupy.asarray(a.astype(np.float32)) for a in w64))
    x = cupy.asarray(x64.astype(np.float32))
    tape = wt.Tape()
    y = wt.forward(x, w, levels=3, tape=tape)
    dy = cupy.asarray(rng.standard_normal(y.shape).astype(np.float32))
    dx, dw = tape.backward(dy)
    wr = WTConvWeights(*(None if a is None else a.astype(np.float32).astype(np.float64) for a in w64))
    xr = x64.astype(np.float32).astype(np.float64)
    y_ref = reference.forward(xr, wr, 3, 1)
    dx_ref, dw_ref = reference.backward(xr, wr, cupy.asnumpy(dy).astype(np.float64), 3, 1)
    assert rel_err(cupy.asnumpy(y).astype(np.float64), y_ref) < 1e-5
    assert rel_err(cupy.asnumpy(dx).astype(np.float64), dx_ref) < 1e-5
    for got, want in zip(dw, dw_ref):
        assert rel_err(cupy.asnumpy(got).astype(np.float64), want) < 1e-5
    # Non-contiguous input is read correctly (copied, never misread).
    xt = cupy.asarray(np.ascontiguousarray(x64.astype(np.float32).transpose(0, 1, 3, 2))).transpose(0, 1, 3, 2)
    assert not xt.flags.c_contiguous
    assert bool(cupy.allclose(wt.forward(xt, w), y, rtol=0, atol=0))


def test_public_api_on_cupy_bfloat16():
    """bfloat16 CuPy arrays (ml_dtypes.bfloat16, as cupy.from_dlpack gives a bfloat16
    tensor) through wtconv_cuda.forward and a Tape: results in bfloat16, against the
    oracle on the rounded inputs; every output written (poisoned pool memory)."""
    import wtconv_cuda as wt
    rng = np.random.default_rng(11)
    bf16 = ml_dtypes.bfloat16

    def device(a):
        host, rounded = to_device(a, "bfloat16")
        return host.view(bf16), rounded

    w64 = wt.init_weights(6, 5, 3, dtype=np.float64, seed=5)
    pairs = [None if a is None else device(a) for a in w64]
    w = WTConvWeights(*(None if p is None else p[0] for p in pairs))
    wr = WTConvWeights(*(None if p is None else p[1] for p in pairs))
    x, xr = device(rng.standard_normal((2, 6, 29, 30)))
    dy, dyr = device(rng.standard_normal((2, 6, 29, 30)))
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.full(1 << 20, 0x7FC1, dtype=cupy.uint16)  # NaN words in the pool's next blocks
    tape = wt.Tape()
    y = wt.forward(x, w, levels=3, tape=tape)
    dx, dw = tape.backward(dy)
    assert y.dtype == bf16 and dx.dtype == bf16 and all(g.dtype == bf16 for g in dw)
    y_ref = reference.forward(xr, wr, 3, 1)
    dx_ref, dw_ref = reference.backward(xr, wr, dyr, 3, 1)
    tol = DTYPES["bfloat16"][1]
    assert rel_err(to_host(y.view(cupy.uint16), "bfloat16"), y_ref) < tol
    assert rel_err(to_host(dx.view(cupy.uint16), "bfloat16"), dx_ref) < tol
    for got, want in zip(dw, dw_ref):
        assert rel_err(to_host(got.view(cupy.uint16), "bfloat16"), want) < tol


def test_float64_rejected_on_gpu():
    import wtconv_cuda as wt
    w = wt.init_weights(2, 3, 1, dtype=np.float64)
    w = WTConvWeights(*(None if a is None else cupy.asarray(a) for a in w))
    with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
        wt.forward(cupy.ones((1, 2, 5, 5)), w)
