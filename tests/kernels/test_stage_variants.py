"""The benchmark's kernel variants, run in numba's simulator on a few planes.

The performance targets are measured on the variants the planner picks for the
ConvNeXt-T stages (64 x C x H x W, K 5, the stage's levels) and the paper's
grid, and a code generation fault in one of them reaches no other test when
its configuration (threads, strips, strip orders, tiles fitted to the plane,
inner levels, lanes) appears nowhere else: the GPU sweep would find it, a
device session later (as it found ``dac84fc``'s strip placement, which these
tests fail). Here the same specs run on a batch of a few planes of one or two
channels (the paper's grid at its 128 x 128 planes). The planner's
absolute size thresholds are scaled by the ratio of the problems' sizes (each
decision then compares the same quantities), the small problem is checked to
plan exactly the stage's specs, and forward and backward run against the
float64 oracle with every output poisoned (NaN bits) first.
"""

import os

import numpy as np
import pytest

from wtconv_cuda import reference
from wtconv_cuda.kernels import launch
from wtconv_cuda.kernels.compiler import distinct
from wtconv_cuda.kernels.launch import Problem, Weights, planned_specs, run_backward, run_forward

from ._backends import RecordingBackend
from ._oracle import backward_errors, from_bits, random_layer, to_bits

simulator = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                               reason="needs numba's CUDA simulator")

#: The configurations: name -> (batch, channels, plane edge, levels), K 5. The
#: ConvNeXt-T stages, and the paper's grid at its smallest planes (whole tiles, a
#: split, the tiled backward: the variants the roofline target is measured on).
STAGES = {"56x56": (64, 96, 56, 5), "28x28": (64, 192, 28, 4), "14x14": (64, 384, 14, 3),
          "7x7": (64, 768, 7, 2), "paper-128-L1": (8, 32, 128, 1),
          "paper-128-L3": (8, 32, 128, 3), "paper-128-L5": (8, 32, 128, 5)}
#: The H200 backend's limits (opt-in shared memory less 1 KB; two slots per SM).
LIMITS = (227 * 1024 - 1024, 2 * 132)
#: Batches tried, smallest first, for the few planes that plan like the stage.
BATCHES = (1, 2, 4, 8, 16, 32)
#: Relative error bounds: float32 arithmetic, and one rounding of each 16-bit output.
TOLERANCE = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 4e-3}


def typed(specs) -> list:
    """Specs with their types (named tuples of different types compare equal when
    their fields do)."""
    return [(type(spec).__name__, spec) for spec in specs]


def stage_specs(stage: Problem, backward: bool) -> list:
    """The distinct specs a pass of ``stage`` launches, in first-launch order."""
    return typed(distinct(planned_specs(stage, backward, *LIMITS)))


def stage_problem(name: str, storage: str) -> Problem:
    batch, channels, edge, levels = STAGES[name]
    return Problem(batch, channels, edge, edge, 5, levels, 1, storage, True)


def scale_thresholds(monkeypatch, ratio: float) -> None:
    """Scale the planner's absolute size thresholds (pixels or elements of the whole
    problem) by ``ratio``, so that a problem ``ratio`` times the size decides alike."""
    monkeypatch.setattr(launch, "SPLIT_MIN_PIXELS", launch.SPLIT_MIN_PIXELS * ratio)
    monkeypatch.setattr(launch, "DX_FORWARD_MIN_ELEMENTS",
                        launch.DX_FORWARD_MIN_ELEMENTS * ratio)
    monkeypatch.setattr(launch, "SPLIT_SMALL_TILES", {
        edge: rule._replace(min_pixels=rule.min_pixels * ratio,
                            inner_max_pixels=rule.inner_max_pixels * ratio)
        for edge, rule in launch.SPLIT_SMALL_TILES.items()})
    launch.clear_plan_caches()


