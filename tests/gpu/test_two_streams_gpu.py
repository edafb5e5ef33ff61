"""The backward's two streams (``launch.TWO_STREAMS``) on a real GPU.

Where ``dx`` comes from the forward kernels, a recorded program runs that part
on a side stream forked from the caller's stream and joined back to it
(:mod:`wtconv_cuda.kernels.program`). These tests check that it gives the same
bits as one stream (the two-stream run first, for each set of inputs, so its
outputs cannot be left-over copies of the other's), that it waits for work the
caller queued before it and that the caller's stream waits for it, and that a
CUDA graph captures it. Runs only where ``WTCONV_TEST_GPU=1``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

if os.environ.get("WTCONV_TEST_GPU") != "1":
    pytest.skip("GPU tests run with WTCONV_TEST_GPU=1", allow_module_level=True)

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("PyTorch sees no GPU", allow_module_level=True)

from wtconv_cuda import gpu  # noqa: E402
from wtconv_cuda.bindings import _common  # noqa: E402
from wtconv_cuda.bindings import cupy as wtcupy  # noqa: E402
from wtconv_cuda.kernels import launch  # noqa: E402

from wtconv_cuda import WTConvWeights  # noqa: E402
from wtconv_cuda.bindings.torch import wtconv2d  # noqa: E402

from .test_bindings_gpu import (  # noqa: E402
    DEV, SLEEP_CYCLES, assert_replays_match_eager, captured_training_step, cupy_weights,
    make_layer, oracle, random_tensors, rel, to_jax,
)

#: (B, C, H, W), L, dtype: the ConvNeXt-T stages whose backward forks (the
#: benchmark's shapes, so their kernels are those of ``scripts/build_ptx_cache.sh
#: bench``; at 28 x 28 in fp32 dx runs in two batch chunks to fork, see
#: ``launch.backward_dx_plan``; in 16 bits it does not fork there).
CASES = [((64, 192, 28, 28), 4, torch.float32),
         ((64, 96, 56, 56), 5, torch.float32), ((64, 96, 56, 56), 5, torch.bfloat16),
         ((64, 384, 14, 14), 3, torch.float32), ((64, 384, 14, 14), 3, torch.bfloat16)]


@pytest.fixture
def streams(monkeypatch):
    """``streams(on)``: set ``TWO_STREAMS`` and forget every plan and recorded program."""
    def forget():
        launch.clear_plan_caches()
        gpu._program.cache_clear()
        _common.device_kernels(DEV.index)._programs.clear()

    def use(on: bool) -> None:
        torch.cuda.synchronize()
        monkeypatch.setattr(launch, "TWO_STREAMS", on)
        forget()

    yield use
    monkeypatch.undo()
    forget()


def forks() -> bool:
    """Whether a program recorded on the device since the last reset has a side stream."""
    return any(p is not None and p.forks
               for p in _common.device_kernels(DEV.index)._programs.values())


def step(layer, x_src, dy_src, delay: bool):
    """A training step of ``layer`` on copies of ``x_src`` and ``dy_src`` made on a fresh
    stream (after ~0.15 s of spinning there when ``delay``), its results cloned there."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    layer.zero_grad(set_to_none=True)
    with torch.cuda.stream(stream):
        if delay:
            torch.cuda._sleep(SLEEP_CYCLES)  # the inputs land long after the call is queued
        x = x_src.clone().requires_grad_()
        dy = dy_src.clone()
        y = layer(x)
        y.backward(dy)
        results = [y.detach().clone(), x.grad.clone()] + [p.grad.clone()
                                                          for p in layer.parameters()]
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return results


@pytest.mark.parametrize("shape,levels,dtype", CASES, ids=str)
def test_two_streams_same_bits_as_one(streams, shape, levels, dtype):
    b, c, h, w = shape
    layer = make_layer(c, 5, levels, dtype=dtype)
    for seed in (1, 2):
        gen = torch.Generator(device=DEV).manual_seed(seed)
        x = torch.randn(shape, device=DEV, generator=gen).to(dtype)
        dy = torch.randn(shape, device=DEV, generator=gen).to(dtype)
        streams(True)
        two = step(layer, x, dy, delay=True)
        assert forks()
        streams(False)
        one = step(layer, x, dy, delay=False)
        assert not forks()
        for i, (a, b_) in enumerate(zip(two, one)):
            assert torch.equal(a, b_), f"result {i} (y, dx, then the parameters' gradients)"


def test_two_streams_match_the_oracle(streams):
    streams(True)
    x, w = random_tensors(96, 5, 5, True, torch.float32, batch=8, hw=(56, 56))
    y = wtcupy.forward(cupy.from_dlpack(x.detach()), cupy_weights(w), 5)
    dy = cupy.random.default_rng(3).standard_normal(y.shape, dtype=cupy.float32)
    dx, dw = wtcupy.backward(wtcupy.Saved(cupy.from_dlpack(x.detach()), cupy_weights(w), 5, 1),
                             dy)
    program = gpu._program(0, gpu._problem(cupy.from_dlpack(x.detach()), cupy_weights(w), 5, 1),
                           True)
    assert program is not None and program.forks
    y_ref, dx_ref, dw_ref = oracle(x, w, torch.from_dlpack(dy), 5, 1)
    assert rel(cupy.asnumpy(y), y_ref) < 1e-5
    assert rel(cupy.asnumpy(dx), dx_ref) < 1e-5
    for name in ("base_weight", "base_bias", "base_scale", "wavelet_weight", "wavelet_scale"):
        assert rel(cupy.asnumpy(getattr(dw, name)), getattr(dw_ref, name)) < 1e-5, name


def test_cuda_graph_captures_the_two_streams(streams):
    streams(True)
    (b, c, h, w), levels, _ = CASES[0]
    layer = make_layer(c, 5, levels)
    static_x = torch.randn(b, c, h, w, device=DEV, requires_grad=True)
    static_dy = torch.randn(b, c, h, w, device=DEV)
    graph, static_y = captured_training_step(layer, static_x, static_dy)
    assert forks()
    assert_replays_match_eager(graph, layer, static_x, static_dy, static_y,
                               make_layer(c, 5, levels))


def test_jax_two_streams_same_bits_as_torch(streams):
    """Under ``jax.jit`` (XLA's stream and work buffers) the forking backward gives
    the PyTorch binding's bits."""
    jax = pytest.importorskip("jax")
    if jax.default_backend() != "gpu":
        pytest.skip("JAX has no GPU backend here")
    from wtconv_cuda.bindings import jax as wtjax

    streams(True)
    x, w = random_tensors(96, 5, 5, True, torch.float32, batch=8, hw=(56, 56))
    y = wtconv2d(x, *w, levels=5)
    dy = torch.randn(y.shape, device=DEV)
    y.backward(dy)

    def f(x, w):
        return wtjax.wtconv2d(x, w, levels=5)

    xj, dyj = to_jax(jax, x), to_jax(jax, dy)
    wj = WTConvWeights(*(to_jax(jax, a) for a in w))
    dxj, dwj = jax.jit(lambda x, w, dy: jax.vjp(f, x, w)[1](dy))(xj, wj, dyj)
    jax.block_until_ready(dxj)
    assert forks()
    assert torch.equal(torch.from_numpy(np.array(dxj)), x.grad.cpu())
    for name, t in w._asdict().items():
        assert torch.equal(torch.from_numpy(np.array(getattr(dwj, name))), t.grad.cpu()), name
