"""Framework-neutral parts of the bindings: shape checks and the raw-pointer launcher."""

import subprocess
import sys

import numpy as np
import pytest

from wtconv_cuda.bindings import _common
from wtconv_cuda.kernels.launch import (
    Problem, Tuning, Weights, plan_plane, run_backward, run_forward, work_buffers,
)


def shapes(c=3, k=5, levels=2, bias=True):
    return dict(base_weight=(c, k, k), base_bias=(c,) if bias else None, base_scale=(c,),
                wavelet_weight=(levels, c, 4, k, k), wavelet_scale=(levels, c, 4))


def test_check_layer_accepts_and_returns_sizes():
    sizes = _common.check_layer((2, 3, 9, 7), *shapes().values(), None, 2)
    assert sizes == (2, 3, 9, 7, 5, 2)
    assert _common.check_layer((0, 3, 1, 1), *shapes(bias=False).values(), 2, 1).batch == 0


@pytest.mark.parametrize("change,error,match", [
    (dict(x=(2, 3, 9)), ValueError, "4-D"),
    (dict(x=(2, 3, 0, 7)), ValueError, "non-zero"),
    (dict(x=(2, 4, 9, 7)), ValueError, "channels"),
    (dict(base_weight=(3, 4, 4)), ValueError, "odd"),
    (dict(base_bias=(4,)), ValueError, "base_bias"),
    (dict(base_scale=(3, 1)), ValueError, "base_scale"),
    (dict(wavelet_weight=(2, 3, 3, 5, 5)), ValueError, "wavelet_weight"),
    (dict(wavelet_scale=(1, 3, 4)), ValueError, "wavelet_scale"),
    (dict(levels=3), ValueError, "levels = 3"),
    (dict(levels=1.0), TypeError, "levels"),
    (dict(stride=0), ValueError, "stride"),
    (dict(stride=2.0), TypeError, "stride"),
])
def test_check_layer_errors(change, error, match):
    args = dict(x=(2, 3, 9, 7), **shapes(), levels=None, stride=1)
    args.update(change)
    with pytest.raises(error, match=match):
        _common.check_layer(args["x"], args["base_weight"], args["base_bias"], args["base_scale"],
                            args["wavelet_weight"], args["wavelet_scale"], args["levels"],
                            args["stride"])


def test_out_hw():
    assert _common.out_hw(7, 8, 1) == (7, 8)
    assert _common.out_hw(7, 8, 2) == (4, 4)
    assert _common.out_hw(1, 5, 3) == (1, 2)