@pytest.fixture
def planner():
    """``plan_like(stage, backward, channels) -> (problem, specs)``: the stage's specs
    (as planned with the thresholds as they are) and the smallest batch in `BATCHES` of
    ``channels`` channels that, with the thresholds scaled, plans exactly those; the
    thresholds stay scaled until the test ends."""
    patches = pytest.MonkeyPatch()

    def plan_like(stage: Problem, backward: bool, channels: int):
        specs = stage_specs(stage, backward)
        for batch in BATCHES:
            small = stage._replace(batch=batch, channels=channels)
            patches.undo()
            scale_thresholds(patches, batch * channels / (stage.batch * stage.channels))
            if stage_specs(small, backward) == specs:
                return small, specs
        pytest.fail(f"no batch of {BATCHES} plans {stage} like the stage: "
                    "a new absolute threshold in the planner? (scale_thresholds)")

    yield plan_like
    patches.undo()
    launch.clear_plan_caches()


def layer(rng, problem: Problem):
    """Random inputs of ``problem`` in its storage (bfloat16 as bits) and their exact
    float64 values: ``(x, dy, weights, x64, dy64, wts64)``."""
    shape = (problem.batch, problem.channels, problem.height, problem.width)
    x32, wts32, _, _ = random_layer(rng, shape, problem.levels, problem.kernel_size, 1,
                                    "float32", True)
    dy32 = rng.standard_normal(shape).astype(np.float32)
    if problem.storage == "bfloat16":
        x, dy = to_bits(x32), to_bits(dy32)
        wts = wts32._replace(**{n: to_bits(a) for n, a in wts32._asdict().items()})
        exact = lambda a: from_bits(a).astype(np.float64)  # noqa: E731
    else:
        dtype = np.dtype(problem.storage)
        x, dy = x32.astype(dtype), dy32.astype(dtype)
        wts = wts32._replace(**{n: a.astype(dtype) for n, a in wts32._asdict().items()})
        exact = lambda a: a.astype(np.float64)  # noqa: E731
    weights = Weights(wts.base_weight, wts.base_bias, wts.base_scale, wts.wavelet_weight,
                      wts.wavelet_scale)
    wts64 = wts._replace(**{n: exact(a) for n, a in wts._asdict().items()})
    return x, dy, weights, exact(x), exact(dy), wts64, exact


def poisoned(shape, storage: str) -> np.ndarray:
    """An output array of ``storage`` filled with NaN (bfloat16: its bits)."""
    if storage == "bfloat16":
        return np.full(shape, 0xFFFF, np.uint16)
    return np.full(shape, np.nan, np.dtype(storage))


#: (configuration, storage, channels). On the ConvNeXt-T stages also float16, and two
#: channels in float32 (a block's channel from its index); the paper's planes (its
#: L 5 backward takes 20-50 s here) in float32 and bfloat16, one channel.
CASES = [(name, storage, 2 if storage == "float32" and not paper else 1)
         for name, paper in ((n, n.startswith("paper")) for n in STAGES)
         for storage in ("float32", "bfloat16", "float16") if not (paper and storage == "float16")]


@simulator
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("name,storage,channels", CASES,
                         ids=[f"{n}-{s}" for n, s, _ in CASES])
def test_stage_variants_match_oracle(rng, planner, name, storage, channels, backward):
    """One pass of the configuration on the few planes that plan like it: the same
    specs launched, every output (and gradient) written and within the oracle's bound."""
    problem, specs = planner(stage_problem(name, storage), backward, channels)
    x, dy, weights, x64, dy64, wts64, exact = layer(rng, problem)
    backend = RecordingBackend(shared_limit=LIMITS[0], max_slots=LIMITS[1])
    if backward:
        dx = poisoned(x.shape, storage)
        grads = Weights(*(poisoned(a.shape, storage) for a in weights))
        run_backward(backend, problem, x, dy, dx, weights, grads)
        errors = backward_errors(x64, wts64, dy64, problem.levels, 1, exact(dx),
                                 Weights(*(exact(g) for g in grads)), True)
    else:
        y = poisoned(x.shape, storage)
        run_forward(backend, problem, x, y, weights)
        got, want = exact(y), reference.forward(x64, wts64, problem.levels, 1)
        assert np.isfinite(got).all(), "unwritten (NaN) outputs"
        errors = {"y": np.linalg.norm(got - want) / np.linalg.norm(want)}
    assert typed(distinct(backend.kernels)) == specs
    bad = {output: e for output, e in errors.items() if not e < TOLERANCE[storage]}
    assert not bad, bad
