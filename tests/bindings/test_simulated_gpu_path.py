"""The bindings' GPU code paths, run on the CPU through numba's CUDA simulator.

The PyTorch and JAX GPU paths hand raw addresses to the kernels. Here the
same code runs with host tensors/buffers: the launcher maps every address
back to the array it came from and runs the generated kernels in the
simulator. This checks, without a GPU, which buffer goes into which kernel
argument (inputs, outputs, the dummy bias of a bias-free layer, weight
gradients, work buffers, geometry tables, XLA's extra work results) against
the float64 oracle. Streams, devices and real memory are covered by
``tests/gpu/test_bindings_gpu.py``.
"""

import os

import numpy as np
import pytest

from wtconv_cuda import WTConvWeights, reference
from wtconv_cuda.bindings import _common
from wtconv_cuda.kernels.launch import SimulatorBackend

from ..conftest import random_weights

pytestmark = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                                reason="needs numba's CUDA simulator")

TOL = {"float32": 2e-6, "float16": 2e-3}


class Registry:
    """Device addresses -> the host arrays behind them."""

    def __init__(self):
        self.arrays = {}
        self.allocations = []
        self.tables = []

    def add(self, array: np.ndarray) -> np.uint64:
        address = array.ctypes.data if array.size else 0
        self.arrays[address] = array
        return np.uint64(address)

    def resolve(self, address: int) -> np.ndarray:
        """The array at ``address``, or the tail of a float32 work buffer from an address
        inside it (the split passes' views, :meth:`PointerLauncher.view`)."""
        if address in self.arrays:
            return self.arrays[address]
        for base, array in self.arrays.items():
            if array.dtype == np.float32 and base < address < base + array.nbytes:
                return array.reshape(-1)[(address - base) // 4:]
        raise KeyError(hex(address))

    def allocate(self, n):
        buffer = np.full(n, np.nan, dtype=np.float32)
        self.allocations.append(n)
        return buffer, int(self.add(buffer))

    def make_table(self, values):
        table = np.array(values, dtype=np.int64)
        self.tables.append(table)
        return table, int(self.add(table))


class NullScope:
    def __init__(self, device_id):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeStream:
    ptr = 0


@pytest.fixture
def simulated(monkeypatch):
    """Route PointerLauncher launches into the simulator; returns the registry."""
    registry = Registry()
    backend = SimulatorBackend(max_slots=3)
    device = _common.DeviceKernels(0, backend=backend)

    def call(self, kernel, grid, block, args, shared_bytes):
        # Pointers (numpy.uint64) map back to their arrays; scalars pass as they are.
        arrays = [registry.resolve(int(a)) if isinstance(a, np.uint64) else a for a in args]
        backend.call(kernel, grid, block, arrays, shared_bytes)

    monkeypatch.setattr(_common.PointerLauncher, "call", call)
    monkeypatch.setattr(_common, "device_kernels", lambda device_id: device)
    monkeypatch.setattr(_common, "stream_handle", lambda device_id, pointer: FakeStream())
    monkeypatch.setattr(_common, "DeviceScope", NullScope)
    registry.device = device
    return registry


@pytest.fixture(params=["planner", "program"])
def launch_path(request, simulated, monkeypatch):
    """How the bindings' launches reach the simulator: through the planner (a
    PointerLauncher per call), or as recorded programs replayed with the call's
    addresses (kernels get driver handles; a replayed launch maps its handle and
    addresses back to the kernel and arrays, and counts in ``simulated.replayed``)."""
    from wtconv_cuda.kernels import program

    device = simulated.device
    simulated.replayed = 0
    if request.param == "program":
        kernels = {}

        def driver_handle(kernel):
            return kernels.setdefault(id(kernel), (1 + len(kernels), kernel))[0]

        def launch_packed(function, grid, block, shared_bytes, stream, values):
            kernel = next(k for handle, k in kernels.values() if handle == function)
            # addresses are host addresses (above 2^32); sizes are small
            args = [simulated.resolve(v) if v >> 32 else np.int64(v) for v in values]
            device._backend.call(kernel, grid, block, args, shared_bytes)
            simulated.replayed += 1

        monkeypatch.setattr(device, "driver_handle", driver_handle)
        monkeypatch.setattr(program, "launch_packed", launch_packed)
    return request.param


@pytest.fixture
def torch_launch(launch_path, simulated, monkeypatch):
    """The PyTorch binding on the simulator, along ``launch_path``."""
    torch = pytest.importorskip("torch")
    from wtconv_cuda.bindings import torch as wttorch

    device = simulated.device
    monkeypatch.setattr(wttorch, "_hooks", lambda d: (device, simulated.allocate,
                                                       simulated.make_table))
    monkeypatch.setattr(wttorch, "_current_stream", lambda index: 0)
    monkeypatch.setattr(wttorch, "_launcher", lambda d: _common.PointerLauncher(
        device, FakeStream(), simulated.allocate, simulated.make_table))
    monkeypatch.setattr(wttorch, "_ptr", lambda t: simulated.add(t.detach().numpy()))
    return launch_path, torch, wttorch


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.isfinite(got).all(), "unwritten (NaN) elements"
    return np.linalg.norm(got - want) / np.linalg.norm(want)


CASES = [  # (B, C, H, W), K, L, stride, bias, storage, shared_limit
    ((2, 2, 9, 7), 3, 2, 1, True, "float32", 227 * 1024),
    ((1, 2, 6, 5), 3, 2, 2, False, "float32", 227 * 1024),
    ((3, 2, 7, 9), 3, 1, 1, True, "float32", 0),  # global scratch work buffers
    ((1, 2, 7, 10), 3, 2, 1, True, "float16", 227 * 1024),
]


@pytest.mark.parametrize("shape,k,levels,stride,bias,storage,shared_limit", CASES)
def test_torch_gpu_path(simulated, torch_launch, monkeypatch, rng, shape, k, levels, stride,
                        bias, storage, shared_limit):
    path, torch, wttorch = torch_launch
    simulated.device.shared_limit = shared_limit
    # CPU tensors take the CUDA implementation.
    monkeypatch.setitem(wttorch._IMPLS, "cpu", wttorch._IMPLS["cuda"])

    dtype = {"float32": torch.float32, "float16": torch.float16}[storage]
    w = random_weights(rng, shape[1], k, levels, bias, dtype=np.float32)
    x = torch.tensor(rng.standard_normal(shape)).to(dtype).requires_grad_()
    tw = WTConvWeights(*(None if a is None else torch.tensor(a).to(dtype).requires_grad_()
                         for a in w))
    y = wttorch.wtconv2d(x, *tw, levels=levels, stride=stride)
    dy = torch.tensor(rng.standard_normal(y.shape)).to(dtype)
    y.backward(dy)

    def host(t):
        return None if t is None else t.detach().double().numpy()

    wr = WTConvWeights(*(host(a) for a in tw))
    y_ref = reference.forward(host(x), wr, levels, stride)
    dx_ref, dw_ref = reference.backward(host(x), wr, host(dy), levels, stride)
    tol = TOL[storage]
    assert rel(host(y), y_ref) < tol
    assert rel(host(x.grad), dx_ref) < tol
    for name, t in tw._asdict().items():
        if t is not None and t.numel():
            assert rel(host(t.grad), getattr(dw_ref, name)) < tol, name
    assert simulated.tables  # geometry uploaded through the framework's table maker
    if shared_limit == 0:
        assert len(simulated.allocations) >= 3  # forward scratch; backward partials + scratch
    assert (simulated.replayed >= 2) == (path == "program")  # a forward and a backward


@pytest.mark.parametrize("levels,bias", [(2, True), (1, False)])
def test_torch_module_gpu_path(simulated, torch_launch, monkeypatch, rng, levels, bias):
    """The module on the GPU implementation, forward and every parameter gradient,
    against the same module on the oracle path: level parameters joined (L > 1) or
    passed as they are (L = 1), level gradients split back per level."""
    _, torch, wttorch = torch_launch
    layer = wttorch.WTConv2d(2, 2, 3, stride=2, bias=bias, wt_levels=levels)
    # The parameters come from the test's own generator. Torch's global one depends on
    # the tests run before it, and one CI run drew weights whose scale gradients cancel
    # down to 8e-6 relative float32 rounding, past TOL.
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.from_numpy(rng.uniform(-1, 1, tuple(p.shape)).astype(np.float32)))
    x = torch.tensor(rng.standard_normal((2, 2, 9, 8)), dtype=torch.float32,
                     requires_grad=True)
    dy = torch.tensor(rng.standard_normal((2, 2, 5, 4)), dtype=torch.float32)
    expected = layer(x)  # the oracle path
    expected.backward(dy)
    want = [x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]
    x.grad = None
    layer.zero_grad(set_to_none=True)

    monkeypatch.setitem(wttorch._IMPLS, "cpu", wttorch._IMPLS["cuda"])
    got = layer(x)
    assert type(got.grad_fn).__name__ == "_ModuleWTConvBackward"
    assert rel(got.detach().numpy(), expected.detach().numpy()) < TOL["float32"]
    got.backward(dy)
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    for name, g, w in zip(names, [x.grad] + [p.grad for p in layer.parameters()], want):
        assert g.shape == w.shape, name
        assert rel(g.numpy(), w.numpy()) < TOL["float32"], name
    empty = layer(torch.zeros(0, 2, 9, 8))
    assert empty.shape == (0, 2, 5, 4)


