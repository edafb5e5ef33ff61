"""Issue 7 on a real GPU: devices, host/device mixes, >2^31 elements, streams,
memory, compilation and its cache.

Runs only where ``WTCONV_TEST_GPU=1`` and CuPy sees a GPU (like
``test_gpu_kernels.py``). The CPU-runnable half of issue 7 is in
``tests/reliability``; ``scripts/sanitizer.sh`` runs compute-sanitizer over
``tests/gpu/sanitize_main.py``.

Knobs: ``WTCONV_TEST_HUGE=0`` skips the >2^31-element tests (they need about
60 GB of GPU memory and a minute or two); ``WTCONV_TEST_HUGE_PLANE=1`` adds a
single 46341 x 46341 plane (one block walks all of it: several minutes).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

if os.environ.get("WTCONV_TEST_GPU") != "1":
    pytest.skip("GPU tests run with WTCONV_TEST_GPU=1", allow_module_level=True)

cupy = pytest.importorskip("cupy")

import wtconv_cuda as wt  # noqa: E402
from wtconv_cuda import Saved, WTConvWeights, gpu, reference  # noqa: E402
from wtconv_cuda.bindings import cupy as wtcupy  # noqa: E402
from wtconv_cuda.kernels import compiler  # noqa: E402
from wtconv_cuda.kernels.codegen import PlaneSpec  # noqa: E402
from wtconv_cuda.kernels.launch import (  # noqa: E402
    CupyBackend, Problem, Weights, plan_plane, run_backward, run_forward,
)

from ..conftest import random_weights  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def to_gpu(w: WTConvWeights, dtype=np.float32, device=0) -> WTConvWeights:
    with cupy.cuda.Device(device):
        return WTConvWeights(*(None if a is None else cupy.asarray(np.asarray(a, dtype))
                               for a in w))


def host64(a) -> np.ndarray:
    return cupy.asnumpy(a).astype(np.float64)


def weights64(w: WTConvWeights) -> WTConvWeights:
    return WTConvWeights(*(None if a is None else host64(a) for a in w))


def inputs(seed, shape, k, levels, dtype=np.float32, stride=1):
    rng = np.random.default_rng(seed)
    b, c, h, width = shape
    x = cupy.asarray(rng.standard_normal(shape).astype(dtype))
    w = to_gpu(random_weights(rng, c, k, levels), dtype)
    dy = cupy.asarray(rng.standard_normal((b, c, -(-h // stride), -(-width // stride)))
                      .astype(dtype))
    return x, w, dy


def rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.isfinite(got).all()
    scale = float(np.max(np.abs(want), initial=0.0))
    return float(np.max(np.abs(got - want), initial=0.0)) / (scale if scale > 0 else 1.0)


# ---------------------------------------------------------------------------
# Devices, host/device mixes, dtypes, layouts
# ---------------------------------------------------------------------------


@pytest.mark.skipif(cupy.cuda.runtime.getDeviceCount() < 2, reason="needs two GPUs")
def test_arrays_on_different_devices_are_rejected():
    x, w, dy = inputs(0, (2, 3, 17, 13), 3, 2)
    w1 = to_gpu(weights64(w), device=1)
    with pytest.raises(ValueError, match="weights.base_weight is on CUDA device 1 but x is on "
                                         "CUDA device 0"):
        wt.forward(x, w1)
    with pytest.raises(ValueError, match="weights.base_weight is on CUDA device 1"):
        wtcupy.forward(x, w1)
    mixed = w._replace(wavelet_scale=w1.wavelet_scale)
    with pytest.raises(ValueError, match="weights.wavelet_scale is on CUDA device 1"):
        wt.forward(x, mixed)
    with cupy.cuda.Device(1):
        dy1 = cupy.asarray(dy)
    with pytest.raises(ValueError, match="dy is on CUDA device 1 but x is on CUDA device 0"):
        wt.backward(Saved(x, w, 2, 1), dy1)
    # The same call entirely on device 1 works, while device 0 is current.
    with cupy.cuda.Device(1):
        x1 = cupy.asarray(x)
    y1 = wt.forward(x1, w1)
    assert y1.device.id == 1
    np.testing.assert_array_equal(cupy.asnumpy(y1), cupy.asnumpy(wt.forward(x, w)))


def test_host_device_mixes_are_rejected():
    x, w, dy = inputs(1, (2, 3, 17, 13), 3, 2)
    xh, wh, dyh = cupy.asnumpy(x), weights64(w), cupy.asnumpy(dy)
    with pytest.raises(TypeError, match="weights.base_weight must be a numpy array like x, got "
                                        "cupy"):
        wt.forward(xh, w)
    with pytest.raises(TypeError, match="weights.base_weight must be a cupy array like x, got "
                                        "numpy"):
        wt.forward(x, WTConvWeights(*(None if a is None else a.astype(np.float32) for a in wh)))
    with pytest.raises(TypeError, match="weights.base_bias must be a cupy array like x, got "
                                        "numpy"):
        wt.forward(x, w._replace(base_bias=cupy.asnumpy(w.base_bias)))
    with pytest.raises(TypeError, match="dy must be a cupy array like x, got numpy"):
        wt.backward(Saved(x, w, 2, 1), dyh)
    with pytest.raises(TypeError, match="dy must be a numpy array like x, got cupy"):
        wt.backward(Saved(xh, wh, 2, 1), dy)
    with pytest.raises(TypeError, match=r"x must be a cupy.ndarray, got numpy.ndarray"):
        wtcupy.forward(xh, w)
    # DLPack: a host weight is either refused or copied to the device, never misread.
    try:
        y = wtcupy.forward_dlpack(x, w._replace(base_scale=cupy.asnumpy(w.base_scale)))
    except (TypeError, ValueError, BufferError, RuntimeError) as exc:
        print(f"forward_dlpack with a host weight: {type(exc).__name__}: {exc}")
    else:
        assert bool(cupy.array_equal(y, wt.forward(x, w)))


def test_unsupported_dtypes_on_the_gpu():
    x, w, _ = inputs(2, (1, 2, 9, 7), 3, 1)
    w64 = WTConvWeights(*(None if a is None else a.astype(cupy.float64) for a in w))
    with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
        wt.forward(x.astype(cupy.float64), w64)
    with pytest.raises(TypeError, match="weights.base_weight has dtype float64 but x has dtype "
                                        "float32"):
        wt.forward(x, w64)
    with pytest.raises(TypeError, match="x must have dtype float16, bfloat16, float32 or "
                                        "float64, got int32"):
        wt.forward(x.astype(cupy.int32), WTConvWeights(*(None if a is None else
                                                         a.astype(cupy.int32) for a in w)))
    with pytest.raises(TypeError, match="dy has dtype float16 but x has dtype float32"):
        wt.backward(Saved(x, w, 1, 1), x.astype(cupy.float16))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_non_contiguous_and_negative_stride_inputs(dtype):
    x, w, dy = inputs(3, (2, 3, 19, 14), 5, 3, dtype)
    tape = wt.Tape()
    y = wt.forward(x, w, tape=tape)
    dx, dw = tape.backward(dy)
    views = {
        "negative": cupy.ascontiguousarray(x[..., ::-1, ::-1])[..., ::-1, ::-1],
        "transposed": cupy.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2),
        "strided": _strided(x),
        "channels-last": cupy.ascontiguousarray(cupy.moveaxis(x, 1, -1)).transpose(0, 3, 1, 2),
    }
    wv = w._replace(base_weight=cupy.ascontiguousarray(w.base_weight[:, ::-1])[:, ::-1],
                    wavelet_weight=_strided(w.wavelet_weight))
    for name, xv in views.items():
        assert not xv.flags.c_contiguous, name
        before = xv.copy()
        tv = wt.Tape()
        assert bool(cupy.array_equal(wt.forward(xv, wv, tape=tv), y)), name
        dxv, dwv = tv.backward(cupy.ascontiguousarray(dy[..., ::-1])[..., ::-1])
        assert bool(cupy.array_equal(dxv, dx)), name
        for g, want in zip(dwv, dw):
            assert bool(cupy.array_equal(g, want)), name
        assert bool(cupy.array_equal(xv, before)), name


def _strided(a):
    big = cupy.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def test_empty_batch_on_the_gpu():
    x, w, _ = inputs(4, (0, 3, 9, 7), 3, 2)
    tape = wt.Tape()
    y = wt.forward(x, w, stride=2, tape=tape)
    assert y.shape == (0, 3, 5, 4) and y.dtype == cupy.float32
    dx, dw = tape.backward(cupy.zeros(y.shape, cupy.float32))
    assert dx.shape == x.shape
    for g, p in zip(dw, w):
        assert g.shape == p.shape and not bool(g.any())


# ---------------------------------------------------------------------------
# More than 2^31 elements
# ---------------------------------------------------------------------------

HUGE = os.environ.get("WTCONV_TEST_HUGE", "1") == "1"
HUGE_SHAPES = [pytest.param((2, 8, 16384, 8193), id="16-planes-2^31+")]
if os.environ.get("WTCONV_TEST_HUGE_PLANE") == "1":
    HUGE_SHAPES.append(pytest.param((1, 1, 46341, 46341), id="one-plane-2^31+"))


def _free_bytes() -> int:
    cupy.get_default_memory_pool().free_all_blocks()
    return cupy.cuda.runtime.memGetInfo()[0]


def _fill_random(shape, seed):
    """float32 N(0, 1), one plane at a time (no single generator call over 2^31 elements)."""
    a = cupy.empty(shape, cupy.float32)
    rng = cupy.random.default_rng(seed)
    for b in range(shape[0]):
        for c in range(shape[1]):
            a[b, c] = rng.standard_normal(shape[2:], dtype=cupy.float32)
    return a


def _crop_oracle(fn, arrays, rows, cols, shape, levels, k):
    """Evaluate a local oracle ``fn`` on a margin-extended crop and keep the centre.

    Output pixel ``p`` depends only on inputs in ``[p - m, p + m)`` with
    ``m = (R + 1) 2^L``; a crop that starts on a multiple of ``2^L`` has the
    same coefficient grids (shifted), so its centre is exact.
    """
    h, w = shape[-2:]
    m = ((k - 1) // 2 + 1) * 2 ** levels
    r0, r1 = rows
    c0, c1 = cols
    assert r0 % 2 ** levels == 0 and c0 % 2 ** levels == 0
    er0, er1 = max(0, r0 - m), min(h, r1 + m)
    ec0, ec1 = max(0, c0 - m), min(w, c1 + m)
    host = [host64(a[..., er0:er1, ec0:ec1]) for a in arrays]
    out = fn(*host)
    return out[..., r0 - er0:r1 - er0, c0 - ec0:c1 - ec0]


def _plane_rows(v, lo, hi):
    """Rows ``lo:hi`` of plane ``v`` in float64, zero outside the plane."""
    n = v.shape[0]
    block = v[max(0, lo):max(0, min(n, hi))].astype(cupy.float64)
    return cupy.pad(block, ((max(0, lo) - lo, hi - lo - (max(0, lo) - lo) - block.shape[0]),
                            (0, 0)))


def _subband_rows(v, k, lo, hi):
    """Rows ``lo:hi`` of level-1 Haar subband ``k`` of plane ``v`` (float64, zero outside)."""
    block = _plane_rows(v, 2 * lo, 2 * hi)
    if block.shape[1] % 2:
        block = cupy.pad(block, ((0, 0), (0, 1)))
    a, b, c, d = block[0::2, 0::2], block[0::2, 1::2], block[1::2, 0::2], block[1::2, 1::2]
    signs = [(1, 1, 1, 1), (1, 1, -1, -1), (1, -1, 1, -1), (1, -1, -1, 1)][k]
    return (signs[0] * a + signs[1] * b + signs[2] * c + signs[3] * d) / 2


def _correlate_taps(rows_u, rows_g, h, k, chunk=2048):
    """``out[p, q] = sum_ij u[i + p - R, j + q - R] g[i, j]`` (zero outside) in float64.

    ``rows_u(lo, hi)`` / ``rows_g(lo, hi)`` give rows of the two grids (``h`` rows each),
    zero outside; the sum runs over row chunks to bound the temporaries.
    """
    r = (k - 1) // 2
    out = np.zeros((k, k))
    for s in range(0, h, chunk):
        e = min(h, s + chunk)
        g = rows_g(s, e)
        u = cupy.pad(rows_u(s - r, e + r), ((0, 0), (r, r)))
        width = g.shape[1]
        for p in range(k):
            for q in range(k):
                out[p, q] += float(cupy.sum(u[p:p + e - s, q:q + width] * g))
        del g, u
    return out


@pytest.mark.skipif(not HUGE, reason="WTCONV_TEST_HUGE=0")
@pytest.mark.parametrize("shape", HUGE_SHAPES)
def test_more_than_2_31_elements(shape):
    b, c, h, w = shape
    k, levels = 3, 2
    n = b * c * h * w
    assert n > 2**31
    problem = Problem(b, c, h, w, k, levels, 1, "float32", True)
    backend = CupyBackend()
    launch = plan_plane(problem, False, backend.shared_limit, backend.max_slots)
    scratch = plan_plane(problem, True, backend.shared_limit, backend.max_slots).scratch_floats
    need = 4 * n * 4 + 4 * scratch + 8 * 2**30  # x, y, dy, dx, work space, temporaries
    if _free_bytes() < need:
        pytest.skip(f"needs about {need / 2**30:.0f} GiB of free GPU memory")
    rng = np.random.default_rng(11)
    w64 = random_weights(rng, c, k, levels)
    w64 = WTConvWeights(*(a.astype(np.float32).astype(np.float64) for a in w64))
    wdev = to_gpu(w64)
    kernel_w = Weights(*wdev)

    x = _fill_random(shape, 1)
    y = cupy.full(shape, cupy.nan, cupy.float32)
    run_forward(backend, problem, x, y, kernel_w)
    cupy.cuda.Device().synchronize()
    assert bool(cupy.isfinite(y).all()), "unwritten or corrupted outputs"

    last = (b - 1, c - 1)
    step = 2 ** levels

    def down(v):  # crops start on the coarsest grid's pixel boundaries
        return max(0, v) // step * step

    flat_row = (2**31 - (b * c - 1) * h * w) // w  # the row of the last plane holding 2^31
    crops = [  # (plane, rows, cols)
        ((0, 0), (0, 64), (0, 64)),
        ((0, 0), (0, 4), (0, w)),
        ((b // 2, c // 2), (down(h // 2), down(h // 2) + 32), (down(w // 2), down(w // 2) + 64)),
        (last, (down(h - 4), h), (0, w)),
        (last, (down(h - 64), h), (down(w - 64), w)),
    ]
    if 0 <= flat_row < h:
        crops.append((last, (down(flat_row - 8), min(h, flat_row + 8)), (0, w)))

    def forward_plane(xp, channel):
        wc = _channel(w64, channel)
        return reference.forward(xp[None, None], wc, levels, 1)[0, 0]

    for (pb, pc), rows, cols in crops:
        want = _crop_oracle(lambda xp: forward_plane(xp, pc), [x[pb, pc]], rows, cols,
                            shape, levels, k)
        got = host64(y[pb, pc, rows[0]:rows[1], cols[0]:cols[1]])
        assert rel(got, want) < 1e-5, ((pb, pc), rows, cols)
    del y
    gc.collect()

    dy = _fill_random(shape, 2)
    dx = cupy.full(shape, cupy.nan, cupy.float32)
    grads = Weights(*(cupy.full(a.shape, cupy.nan, cupy.float32) for a in wdev))
    run_backward(backend, problem, x, dy, dx, kernel_w, grads)
    cupy.cuda.Device().synchronize()
    assert bool(cupy.isfinite(dx).all())

    def dx_plane(gp, channel):
        wc = _channel(w64, channel)
        zeros = np.zeros_like(gp)[None, None]
        return reference.backward(zeros, wc, gp[None, None], levels, 1)[0][0, 0]

    for (pb, pc), rows, cols in crops:
        want = _crop_oracle(lambda gp: dx_plane(gp, pc), [dy[pb, pc]], rows, cols,
                            shape, levels, k)
        got = host64(dx[pb, pc, rows[0]:rows[1], cols[0]:cols[1]])
        assert rel(got, want) < 1e-5, ("dx", (pb, pc), rows, cols)
    del dx
    gc.collect()

    # Weight gradients are global sums: float64 reductions on the GPU, per plane.
    d_eff0 = np.zeros((c, k, k))
    d_eff1 = np.zeros((c, 4, k, k))
    g_sum = np.zeros(c)
    h1 = -(-h // 2)
    for pc in range(c):
        for pb in range(b):
            xp, gp = x[pb, pc], dy[pb, pc]
            d_eff0[pc] += _correlate_taps(lambda lo, hi: _plane_rows(xp, lo, hi),
                                          lambda lo, hi: _plane_rows(gp, lo, hi), h, k)
            g_sum[pc] += float(gp.sum(dtype=cupy.float64))
            for sub in range(4):
                d_eff1[pc, sub] += _correlate_taps(
                    lambda lo, hi: _subband_rows(xp, sub, lo, hi),
                    lambda lo, hi: _subband_rows(gp, sub, lo, hi), h1, k)
    s0, bias = w64.base_scale, w64.base_bias
    want = {
        "base_weight": s0[:, None, None] * d_eff0,
        "base_bias": s0 * g_sum,
        "base_scale": np.einsum("cpq,cpq->c", w64.base_weight, d_eff0) + bias * g_sum,
        "level1_weight": w64.wavelet_scale[0][..., None, None] * d_eff1,
    }
    got = {
        "base_weight": host64(grads.base_weight), "base_bias": host64(grads.base_bias),
        "base_scale": host64(grads.base_scale), "level1_weight": host64(grads.wavelet_weight[0]),
    }
    for name in want:
        assert rel(got[name], want[name]) < 2e-3, (name, rel(got[name], want[name]))
    assert bool(cupy.isfinite(grads.wavelet_weight).all() & cupy.isfinite(grads.wavelet_scale)
                .all())
    print(f"{shape}: variant {launch.spec}, grid {launch.grid}, "
          f"scratch {launch.scratch_floats * 4 / 2**30:.1f} GiB")


def _channel(w: WTConvWeights, c: int) -> WTConvWeights:
    return WTConvWeights(w.base_weight[c:c + 1], w.base_bias[c:c + 1], w.base_scale[c:c + 1],
                         w.wavelet_weight[:, c:c + 1], w.wavelet_scale[:, c:c + 1])


# ---------------------------------------------------------------------------
# Concurrency, memory, compilation
# ---------------------------------------------------------------------------

_SPIN = None


def spin(cycles: int) -> None:
    """Keep the current stream busy for ``cycles`` GPU clock cycles."""
    global _SPIN
    if _SPIN is None:
        _SPIN = cupy.RawKernel(r"""
            extern "C" __global__ void spin(long long cycles) {
                long long start = clock64();
                while (clock64() - start < cycles) { }
            }""", "spin")
    _SPIN((1,), (1,), (np.int64(cycles),))


def test_two_threads_on_two_streams():
    """Each thread queues a slow producer, then the layer, on its own non-blocking stream.
    A launch on any other stream would read the input before it is written."""
    cases = [((4, 16, 56, 56), 7, 3, 1), ((2, 8, 33, 31), 7, 2, 2)]  # K = 7: first use here
    expected, prepared = [], []
    for i, (shape, k, levels, stride) in enumerate(cases):
        x, w, dy = inputs(20 + i, shape, k, levels, stride=stride)
        tape = wt.Tape()
        y = wt.forward(x, w, stride=stride, tape=tape)
        dx, dw = tape.backward(dy)
        expected.append((y, dx, dw))
        prepared.append((x, w, dy, stride))
    cupy.cuda.Device().synchronize()  # the threads' non-blocking streams do not wait for it
    compiler_loaded = len(compiler._loaded)
    barrier = threading.Barrier(len(cases))
    errors = []

    def work(i):
        try:
            x, w, dy, stride = prepared[i]
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                barrier.wait()
                for _ in range(10):
                    xs, dys = cupy.zeros_like(x), cupy.zeros_like(dy)
                    spin(20_000_000)
                    xs[...] = x
                    dys[...] = dy
                    tape = wt.Tape()
                    y = wtcupy.forward(xs, w, stride=stride, tape=tape)
                    dx, dw = tape.backward(dys)
                    stream.synchronize()
                    y_ref, dx_ref, dw_ref = expected[i]
                    assert bool(cupy.array_equal(y, y_ref)), f"thread {i}: y"
                    assert bool(cupy.array_equal(dx, dx_ref)), f"thread {i}: dx"
                    for g, want in zip(dw, dw_ref):
                        assert bool(cupy.array_equal(g, want)), f"thread {i}: dw"
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors
    assert len(compiler._loaded) == compiler_loaded


def test_one_thousand_iterations_do_not_grow_device_memory():
    x, w, dy = inputs(30, (2, 8, 32, 32), 5, 3)
    pool = cupy.get_default_memory_pool()
    backend_tables = lambda: len(gpu._backend(0)._tables)  # noqa: E731

    def step():
        tape = wt.Tape()
        wt.forward(x, w, tape=tape)
        tape.backward(dy)

    for _ in range(10):
        step()
    cupy.cuda.Device().synchronize()
    used, total = pool.used_bytes(), pool.total_bytes()
    free0 = cupy.cuda.runtime.memGetInfo()[0]
    loaded, tables, plans = len(compiler._loaded), backend_tables(), plan_plane.cache_info()
    for i in range(1000):
        step()
        if i % 100 == 99:
            cupy.cuda.Device().synchronize()
            assert pool.used_bytes() == used, f"iteration {i}: pool grew"
    cupy.cuda.Device().synchronize()
    assert pool.used_bytes() == used
    assert pool.total_bytes() <= total
    assert cupy.cuda.runtime.memGetInfo()[0] >= free0 - 2**20
    assert len(compiler._loaded) == loaded and backend_tables() == tables
    assert plan_plane.cache_info().currsize == plans.currsize


def test_torch_memory_is_stable_over_iterations():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no GPU")
    from wtconv_cuda.bindings.torch import WTConv2d

    layer = WTConv2d(8, 8, 5, wt_levels=3).cuda()
    x = torch.randn(2, 8, 32, 32, device="cuda", requires_grad=True)
    for _ in range(10):
        layer(x).sum().backward()
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    for _ in range(1000):
        layer(x).sum().backward()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated


def test_kernels_compile_once_per_signature(monkeypatch):
    calls = []
    original = compiler.cached_ptx

    def counting(spec, cc):
        calls.append(spec)
        return original(spec, cc)

    monkeypatch.setattr(compiler, "cached_ptx", counting)
    # Both shapes plan the same three variants: forward, backward (weights only, the finalize
    # fused) and wtconv_flip for the forward that computes dx.
    shape1, shape2, k, levels = (1, 2, 40, 40), (2, 5, 40, 40), 9, 2
    backend = gpu._backend(0)
    specs = set()
    for shape in (shape1, shape2):
        problem = Problem(*shape, k, levels, 1, "float32", True)
        specs |= {plan_plane(problem, bwd, backend.shared_limit, backend.max_slots).spec
                  for bwd in (False, True)}
    assert len(specs) == 2 and any(spec.fused_finalize for spec in specs)
    before = set(compiler._loaded)
    x, w, dy = inputs(40, shape1, k, levels)
    tape = wt.Tape()
    wt.forward(x, w, tape=tape)
    tape.backward(dy)
    new = set(compiler._loaded) - before
    assert {key[2] for key in compiler._loaded if key[0] == "gpu"} >= specs
    assert len(calls) == len(new) <= 3  # each variant new to this process compiled once
    x2, w2, dy2 = inputs(41, shape2, k, levels)
    for _ in range(3):
        tape = wt.Tape()
        wt.forward(x2, w2, tape=tape)
        tape.backward(dy2)
    assert set(compiler._loaded) - before == new and len(calls) == len(new)


CACHE_SCRIPT = textwrap.dedent("""
    import json, numpy as np, cupy
    import wtconv_cuda as wt
    from wtconv_cuda.kernels import compiler
    calls = []
    original = compiler.compile_ptx
    compiler.compile_ptx = lambda spec, cc=(9, 0): calls.append(repr(spec)) or original(spec, cc)
    w = wt.init_weights(3, 11, 2, seed=0)
    w = wt.WTConvWeights(*(cupy.asarray(a) for a in w))
    # B = 3: the backward is not fused (plane, finalize), so three variants compile.
    x = cupy.asarray(np.random.default_rng(0).standard_normal((3, 3, 21, 19)).astype(np.float32))
    tape = wt.Tape()
    y = wt.forward(x, w, tape=tape)
    dx, dw = tape.backward(cupy.ones_like(y))
    print(json.dumps({"calls": len(calls), "y": float(y.sum()), "dx": float(dx.sum())}))
