"""The register kernel (one thread per tiny plane) in numba's CUDA simulator.

Forward and backward against the float64 oracle on odd and tiny planes, level
counts up to past a 1 x 1 grid, strides 1 to 3, float32 and float16, with and
without bias; outputs are poisoned with NaN before each launch. The planner's
rules for when a pass takes this kernel are checked on the CPU.
"""

import os
import re

import numpy as np
import pytest

from wtconv_cuda import reference
from wtconv_cuda.kernels.launch import (
    REGISTER_FORCE_MAX_PIXELS, REGISTER_MAX_PIXELS, REGISTER_THREADS, Problem, RegisterSpec,
    Tuning, Weights, plan_registers, planned_specs, run_backward, run_forward, work_buffers,
)
from wtconv_cuda.kernels.codegen import _Emitter
from wtconv_cuda.kernels.registers import (
    STAGING_LOADS, STAGING_LOADS_BACKWARD, _emit_staging_load, grids, register_kernel_source,
)

from ._backends import RecordingBackend
from ._oracle import backward_errors, random_layer

simulator = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                               reason="needs numba's CUDA simulator")

TOLERANCE = {"float32": 2e-6, "float16": 2e-3}
LIMIT = 227 * 1024  # dynamic shared memory of a block, bytes


def forward_error(rng, shape, levels, k, stride, storage="float32", bias=True,
                  tuning=Tuning(registers=True, threads=32)):
    """Run the forward through the planner; returns the relative error against the oracle."""
    x, wts, weights, problem = random_layer(rng, shape, levels, k, stride, storage, bias)
    b, c, h, w = shape
    assert plan_registers(problem, LIMIT, tuning) is not None
    backend = RecordingBackend()
    y = np.full((b, c, -(-h // stride), -(-w // stride)), np.nan, x.dtype)
    x_before = x.copy()
    run_forward(backend, problem, x, y, weights, tuning)
    assert [type(spec) for spec in backend.kernels] == [RegisterSpec]
    np.testing.assert_array_equal(x, x_before)
    assert np.isfinite(y).all(), "unwritten (NaN) outputs"
    want = reference.forward(x, wts, levels, stride)
    return np.linalg.norm(y.astype(np.float64) - want) / np.linalg.norm(want)


@simulator
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("levels", [0, 1, 2, 3])
def test_float32_matches_oracle(rng, levels, k, stride):
    # 35 planes: two blocks of 32 threads, the second one mostly past the end
    assert forward_error(rng, (7, 5, 7, 7), levels, k, stride) < TOLERANCE["float32"]


@simulator
@pytest.mark.parametrize("shape,levels,k,stride", [
    ((2, 3, 5, 6), 2, 3, 1),   # even width, odd height
    ((1, 2, 1, 7), 2, 5, 1),   # a single row: level grids 1 x 4, 1 x 2
    ((2, 1, 3, 2), 4, 3, 1),   # levels past a 1 x 1 grid
    ((1, 2, 9, 9), 3, 7, 3),   # stride 3, a taps window wider than the coarse grids
])
def test_odd_planes_match_oracle(rng, shape, levels, k, stride):
    assert forward_error(rng, shape, levels, k, stride) < TOLERANCE["float32"]


@simulator
def test_float16_without_bias(rng):
    err = forward_error(rng, (3, 2, 6, 7), 2, 5, 1, "float16", bias=False)
    assert err < TOLERANCE["float16"]


@simulator
def test_default_planner_takes_it_for_tiny_planes(rng):
    """The default tuning runs a 7 x 7 forward on the register kernel."""
    assert forward_error(rng, (2, 3, 7, 7), 2, 5, 1, tuning=Tuning()) < TOLERANCE["float32"]


def test_planner_rules():
    small = Problem(64, 768, 7, 7, 5, 2, 1, "float32", True)
    launch = plan_registers(small, LIMIT)
    assert launch.spec == RegisterSpec(5, "float32", 7, 7, 2, 1, REGISTER_THREADS, 168)
    assert launch.grid == 64 * 768 // REGISTER_THREADS
    assert launch.shared_bytes == 4 * REGISTER_THREADS * (49 + 49)
    assert planned_specs(small, False, LIMIT, 264) == [launch.spec]
    assert work_buffers(small, False, LIMIT, 264) == ()
    side = int(REGISTER_MAX_PIXELS ** 0.5)
    assert plan_registers(small._replace(height=side, width=side), LIMIT) is not None
    assert plan_registers(small._replace(height=side + 1, width=side), LIMIT) is None
    # any launch-shape field of the other kernels selects them
    for tuning in (Tuning(threads=16), Tuning(planes_per_block=2), Tuning(tiles=False),
                   Tuning(registers=False)):
        assert plan_registers(small, LIMIT, tuning) is None
    # the block's planes must fit in shared memory
    assert plan_registers(small, launch.shared_bytes - 1) is None
    big = small._replace(height=16, width=16)
    assert plan_registers(big, LIMIT) is None
    assert plan_registers(big, LIMIT, Tuning(registers=True)) is None  # 263 KB at 128 threads
    assert plan_registers(big, LIMIT, Tuning(registers=True, threads=64)).spec.height == 16
    assert plan_registers(small._replace(height=REGISTER_FORCE_MAX_PIXELS + 1, width=1), LIMIT,
                          Tuning(registers=True)) is None
    forced = plan_registers(small, LIMIT, Tuning(registers=True, threads=64, max_registers=255))
    assert (forced.block, forced.spec.max_registers, forced.grid) == (64, 255, 768)


def test_register_caps_by_pass_and_kernel_size():
    """The forward is capped at 168 registers at every K; the backward at 168 up to K 7
    and at 200 from K 9 (it spilled at 168 there); a Tuning cap overrides both."""
    from wtconv_cuda.kernels import launch
    for k, backward_cap in ((3, 168), (5, 168), (7, 168), (9, 200), (11, 200)):
        problem = Problem(64, 768, 7, 7, k, 2, 1, "float32", True)
        assert plan_registers(problem, LIMIT).spec.max_registers == 168, k
        back = plan_registers(problem, LIMIT, backward=True)
        assert back.spec.backward and back.spec.max_registers == backward_cap, k
        forced = plan_registers(problem, LIMIT, Tuning(max_registers=128), backward=True)
        assert forced.spec.max_registers == 128, k
    assert launch.REGISTER_BACKWARD_CAP_K9 == 200 and launch.REGISTER_BACKWARD_CAP == 168


def test_grids_halve_rounding_up():
    assert grids(7, 7, 3) == [(7, 7), (4, 4), (2, 2), (1, 1)]
    assert grids(1, 5, 2) == [(1, 5), (1, 3), (1, 2)]


def test_generated_code_skips_padding():
    """At 7 x 7, K = 5 level 2 is a 2 x 2 grid: each of its 4 coefficients sees 4 of
    the 25 taps, so the subband needs 16 products, not 100."""
    source = register_kernel_source(RegisterSpec(5, "float32", 7, 7, 2))
    products = re.findall(r"^ *z2_1_\d_\d_\d_\d = f_z2_1_", source, re.MULTILINE)
    assert len(products) == 16
    # level 1 (4 x 4): 14 x 14 of the 5 x 5 x 4 x 4 products per subband
    assert len(re.findall(r"^ *z1_3_\d_\d_\d_\d = ", source, re.MULTILINE)) == 196
    assert source.count("syncthreads") == 3  # plane table, staged input, staged output
    for bad in (RegisterSpec(4, "float32", 7, 7, 1), RegisterSpec(3, "int8", 7, 7, 1),
                RegisterSpec(3, "float32", 0, 7, 1), RegisterSpec(3, "float32", 7, 7, 1,
                                                                   threads=48)):
        with pytest.raises(ValueError):
            register_kernel_source(bad)


class _Recorder(dict):
    """Stands for a global array (reading ``[i]`` gives ``i``) and for the shared
    buffer (each word written once)."""

    def __getitem__(self, index):
        return index

    def __setitem__(self, index, value):
        assert index not in self, f"word {index} written twice"
        super().__setitem__(index, value)


@pytest.mark.parametrize("ahead", [STAGING_LOADS, STAGING_LOADS_BACKWARD])
@pytest.mark.parametrize("threads,pixels", [(32, 49), (128, 49), (64, 64), (32, 7), (96, 30)])
def test_staging_load_moves_every_element_once(threads, pixels, ahead):
    """Run the generated staging load in Python for every thread of a block: each block
    plane's pixel lands once in its shared word, read from plane ``A[pl]`` of the array,
    and ``ahead`` loads come before the first shared store."""
    e = _Emitter()
    pitch, base = pixels + 3, 17
    _emit_staging_load(e, "float32", threads, pixels, pitch, base, "x", ahead)
    code = e.text()
    table = [(5 * pl + 3) % threads for pl in range(threads)]  # a permutation of the planes
    shared = _Recorder()
    for t in range(threads):
        exec(code, {"t": t, "A": table, "x": _Recorder(), "S": shared, "int64": int})
    want = {base + pl * pitch + px: table[pl] * pixels + px
            for pl in range(threads) for px in range(pixels)}
    assert dict(shared) == want
    lines = code.splitlines()
    first_store = next(i for i, line in enumerate(lines) if line.startswith("S["))
    assert sum("= x[" in line for line in lines[:first_store]) == min(ahead, pixels)
    assert "for " not in code and "//" in lines[0]  # one division per thread, no loop


def register_backward_errors(rng, shape, levels, k, stride, storage="float32", bias=True,
                             tuning=Tuning(registers=True)):
    """The backward through the planner: relative errors of ``dx`` and every gradient."""
    x, wts, weights, problem = random_layer(rng, shape, levels, k, stride, storage, bias)
    b, c, h, w = shape
    assert plan_registers(problem, LIMIT, tuning, True) is not None
    dy = rng.standard_normal((b, c, -(-h // stride), -(-w // stride))).astype(x.dtype)
    dx = np.full(shape, np.nan, x.dtype)
    grads = Weights(*(np.full(a.shape, np.nan, x.dtype) for a in weights))
    backend = RecordingBackend()
    x_before, dy_before = x.copy(), dy.copy()
    run_backward(backend, problem, x, dy, dx, weights, grads, tuning)
    assert [type(spec) for spec in backend.kernels] == [RegisterSpec]
    assert backend.requests == []  # no partials: the block writes the gradients
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(dy, dy_before)
    return backward_errors(x, wts, dy, levels, stride, dx, grads, bias)


@simulator
@pytest.mark.parametrize("shape,levels,k,stride,tuning", [
    ((32, 3, 7, 7), 2, 5, 1, Tuning(registers=True)),        # 4 channels' runs, 1 block
    ((32, 5, 5, 6), 1, 3, 2, Tuning(registers=True, threads=64)),  # 3 blocks, the last half
    ((64, 2, 3, 2), 3, 3, 1, Tuning()),                       # the default; past a 1 x 1 grid
])
def test_backward_matches_oracle(rng, shape, levels, k, stride, tuning):
    errors = register_backward_errors(rng, shape, levels, k, stride, tuning=tuning)
    bad = {n: e for n, e in errors.items() if not e < TOLERANCE["float32"]}
    assert not bad, bad


@simulator
def test_backward_float16_without_bias(rng):
    errors = register_backward_errors(rng, (32, 2, 4, 5), 2, 3, 1, "float16", bias=False)
    bad = {n: e for n, e in errors.items() if not e < TOLERANCE["float16"]}
    assert not bad, bad


def test_backward_planner_rules():
    p = Problem(64, 768, 7, 7, 5, 2, 1, "float32", True)
    launch = plan_registers(p, LIMIT, Tuning(), True)
    assert (launch.block, launch.spec.backward, launch.grid) == (128, True, 64 * 768 // 128)
    # dy, x and dx planes only: the warps' transpose tiles and sums reuse dx's area once it
    # is stored, so three 128-thread blocks fit in an SM's 228 KB of shared memory
    assert launch.shared_bytes == 4 * 3 * 128 * 49
    # the batch is a run-time value: B = 32 and 128 share the variant
    assert plan_registers(p._replace(batch=32), LIMIT, Tuning(), True).spec == launch.spec
    assert planned_specs(p, True, LIMIT, 264) == [launch.spec]
    assert work_buffers(p, True, LIMIT, 264) == ()
    assert plan_registers(p._replace(batch=192), LIMIT, Tuning(), True).block == 192
    for batch in (1, 48, 288):  # not a multiple of 32, or a channel too large for a block
        assert plan_registers(p._replace(batch=batch), LIMIT, Tuning(), True) is None
    assert plan_registers(p, LIMIT, Tuning(registers=True, threads=96), True) is None
    assert plan_registers(p, LIMIT, Tuning(registers=False), True) is None
