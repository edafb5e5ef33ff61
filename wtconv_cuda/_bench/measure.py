"""The measurements, with PyTorch tensors on one device.

Written for CUDA (CUDA events, ``torch.cuda`` memory statistics, the CuPy
path) but device-agnostic where it can be: on a CPU device the same code runs
with a wall-clock timer and without memory statistics, which is how the test
suite exercises it on machines without a GPU.

Implementations compared (keys of every result dict):

- ``ours``: :class:`wtconv_cuda.bindings.torch.WTConv2d` (the fused kernels
  through the PyTorch custom ops);
- ``cupy``: :func:`wtconv_cuda.forward` on CuPy views of the same tensors
  (inference and a training step with a :class:`wtconv_cuda.Tape`);
- ``materialising``: ``benchmarks/materialising.py``, the published layer's
  op sequence in stock PyTorch, with the same parameters;
- ``dw7``: PyTorch's depthwise ``nn.Conv2d(C, C, 7, padding=3, groups=C)``.
"""

from __future__ import annotations

import gc
import statistics
import time
import traceback
from typing import Any, Callable, NamedTuple

from .core import (
    Config,
    CudaEventTimer,
    PerfCounterTimer,
    compulsory_bytes,
    floor_ms,
    host_times_per_call,
    itemsize_of,
    roofline_fraction,
    speedup,
    time_median,
)
from .floors import conv_multiply_adds

__all__ = [
    "IMPLEMENTATIONS",
    "LABELS",
    "MODES",
    "TOLERANCE",
    "HOST_CONFIG",
    "MeasureOptions",
    "Runtime",
    "Impl",
    "module_impl",
    "cupy_impl",
    "build_implementations",
    "make_inputs",
    "relative_difference",
    "copy_bandwidth",
    "host_overhead",
    "measure_config",
    "skipped_row",
]