def test_importing_bindings_package_imports_no_framework():
    code = ("import sys, wtconv_cuda.bindings, wtconv_cuda.bindings._common, "
            "wtconv_cuda.bindings.cupy;"
            "heavy = [m for m in ('torch', 'jax', 'cupy', 'numba') if m in sys.modules];"
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------
# PointerLauncher with a recording stand-in for the GPU
# ---------------------------------------------------------------------------


class RecordingKernel:
    def __init__(self, spec, log):
        self.spec, self.log = spec, log

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        self.log.append(dict(spec=self.spec, grid=grid, block=block, args=args,
                             shared_mem=shared_mem, stream=stream))


class FakeBackend:
    def __init__(self, shared_limit=48 * 1024, max_slots=4):
        self.shared_limit, self.max_slots = shared_limit, max_slots
        self.log = []

    def kernel(self, spec):
        return RecordingKernel(spec, self.log)


class Stream:
    ptr = 0xABC


def make_launcher(backend, allocations, tables):
    device = _common.DeviceKernels(0, backend=backend)

    def allocate(n):
        owner = ("buffer", n, len(allocations))
        allocations.append(owner)
        return owner, 0x1000 * len(allocations)

    def make_table(values):
        tables.append(values.copy())
        return ("table", len(tables)), 0x90000 + len(tables)

    return device, lambda: _common.PointerLauncher(device, Stream(), allocate, make_table)


def pointers(*values):
    return [np.uint64(v) for v in values]


@pytest.mark.parametrize("shared_limit", [227 * 1024, 1024])  # shared-memory and scratch variants
def test_launcher_passes_pointers_stream_and_keeps_buffers(shared_limit):
    backend = FakeBackend(shared_limit=shared_limit)
    allocations, tables = [], []
    device, new = make_launcher(backend, allocations, tables)
    problem = Problem(2, 3, 33, 31, 5, 2, 2, "float16", True)
    x, y = pointers(0x10, 0x20)
    weights = Weights(*pointers(0x30, 0x40, 0x50, 0x60, 0x70))

    launcher = new()
    run_forward(launcher, problem, x, y, weights)
    (call,) = backend.log
    plan = plan_plane(problem, False, shared_limit, backend.max_slots)
    assert call["stream"].ptr == Stream.ptr
    assert call["args"][:3] == (x, y, x) and call["args"][3:8] == tuple(weights)
    assert (call["grid"], call["block"], call["shared_mem"]) == ((plan.grid,), (plan.block,),
                                                                plan.shared_bytes)
    pointer_args, header_args = call["args"][:11], call["args"][11:]
    assert all(isinstance(a, np.uint64) for a in pointer_args)
    assert all(isinstance(a, np.int64) for a in header_args)
    assert header_args == plan.header == tuple(plan.geo[:len(header_args)])
    assert len(launcher.keep) == 0  # a scratch buffer is released once the launch is queued
    assert len(allocations) == (1 if plan.scratch_floats else 0)
    assert len(tables) == 1 and np.array_equal(tables[0], plan.geo)

    # A second call reuses the cached table.
    run_forward(new(), problem, x, y, weights)
    assert len(tables) == 1

    # Backward: plane kernel then finalize, both on the stream, partials kept alive.
    backend.log.clear()
    dx = np.uint64(0x80)
    grads = Weights(*pointers(0x31, 0x41, 0x51, 0x61, 0x71))
    launcher = new()
    two_launches = Tuning(fuse_finalize=False)
    run_backward(launcher, problem, x, np.uint64(0x90), dx, weights, grads, two_launches)
    plane, finalize = backend.log
    assert plane["stream"] is finalize["stream"]
    assert plane["args"][:3] == (np.uint64(0x90), dx, x)
    partial = plane["args"][8]
    assert finalize["args"][0] == partial and finalize["args"][6:11] == tuple(grads)
    assert launcher.keep and launcher.keep[0][1] == \
        plan_plane(problem, True, shared_limit, backend.max_slots, two_launches).partial_floats
    assert len(tables) == 3  # backward geometry and the finalize dimensions

    # The default backward of this problem fuses the finalize: one launch, the gradient
    # pointers after geo, no partials.
    backend.log.clear()
    launcher = new()
    plan = plan_plane(problem, True, shared_limit, backend.max_slots)
    assert plan.spec.fused_finalize
    run_backward(launcher, problem, x, np.uint64(0x90), dx, weights, grads)
    (plane,) = backend.log
    assert plane["args"][:3] == (np.uint64(0x90), dx, x)
    assert plane["args"][11:16] == tuple(grads)
    assert plane["args"][16:] == plan.header
    assert len(launcher.keep) == (1 if plan.scratch_floats else 0)


def test_launcher_runs_a_chunked_dx_forward_on_batch_offsets():
    """A backward whose dx comes from the forward kernels in batch chunks hands each chunk's
    forward the addresses of its first batch entry (storage-sized elements), and the
    chunks' work buffers are requested as work_buffers() says."""
    backend = FakeBackend(shared_limit=227 * 1024)
    allocations, tables = [], []
    device, new = make_launcher(backend, allocations, tables)
    problem = Problem(5, 3, 33, 31, 5, 2, 1, "bfloat16", True)
    tuning = Tuning(dx_forward=True, dx_batch=2)
    x, dy, dx = pointers(0x100000, 0x200000, 0x300000)
    weights = Weights(*pointers(0x30, 0x40, 0x50, 0x60, 0x70))
    grads = Weights(*pointers(0x31, 0x41, 0x51, 0x61, 0x71))
    run_backward(new(), problem, x, dy, dx, weights, grads, tuning)
    forwards = [call for call in backend.log
                if type(call["spec"]).__name__ == "PlaneSpec" and not call["spec"].backward]
    entry = 3 * 33 * 31 * 2  # bytes of one batch entry in bfloat16
    assert [call["args"][:2] for call in forwards] == [
        (np.uint64(0x200000 + start * entry), np.uint64(0x300000 + start * entry))
        for start in (0, 2, 4)]
    assert tuple(n for _, n, _ in allocations) == tuple(
        max(n, 1) for n in work_buffers(problem, True, backend.shared_limit, backend.max_slots,
                                        tuning))


def test_device_kernels_table_is_created_once_per_value():
    device = _common.DeviceKernels(0, backend=FakeBackend())
    made = []

    def make(values):
        made.append(values)
        return object(), 1234 + len(made)

    a = device.table(np.array([1, 2, 3], dtype=np.int64), make)
    b = device.table(np.array([1, 2, 3], dtype=np.int64), make)
    c = device.table(np.array([1, 2, 4], dtype=np.int64), make)
    assert a == b == np.uint64(1235) and c == np.uint64(1236) and len(made) == 2


# ---------------------------------------------------------------------------
# Direct cuLaunchKernel launches
# ---------------------------------------------------------------------------


def test_driver_launch_passes_every_parameter_as_8_bytes(monkeypatch):
    import ctypes

    seen = []

    def fake_launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        pointers = (ctypes.c_uint64 * 4).from_address(params)
        values = [ctypes.c_uint64.from_address(p).value for p in pointers]
        seen.append((function, gx, gy, gz, bx, by, bz, shared, stream, values, extra))

    from wtconv_cuda.kernels import driver

    monkeypatch.setattr(driver, "_cu_launch_kernel", fake_launch)
    args = (np.uint64(0x7F0000001000), np.int64(5), 7, np.uint64(2**63 + 1))
    _common.driver_launch(0xF00, 12, 128, 4096, 0xABC, args)
    assert seen == [(0xF00, 12, 1, 1, 128, 1, 1, 4096, 0xABC,
                     [0x7F0000001000, 5, 7, 2**63 + 1], 0)]
    with pytest.raises(OverflowError):
        _common.driver_launch(0xF00, 1, 32, 0, 0, (np.int64(-1),))


def test_cupy_backend_launches_through_the_driver_with_array_addresses(monkeypatch):
    """The CuPy path's backend skips CuPy's argument dispatch when the kernel has a handle,
    asks for the handle once per kernel, and falls back to the RawKernel call without one."""
    from types import SimpleNamespace

    from wtconv_cuda.kernels import launch

    class FakeArray:
        def __init__(self, ptr):
            self.data = SimpleNamespace(ptr=ptr)

    stream = SimpleNamespace(ptr=0xABC)
    fake_cupy = SimpleNamespace(ndarray=FakeArray,
                                cuda=SimpleNamespace(get_current_stream=lambda: stream))
    backend = object.__new__(launch.CupyBackend)
    backend._cupy, backend._handles = fake_cupy, {}
    asked = []
    monkeypatch.setattr(backend, "driver_handle",
                        lambda kernel: asked.append(kernel) or kernel.handle)
    launched = []
    monkeypatch.setattr(launch, "driver_launch", lambda *a: launched.append(a))

    class Kernel:
        handle = 0xF00

    with_handle = Kernel()
    args = (FakeArray(0x10), np.int64(3), FakeArray(0x20))
    for _ in range(2):
        backend.call(with_handle, 7, 64, args, 128)
    assert launched == [(0xF00, 7, 64, 128, 0xABC, [0x10, 3, 0x20])] * 2
    assert asked == [with_handle]

    raw_calls = []

    class RawKernel:
        handle = None

        def __call__(self, grid, block, call_args, shared_mem):
            raw_calls.append((grid, block, call_args, shared_mem))

    backend.call(RawKernel(), 5, 32, args, 0)
    assert raw_calls == [((5,), (32,), args, 0)] and len(launched) == 2


class HandleBackend(FakeBackend):
    def driver_handle(self, kernel):
        return 0xF00 + len(kernel.spec.__class__.__name__)


def test_launcher_uses_the_driver_handle_when_the_backend_has_one(monkeypatch):
    calls = []
    monkeypatch.setattr(_common, "driver_launch",
                        lambda *launch: calls.append(launch))
    backend = HandleBackend(shared_limit=227 * 1024)
    device, new = make_launcher(backend, [], [])
    problem = Problem(2, 3, 33, 31, 5, 2, 1, "float32", True)
    x, y = pointers(0x10, 0x20)
    weights = Weights(*pointers(0x30, 0x40, 0x50, 0x60, 0x70))
    run_forward(new(), problem, x, y, weights)
    plan = plan_plane(problem, False, backend.shared_limit, backend.max_slots)
    assert backend.log == []  # nothing went through the kernel object
    ((handle, grid, block, shared, stream, args),) = calls
    assert (grid, block, shared, stream) == (plan.grid, plan.block, plan.shared_bytes,
                                             Stream.ptr)
    assert handle == device.driver_handle(backend.kernel(plan.spec))
    assert args[:3] == (x, y, x) and args[11:] == plan.header


def test_planner_keeps_sub_warp_groups_in_whole_warps():
    """16-thread planes default to 16 per block with warp barriers; a shared-memory limit
    that fits one plane but not a warp's two sends them to the scratch path."""
    from wtconv_cuda.kernels.layout import plane_layout

    problem = Problem(4, 8, 7, 7, 5, 2, 1, "float32", True)
    tuning = Tuning(threads=16)
    plan = plan_plane(problem, False, 227 * 1024, 264, tuning)
    assert (plan.spec.threads, plan.spec.planes_per_block, plan.spec.warp_sync) == (16, 16, True)
    assert plan.block == 256 and not plan.spec.scratch
    slot = 4 * plane_layout(7, 7, 2, 5, plan.spec.strip, 16, 1, 1, False).slot_floats
    tight = plan_plane(problem, False, slot * 3, 264, tuning)
    assert tight.spec.planes_per_block == 2 and not tight.spec.scratch
    one = plan_plane(problem, False, slot, 264, tuning)
    assert one.spec.scratch and one.spec.planes_per_block == 2 and one.spec.warp_sync
    assert not plan_plane(problem, False, 227 * 1024, 264, Tuning(threads=64)).spec.warp_sync


@pytest.mark.parametrize("hw,forward_threads,backward_threads", [
    ((7, 7), 16, 16), ((14, 14), 16, 32), ((17, 23), 32, 32), ((28, 28), 64, 64),
    ((56, 56), 128, 128)])
def test_default_threads_per_plane(hw, forward_threads, backward_threads):
    """Two 16-thread planes per warp for the smallest planes (the backward only up to 7x7)."""
    from wtconv_cuda.kernels.launch import default_tuning

    problem = Problem(64, 96, *hw, 5, 2, 1, "float32", True)
    assert default_tuning(problem, False).threads == forward_threads
    assert default_tuning(problem, True).threads == backward_threads


def test_planner_gives_block_barriers_to_a_part_filled_warp():
    """One 16-thread plane per block (an explicit group) cannot use warp barriers."""

    problem = Problem(1, 1, 1, 1, 1, 0, 1, "float16", False)
    spec = plan_plane(problem, False, 227 * 1024, 2, Tuning(planes_per_block=1)).spec
    assert (spec.threads, spec.planes_per_block, spec.warp_sync) == (16, 1, False)


@pytest.mark.parametrize("hw,levels", [((56, 56), 5), ((28, 28), 4), ((14, 14), 3), ((7, 7), 2)])
@pytest.mark.parametrize("storage,itemsize", [("float32", 4), ("bfloat16", 2)])
def test_backward_partials_at_convnext_stages(hw, levels, storage, itemsize):
    """On an H200's limits the weight-gradient partials stay within 1/8 of the bytes of x
    at B = 64 (the peak-memory target), or at one partial per channel, and the grid keeps
    at least two blocks per multiprocessor."""
    from wtconv_cuda.kernels.launch import PARTIAL_FRACTION

    c = {56: 96, 28: 192, 14: 384, 7: 768}[hw[0]]
    problem = Problem(64, c, *hw, 5, levels, 1, storage, True)
    plan = plan_plane(problem, True, 227 * 1024, 264)
    x_bytes = 64 * c * hw[0] * hw[1] * itemsize
    assert plan.grid >= 264
    if plan.spec.fused_finalize:  # blocks hold whole channels: no partials at all
        assert plan.partial_floats == 0 and plan.finalize_dims is None
        return
    per_channel = plan.partial_floats // (c * plan.ntaps)
    assert plan.partial_floats * 4 <= PARTIAL_FRACTION * x_bytes or per_channel == 1
    assert tuple(plan.finalize_dims) == (64, c, levels, 1, per_channel)