""")


def test_disk_cache_survives_a_restart(tmp_path):
    env = dict(os.environ, WTCONV_CUDA_CACHE=str(tmp_path))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    runs = []
    for _ in range(2):
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", CACHE_SCRIPT], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        runs.append((json.loads(proc.stdout.strip().splitlines()[-1]), time.monotonic() - start))
    (first, t1), (second, t2) = runs
    assert first["calls"] == 3 and second["calls"] == 0
    assert first["y"] == second["y"] and first["dx"] == second["dx"]
    assert len(list(tmp_path.glob("*.ptx"))) == 3
    print(f"cold {t1:.1f} s, warm {t2:.1f} s")


def test_corrupted_cache_entry_is_rebuilt(tmp_path):
    """A corrupted cached PTX file is compiled again by the next process, not loaded.

    In-process reloading is not what is tested: CuPy memoises modules loaded
    from a path for the life of the process, so the realistic case is a new
    process meeting a file that was damaged on disk.
    """
    env = dict(os.environ, WTCONV_CUDA_CACHE=str(tmp_path))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    runs = []
    for damage in (False, True):
        if damage:
            for ptx in tmp_path.glob("*.ptx"):
                ptx.write_text("this is not PTX\n")
        proc = subprocess.run([sys.executable, "-c", CACHE_SCRIPT], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, rebuilt = runs
    assert first["calls"] == 3 and rebuilt["calls"] == 3  # every damaged file compiled again
    assert first["y"] == rebuilt["y"] and first["dx"] == rebuilt["dx"]
    assert all(".entry" in ptx.read_text() for ptx in tmp_path.glob("*.ptx"))