@pytest.mark.parametrize("shape,k,levels,stride,bias,storage,shared_limit", CASES[:3])
def test_jax_gpu_path(simulated, launch_path, monkeypatch, rng, shape, k, levels, stride, bias,
                      storage, shared_limit):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from wtconv_cuda.bindings import jax as wtjax

    simulated.device.shared_limit = shared_limit
    monkeypatch.setattr(wtjax, "_is_host", lambda buffer: False)
    monkeypatch.setattr(wtjax, "_device_id", lambda buffer: 0)
    monkeypatch.setattr(wtjax, "_stream_of", lambda ctx: 0)
    monkeypatch.setattr(wtjax, "_address", lambda buffer: simulated.add(np.asarray(buffer)))
    monkeypatch.setattr(wtjax, "_cupy_table", lambda device_id: simulated.make_table)
    # Plan XLA's extra work results as on a GPU.
    monkeypatch.setattr(wtjax, "_gpu_kernels_for_tracing", lambda: simulated.device)

    w = WTConvWeights(*(None if a is None else jnp.asarray(a) for a in
                        random_weights(rng, shape[1], k, levels, bias, dtype=np.float32)))
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)

    def f(x, w):
        return wtjax.wtconv2d(x, w, levels=levels, stride=stride)

    y, vjp = jax.vjp(jax.jit(f), x, w)
    dy = jnp.asarray(rng.standard_normal(y.shape), jnp.float32)
    dx, dw = jax.jit(vjp)(dy)
    xr = np.asarray(x, np.float64)
    wr = WTConvWeights(*(None if a is None else np.asarray(a, np.float64) for a in w))
    assert rel(y, reference.forward(xr, wr, levels, stride)) < TOL[storage]
    dx_ref, dw_ref = reference.backward(xr, wr, np.asarray(dy, np.float64), levels, stride)
    assert rel(dx, dx_ref) < TOL[storage]
    for name in WTConvWeights._fields:
        want = getattr(dw_ref, name)
        if want is None:
            assert getattr(dw, name) is None
        elif want.size:
            assert rel(getattr(dw, name), want) < TOL[storage], name
    # The partials (and scratch) were XLA's extra results: nothing fell back to CuPy.
    assert not simulated.allocations
    assert (simulated.replayed >= 2) == (launch_path == "program")  # a forward and a backward


