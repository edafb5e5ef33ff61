"""Host side of the fused kernels: plan a launch and issue it on a backend.

A *backend* supplies compiled kernels, small device tables and float32
buffers. Two exist: :class:`CupyBackend` (real GPU, raw-pointer launches) and
:class:`SimulatorBackend` (numba's CUDA simulator on NumPy arrays, for CI).
Everything else (the buffer layout, which kernel variant, grid sizes, the
order of launches) is shared, so the simulator tests exercise the exact
launch logic the GPU runs.

Arrays passed to :func:`run_forward` / :func:`run_backward` must be
C-contiguous and already in the storage dtype; validation is the caller's job.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from . import compiler
from .codegen import FinalizeSpec, PlaneSpec
from .layout import plane_layout, with_problem

MAX_THREADS = 256  # per block; a block holds several planes when they are small
FINALIZE_THREADS = 128


class Problem(NamedTuple):
    """Sizes and options of one layer call (forward or backward)."""

    batch: int
    channels: int
    height: int
    width: int
    kernel_size: int
    levels: int
    stride: int
    storage: str
    has_bias: bool


class Weights(NamedTuple):
    """Backend arrays of the five parameters; ``base_bias`` may be a dummy."""

    base_weight: object
    base_bias: object
    base_scale: object
    wavelet_weight: object
    wavelet_scale: object


class Tuning(NamedTuple):
    """Launch-shape overrides (``None`` picks the default)."""

    threads: int | None = None
    strip: int | None = None
    max_registers: int | None = None
    planes_per_block: int | None = None


def default_tuning(problem: Problem, backward: bool) -> Tuning:
    """Launch shape measured best on an H200 for the plane's size.

    ``benchmarks/tune.py`` sweeps these at the ConvNeXt-T stage shapes
    (56, 28, 14 and 7 pixels): large planes want 128 threads per plane and
    4 coefficient rows per thread; small ones 32 threads, fewer rows and
    several planes per block. A 64-register cap was 10-20% faster on small
    planes but spills to local memory; it is left off.
    """
    h1, w1 = -(-problem.height // 2), -(-problem.width // 2)
    strip = 4 if h1 >= 16 else (2 if h1 >= 6 else 1)
    area = h1 * w1
    threads = 128 if area >= 512 else (64 if area >= 128 else 32)
    return Tuning(threads, strip, 0)


class Launch(NamedTuple):
    """Everything needed to issue one ``wtconv_plane`` launch."""

    spec: PlaneSpec
    grid: int
    block: int
    shared_bytes: int
    scratch_floats: int
    geo: np.ndarray
    ntaps: int


@lru_cache(maxsize=1024)
def plan_plane(problem: Problem, backward: bool, shared_limit: int, max_slots: int,
               tuning: Tuning = Tuning()) -> Launch:
    """Choose the kernel variant and launch shape for one plane pass.

    The working set goes to shared memory when one plane's buffer fits in
    ``shared_limit`` bytes (one block per plane); otherwise to global scratch,
    one slot per block, with ``max_slots`` persistent blocks looping over
    planes.
    """
    p = problem
    in_stride, out_stride = (p.stride, 1) if backward else (1, p.stride)
    default = default_tuning(p, backward)
    strip = tuning.strip or default.strip
    threads = tuning.threads or default.threads
    max_registers = default.max_registers if tuning.max_registers is None else tuning.max_registers
    layout = plane_layout(p.height, p.width, p.levels, p.kernel_size, strip, threads,
                          in_stride, out_stride, backward)
    planes = p.batch * p.channels
    slot_bytes = 4 * layout.slot_floats
    scratch = slot_bytes > shared_limit
    group = tuning.planes_per_block or max(1, MAX_THREADS // threads)
    if not scratch:
        fits = max(1, shared_limit // slot_bytes)
        while group > fits:  # halve, keeping the group a power of two (fewer variants)
            group //= 2
    spec = PlaneSpec(p.kernel_size, p.storage, in_stride, out_stride, backward, scratch,
                     threads, strip, max_registers, group)
    geo = with_problem(layout, p.channels, planes, p.has_bias)
    geo.setflags(write=False)  # shared by every call through the plan cache
    blocks = -(-planes // group)
    if scratch:
        blocks = max(1, min(blocks, max_slots // group))
        return Launch(spec, blocks, threads * group, 0, blocks * group * layout.slot_floats,
                      geo, layout.ntaps)
    return Launch(spec, blocks, threads * group, group * slot_bytes, 0, geo, layout.ntaps)


class CupyBackend:
    """Launches on the current CuPy device and stream."""

    simulate = False

    def __init__(self, device_id: int | None = None):
        import cupy
        self._cupy = cupy
        self.device_id = cupy.cuda.runtime.getDevice() if device_id is None else device_id
        attrs = cupy.cuda.Device(self.device_id).attributes
        self.shared_limit = attrs["MaxSharedMemoryPerBlockOptin"] - 1024
        self.max_slots = 2 * attrs["MultiProcessorCount"]
        self._tables: dict = {}

    def kernel(self, spec):
        return compiler.gpu_kernel(spec, self.device_id)

    def call(self, kernel, grid, block, args, shared_bytes):
        kernel((grid,), (block,), args, shared_mem=shared_bytes)

    def table(self, values: np.ndarray):
        key = values.tobytes()
        table = self._tables.get(key)
        if table is None:
            table = self._cupy.asarray(values)
            # Cached tables are read later from whatever stream is current:
            # finish the upload once, here, instead of ordering every use.
            self._cupy.cuda.get_current_stream().synchronize()
            self._tables[key] = table
        return table

    def float32(self, n: int):
        return self._cupy.empty(max(n, 1), dtype=self._cupy.float32)


class SimulatorBackend:
    """Runs the generated kernels in numba's CUDA simulator on NumPy arrays."""

    simulate = True

    def __init__(self, shared_limit: int = 227 * 1024, max_slots: int = 2):
        self.shared_limit = shared_limit
        self.max_slots = max_slots

    def kernel(self, spec):
        return compiler.sim_kernel(spec)

    def call(self, kernel, grid, block, args, shared_bytes):
        flat = [a.reshape(-1) if isinstance(a, np.ndarray) else a for a in args]
        kernel[grid, block, 0, shared_bytes](*flat)

    def table(self, values: np.ndarray):
        return np.array(values, dtype=np.int64)

    def float32(self, n: int):
        return np.full(max(n, 1), np.nan, dtype=np.float32)