#: Implementation keys, in table order.
IMPLEMENTATIONS = ("ours", "cupy", "materialising", "dw7")
#: Human-readable names of the implementations.
LABELS = {
    "ours": "WTConv2d, fused kernels (torch binding)",
    "cupy": "wtconv_cuda.forward (CuPy arrays)",
    "materialising": "materialising PyTorch (benchmarks/materialising.py)",
    "dw7": "PyTorch depthwise 7x7 nn.Conv2d",
}
#: Measured modes: forward only, and forward + backward with every gradient.
MODES = ("inference", "training")
#: Largest norm-relative difference between ours and the materialising
#: implementation accepted as rounding, per dtype.
TOLERANCE = {"float64": 1e-10, "float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2}
#: The tiny problem of the host-overhead measurement.
HOST_CONFIG = Config(1, 8, 16, 16, 3, grid="tiny")


class MeasureOptions(NamedTuple):
    """How much to measure.

    Attributes
    ----------
    repeats : int
        Timed runs per median (>= 30 for a real measurement).
    warmup : int
        Untimed runs before timing.
    rotations : int
        Input sets used in turn.
    seed : int
        Seed of the inputs and parameters.
    host_calls : int
        Calls per host-overhead loop.
    host_rounds : int
        Host-overhead loops per implementation and mode, interleaved across the
        implementations; the host row reports their median.
    """

    repeats: int = 30
    warmup: int = 3
    rotations: int = 3
    seed: int = 0
    host_calls: int = 500
    host_rounds: int = 5


class Runtime:
    """The device measurements run on, and its timer and memory statistics.

    Parameters
    ----------
    torch : module
        The ``torch`` module.
    device : str or torch.device
        ``"cuda"``, ``"cuda:N"`` or ``"cpu"``.
    cupy : module, optional
        When given, :meth:`release` also empties CuPy's memory pool.
    """

    def __init__(self, torch, device, cupy=None):
        self.torch = torch
        self.cupy = cupy
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.is_cuda = self.device.type == "cuda"

    @property
    def name(self) -> str:
        """The device's name (``"NVIDIA H200"``, or ``"cpu"``)."""
        if self.is_cuda:
            return self.torch.cuda.get_device_name(self.device)
        return "cpu"

    def timer(self):
        """A CUDA event timer on a GPU, a wall-clock timer on the CPU."""
        if self.is_cuda:
            return CudaEventTimer(self.torch, self.device)
        return PerfCounterTimer()

    def synchronize(self) -> None:
        """Wait for all work queued on the device."""
        if self.is_cuda:
            self.torch.cuda.synchronize(self.device)

    def peak_bytes(self, fn: Callable, *args) -> int | None:
        """Peak device memory of ``fn(*args)`` above what was allocated before.

        The peak statistic is reset first, and ``fn``'s result is kept alive
        until the peak has been read.

        Parameters
        ----------
        fn : callable
        *args
            Its arguments (already resident).

        Returns
        -------
        int or None
            Bytes; ``None`` on the CPU (no statistics).
        """
        if not self.is_cuda:
            return None
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        cuda.reset_peak_memory_stats(self.device)
        before = cuda.memory_allocated(self.device)
        out = fn(*args)
        cuda.synchronize(self.device)
        peak = cuda.max_memory_allocated(self.device)
        del out
        return int(peak - before)

    def release(self) -> None:
        """Free cached device memory (between configurations and after errors)."""
        gc.collect()
        if self.is_cuda:
            self.torch.cuda.synchronize(self.device)
            self.torch.cuda.empty_cache()
            if self.cupy is not None:
                self.cupy.get_default_memory_pool().free_all_blocks()


class Impl(NamedTuple):
    """One implementation under test.

    Attributes
    ----------
    name : str
        A key of :data:`IMPLEMENTATIONS`.
    forward : callable
        ``forward(x) -> y`` without autograd.
    train : callable or None
        ``train(x, dy) -> (dx, *parameter gradients)``: one forward and one
        backward computing every gradient (``x`` requires grad).
    prepare : callable
        Converts a torch input for ``forward`` (identity, or a CuPy view).
    param_names : tuple of str
        Names of the parameters whose gradients ``train`` returns after ``dx``.
    """

    name: str
    forward: Callable
    train: Callable | None
    prepare: Callable
    param_names: tuple


def _identity(x):
    return x


def module_impl(name: str, module, torch) -> Impl:
    """Wrap an ``nn.Module`` as an :class:`Impl`.

    Parameters
    ----------
    name : str
    module : torch.nn.Module
    torch : module

    Returns
    -------
    Impl
        ``train`` returns ``torch.autograd.grad`` of ``x`` and of every
        trainable parameter (nothing accumulates into ``.grad``).
    """
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    params = tuple(p for _, p in named)

    def forward(x):
        with torch.no_grad():
            return module(x)

    def train(x, dy):
        y = module(x)
        return torch.autograd.grad(y, (x, *params), dy)

    return Impl(name, forward, train, _identity, tuple(n for n, _ in named))


def cupy_impl(layer, runtime: Runtime, cupy) -> Impl:
    """The CuPy path :func:`wtconv_cuda.forward` on zero-copy views of ``layer``'s weights.

    Work is queued on PyTorch's current stream, so the CUDA events time it
    (entering it as CuPy's current stream only where it is not already).

    Parameters
    ----------
    layer : wtconv_cuda.bindings.torch.WTConv2d
    runtime : Runtime
        A CUDA runtime.
    cupy : module

    Returns
    -------
    Impl
        ``train`` records the forward in a :class:`wtconv_cuda.Tape` and runs
        its backward; ``prepare`` turns a tensor into a CuPy array sharing its
        memory (applied to ``x`` and ``dy`` before timing).
    """
    import wtconv_cuda as wt

    held = [None if t is None else t.detach().contiguous() for t in layer.kernel_weights()]
    weights = wt.WTConvWeights(*(None if t is None else cupy.from_dlpack(t) for t in held))
    pointer = runtime.torch.cuda.current_stream(runtime.device).cuda_stream
    with cupy.cuda.Device(runtime.device.index):
        same_stream = cupy.cuda.get_current_stream().ptr == pointer

    def forward(x, _held=held):
        return wt.forward(x, weights)

    def train(x, dy, _held=held):
        tape = wt.Tape()
        wt.forward(x, weights, tape=tape)
        dx, grads = tape.backward(dy)
        return (dx, *(g for g in grads if g is not None))

    # Where CuPy's current stream is already PyTorch's (both are the legacy
    # default stream unless a caller changed one), a user would not switch
    # streams, so the timed calls do not either.
    if not same_stream:
        stream = cupy.cuda.Stream.null if pointer == 0 else cupy.cuda.ExternalStream(pointer)
        forward, train = _on_stream(stream, forward), _on_stream(stream, train)

    def prepare(x):
        return cupy.from_dlpack(x.detach())

    return Impl("cupy", forward, train, prepare, ())


def _on_stream(stream, fn):
    """``fn`` with ``stream`` as CuPy's current stream for the call."""
    def call(*args):
        with stream:
            return fn(*args)
    return call


def build_implementations(cfg: Config, dtype: str, runtime: Runtime, materialising=None,
                          cupy=None, seed: int = 0) -> dict:
    """The implementations of one configuration, with shared random parameters.

    Parameters
    ----------
    cfg : Config
    dtype : str
        ``float32``, ``float16``, ``bfloat16`` (or ``float64`` on the CPU).
    runtime : Runtime
    materialising : type, optional
        ``MaterialisingWTConv2d`` from ``benchmarks/materialising.py``; left
        out when ``None``.
    cupy : module, optional
        Adds the CuPy row (CUDA).
    seed : int, default 0

    Returns
    -------
    dict of str to Impl
        In :data:`IMPLEMENTATIONS` order.
    """
    torch = runtime.torch
    from ..bindings.torch import WTConv2d

    tdtype = getattr(torch, dtype)
    c, k = cfg.channels, cfg.kernel_size
    torch.manual_seed(seed)
    layer = WTConv2d(c, c, k, wt_levels=cfg.levels, device=runtime.device, dtype=tdtype)
    with torch.no_grad():  # random scales, so that every path and gradient matters
        layer.base_scale.weight.uniform_(0.5, 1.5)
        for scale in layer.wavelet_scale:
            scale.weight.uniform_(0.05, 0.15)
    impls = {"ours": module_impl("ours", layer, torch)}
    if cupy is not None and runtime.is_cuda:
        impls["cupy"] = cupy_impl(layer, runtime, cupy)
    if materialising is not None:
        impls["materialising"] = module_impl("materialising", materialising.from_layer(layer),
                                             torch)
    dw7 = torch.nn.Conv2d(c, c, 7, padding=3, groups=c, device=runtime.device, dtype=tdtype)
    impls["dw7"] = module_impl("dw7", dw7, torch)
    return impls


def make_inputs(cfg: Config, dtype: str, runtime: Runtime, rotations: int = 3, seed: int = 0):
    """Random (standard normal, never zero) inputs and output gradients.

    Parameters
    ----------
    cfg : Config
    dtype : str
    runtime : Runtime
    rotations : int, default 3
        Number of sets.
    seed : int, default 0

    Returns
    -------
    xs : list of torch.Tensor
        Leaf tensors that require grad.
    dys : list of torch.Tensor
    """
    torch = runtime.torch
    tdtype = getattr(torch, dtype)
    generator = torch.Generator(device=runtime.device).manual_seed(seed + 1)

    def draw():
        t = torch.randn(cfg.shape, generator=generator, device=runtime.device,
                        dtype=torch.float32)
        return t.to(tdtype)

    xs = [draw().requires_grad_(True) for _ in range(rotations)]
    dys = [draw() for _ in range(rotations)]
    return xs, dys


def relative_difference(a, b) -> float:
    """``||a - b|| / ||b||`` in float64 (``||a - b||`` when ``b`` is zero).

    Parameters
    ----------
    a, b : torch.Tensor
        Same shape.

    Returns
    -------
    float
    """
    a, b = a.detach().double(), b.detach().double()
    diff = float((a - b).norm())
    scale = float(b.norm())
    return diff / scale if scale > 0 else diff


def copy_bandwidth(runtime: Runtime, nbytes: int = 1 << 30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted).

    Parameters
    ----------
    runtime : Runtime
    nbytes : int, default 1 GiB
        Size of the copied buffer.
    repeats : int, default 20

    Returns
    -------
    float
    """
    moved, ms = _time_copy(runtime, nbytes, repeats)
    runtime.release()  # the buffers are gone: hand their memory back
    return moved / (ms * 1e-3)


def _time_copy(runtime: Runtime, nbytes: int, repeats: int):
    """Bytes moved by one copy (read + write) and its median milliseconds."""
    src = runtime.torch.rand(max(nbytes // 4, 1), device=runtime.device)
    dst = runtime.torch.empty_like(src)

    def copy():
        dst.copy_(src)

    timing = time_median(copy, [()], runtime.timer(), repeat=repeats, warmup=3)
    return 2 * src.numel() * src.element_size(), timing.median_ms


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip()[:400]}"


def host_overhead(runtime: Runtime, opts: MeasureOptions, materialising=None, cupy=None) -> dict:
    """End-to-end microseconds per call at the tiny :data:`HOST_CONFIG` (float32).

    Each implementation's forward and training step run ``opts.host_rounds``
    loops of ``opts.host_calls`` calls. The rounds go through every
    implementation in turn, so a drift of the host's speed reaches them
    alike, and the collector runs before each loop, so none pays for the
    garbage of the loop before it. A loop's time can vary 1.7x between
    rounds of one process (``benchmarks/NOTES.md``, fifty-second session):
    the row reports the median of the rounds, and the JSON keeps every round.

    Parameters
    ----------
    runtime : Runtime
    opts : MeasureOptions
        ``host_calls`` calls per loop, ``host_rounds`` loops per measurement.
    materialising : type, optional
    cupy : module, optional

    Returns
    -------
    dict
        ``shape``, ``levels``, ``calls``, ``rounds`` and per implementation
        ``{"forward_us": ..., "training_us": ..., "forward_queued_us": ...,
        "training_queued_us": ..., "forward_rounds_us": [...],
        "training_rounds_us": [...]}`` (or ``{"error": ...}``): ``*_us`` the
        median over rounds of the time until the device finished a loop,
        ``*_queued_us`` until its last call returned (see
        :class:`~wtconv_cuda._bench.core.HostTime`; where the two differ, the
        device set the pace), ``*_rounds_us`` each round's ``*_us``.
    """
    cfg = HOST_CONFIG
    rounds = max(1, opts.host_rounds)
    result = {"shape": list(cfg.shape), "levels": cfg.levels, "kernel_size": cfg.kernel_size,
              "dtype": "float32", "calls": opts.host_calls, "rounds": rounds, "us": {}}
    impls = build_implementations(cfg, "float32", runtime, materialising, cupy, opts.seed)
    xs, dys = make_inputs(cfg, "float32", runtime, 1, opts.seed)
    loops, errors = {}, {}
    for name, impl in impls.items():
        try:
            x = impl.prepare(xs[0])
            loops[name] = [("forward", impl.forward, (x,))]
            if impl.train is not None:
                loops[name].append(("training", impl.train, (x, impl.prepare(dys[0]))))
        except Exception as exc:  # one failing path must not hide the others
            errors[name] = _error_text(exc)
    times = {name: {} for name in loops}
    for _ in range(rounds):
        for name, calls in loops.items():
            if name in errors:
                continue
            try:
                for mode, fn, args in calls:
                    gc.collect()
                    times[name].setdefault(mode, []).append(
                        host_times_per_call(fn, args, opts.host_calls, sync=runtime.synchronize))
            except Exception as exc:
                errors[name] = _error_text(exc)
    for name in impls:
        if name in errors:
            result["us"][name] = {"error": errors[name]}
            continue
        entry = {}
        for mode, measured in times[name].items():
            entry[f"{mode}_us"] = statistics.median(t.wall_us for t in measured)
            entry[f"{mode}_queued_us"] = statistics.median(t.queued_us for t in measured)
            entry[f"{mode}_rounds_us"] = [t.wall_us for t in measured]
        result["us"][name] = entry
    del impls, xs, dys, loops
    runtime.release()
    return result


def _base_row(cfg: Config, dtype: str, bandwidth) -> dict:
    nbytes = compulsory_bytes(cfg.shape, itemsize_of(dtype))
    return {
        "grid": cfg.grid,
        "label": cfg.label,
        "shape": list(cfg.shape),
        "levels": cfg.levels,
        "kernel_size": cfg.kernel_size,
        "stride": 1,
        "dtype": dtype,
        "x_bytes": nbytes["x"],
        "compulsory_bytes": {m: nbytes[m] for m in MODES},
        "floor_ms": {m: (floor_ms(nbytes[m], bandwidth) if bandwidth else None) for m in MODES},
        "multiply_adds": conv_multiply_adds(cfg.shape, cfg.levels, cfg.kernel_size),
    }


def skipped_row(cfg: Config, dtype: str, reason: str, bandwidth=None) -> dict:
    """The row of a configuration that was not measured.

    Parameters
    ----------
    cfg : Config
    dtype : str
    reason : str
    bandwidth : float, optional

    Returns
    -------
    dict
    """
    row = _base_row(cfg, dtype, bandwidth)
    row["skipped"] = reason
    return row


def _check(row, impls, xs, dys, dtype, errors, torch):
    """Compare ours with the materialising implementation (and the CuPy path)."""
    ours = impls["ours"]
    check: dict[str, Any] = {}
    y = ours.forward(xs[0])
    reference = impls.get("materialising")
    if reference is not None:
        check["y"] = relative_difference(y, reference.forward(xs[0]))
    if "cupy" in impls:
        try:
            y_cupy = torch.from_dlpack(impls["cupy"].forward(impls["cupy"].prepare(xs[0])))
            check["cupy_y"] = relative_difference(y_cupy, y)
        except Exception as exc:
            errors["check/cupy"] = _error_text(exc)
    del y
    if reference is not None:
        mine = ours.train(xs[0], dys[0])
        theirs = reference.train(xs[0], dys[0])
        check["dx"] = relative_difference(mine[0], theirs[0])
        by_name = dict(zip(reference.param_names, theirs[1:]))
        diffs = [relative_difference(g, by_name[n])
                 for n, g in zip(ours.param_names, mine[1:]) if n in by_name]
        check["dweights"] = max(diffs) if diffs else None
        del mine, theirs, by_name
    measured = [v for key, v in check.items() if key in ("y", "dx", "dweights", "cupy_y")
                and v is not None]
    check["tolerance"] = TOLERANCE[dtype]
    check["ok"] = all(v <= TOLERANCE[dtype] for v in measured) if measured else None
    row["check"] = check


def measure_config(cfg: Config, dtype: str, runtime: Runtime, opts: MeasureOptions,
                   materialising=None, cupy=None, bandwidth=None) -> dict:
    """Measure one configuration and dtype with every implementation.

    In order: build the implementations and ``opts.rotations`` random input
    sets; one call of each (first-call compilation and cuDNN autotuning
    happen here) that also compares ours with the materialising
    implementation; the peak memory of an inference and of a training step
    of each; then the median times of inference and of training steps. A
    failing step (out of memory, say) is recorded under ``errors`` and the
    others go on.

    Parameters
    ----------
    cfg : Config
    dtype : str
    runtime : Runtime
    opts : MeasureOptions
    materialising : type, optional
        ``MaterialisingWTConv2d``.
    cupy : module, optional
    bandwidth : float, optional
        Copy bandwidth in bytes/s, for the roofline fractions.

    Returns
    -------
    dict
        JSON-ready: sizes, ``inference_ms`` / ``training_ms`` (medians per
        implementation), ``timings`` (median, min, max, runs),
        ``inference_peak_bytes`` / ``training_peak_bytes``, ``speedup``
        (ours against ``dw7`` and ``materialising``), ``roofline`` (fraction
        of the copy-bandwidth floor), ``check`` and ``errors``.
    """
    start = time.monotonic()
    row = _base_row(cfg, dtype, bandwidth)
    errors: dict[str, str] = {}
    for mode in MODES:
        row[f"{mode}_ms"] = {}
        row[f"{mode}_peak_bytes"] = {}
    row["timings"] = {mode: {} for mode in MODES}
    impls = xs = dys = None
    try:
        impls = build_implementations(cfg, dtype, runtime, materialising, cupy, opts.seed)
        xs, dys = make_inputs(cfg, dtype, runtime, opts.rotations, opts.seed)
        try:
            _check(row, impls, xs, dys, dtype, errors, runtime.torch)
        except Exception as exc:
            errors["check"] = _error_text(exc)
            runtime.release()
        for name, impl in impls.items():
            for mode in MODES:
                fn = impl.forward if mode == "inference" else impl.train
                if fn is None or name == "cupy":  # CuPy's pool is not torch's: no statistics
                    continue
                args = (xs[0],) if mode == "inference" else (xs[0], dys[0])
                try:
                    row[f"{mode}_peak_bytes"][name] = runtime.peak_bytes(fn, *args)
                except Exception as exc:
                    errors[f"{name}/{mode}/memory"] = _error_text(exc)
                    runtime.release()
        for mode in MODES:
            for name, impl in impls.items():
                fn = impl.forward if mode == "inference" else impl.train
                if fn is None:
                    continue
                try:
                    if mode == "inference":
                        inputs = [(impl.prepare(x),) for x in xs]
                    else:
                        inputs = [(impl.prepare(x), impl.prepare(dy)) for x, dy in zip(xs, dys)]
                    timing = time_median(fn, inputs, runtime.timer(), opts.repeats, opts.warmup)
                    del inputs
                except Exception as exc:
                    errors[f"{name}/{mode}"] = _error_text(exc)
                    runtime.release()
                    continue
                row[f"{mode}_ms"][name] = timing.median_ms
                row["timings"][mode][name] = timing.as_dict()
    except Exception as exc:
        errors["setup"] = _error_text(exc)
        errors["setup_trace"] = traceback.format_exc(limit=4)
    finally:
        del impls, xs, dys
        runtime.release()

    row["speedup"] = {}
    row["roofline"] = {}
    for mode in MODES:
        times = row[f"{mode}_ms"]
        for base in ("dw7", "materialising"):
            row["speedup"][f"{mode}_vs_{base}"] = speedup(times.get(base), times.get("ours"))
        row["roofline"][mode] = {
            name: roofline_fraction(row["compulsory_bytes"][mode], ms, bandwidth)
            for name, ms in times.items()}
    row["errors"] = errors
    row["seconds"] = time.monotonic() - start
    return row