def test_split_passes_through_pointers(simulated, rng):
    """A forced split, forward and backward, through raw addresses: the work buffers'
    views are address offsets, and the pooled buffer is released before the tiles'
    partials are allocated (the forward releases both of its buffers)."""
    from wtconv_cuda.kernels.launch import Problem, Tuning, Weights, run_backward, run_forward

    shape, k, levels = (1, 2, 21, 19), 3, 3
    w = random_weights(rng, shape[1], k, levels, True, dtype=np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    y, dx = (np.full(shape, np.nan, np.float32) for _ in range(2))
    grads = [np.full(a.shape, np.nan, np.float32) for a in w]
    problem = Problem(*shape, k, levels, 1, "float32", True)
    tuning = Tuning(split=1, tile=8, threads=32, strip=2)
    weights = Weights(*(simulated.add(a) for a in w))
    for backward in (False, True):
        launcher = _common.PointerLauncher(simulated.device, FakeStream(), simulated.allocate,
                                           simulated.make_table)
        if backward:
            run_backward(launcher, problem, simulated.add(x), simulated.add(dy),
                         simulated.add(dx), weights, Weights(*(simulated.add(g) for g in grads)),
                         tuning)
        else:
            run_forward(launcher, problem, simulated.add(x), simulated.add(y), weights, tuning)
        # held: backward the coarse buffer and the tiles' partials, not the pooled one;
        # forward nothing (both buffers released once the tiles are queued)
        assert len(launcher.keep) == (2 if backward else 0)
    dx_ref, dw_ref = reference.backward(x, w, dy, levels, 1)
    assert rel(y, reference.forward(x, w, levels, 1)) < TOL["float32"]
    assert rel(dx, dx_ref) < TOL["float32"]
    for name, g in zip(w._fields, grads):
        assert rel(g, getattr(dw_ref, name)) < TOL["float32"], name


@pytest.mark.parametrize("shared_limit", [227 * 1024, 0])
def test_dx_from_the_forward_through_pointers(simulated, rng, shared_limit):
    """A backward whose dx runs on the forward kernels, through raw addresses: the flipped
    filters' typed views are address offsets into a work buffer, which is asked for first
    and released once the forward has been queued."""
    from wtconv_cuda.kernels.launch import (
        Problem, Tuning, Weights, flipped_filter_floats, run_backward,
    )

    shape, k, levels = (2, 3, 9, 7), 3, 2
    w = random_weights(rng, shape[1], k, levels, True, dtype=np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    dx = np.full(shape, np.nan, np.float32)
    grads = [np.full(a.shape, np.nan, np.float32) for a in w]
    problem = Problem(*shape, k, levels, 1, "float32", True)
    simulated.device.shared_limit = shared_limit
    addresses = []

    def allocate(n):
        owner, pointer = simulated.allocate(n)
        addresses.append(pointer)
        return owner, pointer

    launcher = _common.PointerLauncher(simulated.device, FakeStream(), allocate,
                                       simulated.make_table)
    run_backward(launcher, problem, simulated.add(x), simulated.add(dy), simulated.add(dx),
                 Weights(*(simulated.add(a) for a in w)),
                 Weights(*(simulated.add(g) for g in grads)), Tuning(dx_forward=True))
    assert simulated.allocations[0] == flipped_filter_floats(problem)
    assert addresses[0] not in launcher._pointers  # the flipped filters' buffer: released
    dx_ref, dw_ref = reference.backward(x, w, dy, levels, 1)
    assert rel(dx, dx_ref) < TOL["float32"]
    for name, g in zip(w._fields, grads):
        assert rel(g, getattr(dw_ref, name)) < TOL["float32"], name