def work_buffers(problem: Problem, backward: bool, shared_limit: int, max_slots: int,
                 tuning: Tuning = Tuning()) -> tuple[int, ...]:
    """float32 sizes that :func:`run_forward` / :func:`run_backward` request.

    In request order from ``backend.float32``: the per-plane weight-gradient
    partials (backward only), then the global scratch (planes too large for
    shared memory only). Bindings that allocate through their framework use
    this to size buffers ahead of the call.
    """
    launch = plan_plane(problem, backward, shared_limit, max_slots, tuning)
    sizes = [problem.batch * problem.channels * launch.ntaps] if backward else []
    if launch.scratch_floats:
        sizes.append(launch.scratch_floats)
    return tuple(sizes)


def run_forward(backend, problem: Problem, x, y, weights: Weights,
                tuning: Tuning = Tuning()) -> None:
    """Launch the fused forward: ``y = WTConv(x)``.

    Parameters
    ----------
    backend : CupyBackend or SimulatorBackend
    problem : Problem
    x : array, (B, C, H, W), storage dtype
    y : array, (B, C, ceil(H/stride), ceil(W/stride)), storage dtype, written
    weights : Weights
        Backend arrays of the published parameters, storage dtype.
    tuning : Tuning, optional
        Launch-shape overrides.
    """
    launch = plan_plane(problem, False, backend.shared_limit, backend.max_slots, tuning)
    geo = backend.table(launch.geo)
    scratch = backend.float32(launch.scratch_floats) if launch.scratch_floats else geo
    args = (x, y, x, *weights, geo, scratch, geo)
    backend.call(backend.kernel(launch.spec), launch.grid, launch.block, args, launch.shared_bytes)


def run_backward(backend, problem: Problem, x, dy, dx, weights: Weights, grads: Weights,
                 tuning: Tuning = Tuning()) -> None:
    """Launch the fused backward: ``dx`` and every parameter gradient.

    Parameters
    ----------
    backend : CupyBackend or SimulatorBackend
    problem : Problem
    x : array, (B, C, H, W)
    dy : array, (B, C, ceil(H/stride), ceil(W/stride))
    dx : array, (B, C, H, W), written
    weights : Weights
    grads : Weights
        Arrays shaped like ``weights``, written (``base_bias`` only when the
        problem has a bias).
    tuning : Tuning, optional
        Launch-shape overrides.
    """
    launch = plan_plane(problem, True, backend.shared_limit, backend.max_slots, tuning)
    geo = backend.table(launch.geo)
    planes = problem.batch * problem.channels
    partial = backend.float32(planes * launch.ntaps)
    scratch = backend.float32(launch.scratch_floats) if launch.scratch_floats else geo
    args = (dy, dx, x, *weights, partial, scratch, geo)
    backend.call(backend.kernel(launch.spec), launch.grid, launch.block, args, launch.shared_bytes)

    dims = backend.table(np.array([problem.batch, problem.channels, problem.levels,
                                   int(problem.has_bias)], dtype=np.int64))
    finalize = backend.kernel(FinalizeSpec(problem.kernel_size, problem.storage, FINALIZE_THREADS))
    args = (partial, *weights, *grads, dims)
    backend.call(finalize, problem.channels, FINALIZE_THREADS, args, 4 * launch.ntaps)
