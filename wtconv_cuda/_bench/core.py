"""Pure helpers of the benchmark: grids, byte counts, roofline, timing, budget, progress.

Nothing here imports PyTorch or CuPy at module level; the CUDA event timer
receives the ``torch`` module from its caller.
"""

from __future__ import annotations

import datetime
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

__all__ = [
    "Config",
    "CONVNEXT_T",
    "PAPER_BATCH",
    "PAPER_CHANNELS",
    "PAPER_SIZES",
    "PAPER_LEVELS",
    "QUICK_PAPER",
    "DTYPES",
    "paper_grid",
    "select_configs",
    "ordered_work",
    "parse_dtypes",
    "itemsize_of",
    "tensor_bytes",
    "compulsory_bytes",
    "floor_ms",
    "roofline_fraction",
    "speedup",
    "Timing",
    "PerfCounterTimer",
    "CudaEventTimer",
    "time_median",
    "HostTime",
    "host_times_per_call",
    "host_time_per_call",
    "BudgetGuard",
    "SimpleProgress",
    "progress_bar",
    "device_slug",
    "default_json_path",
]

KERNEL_SIZE = 5


class Config(NamedTuple):
    """One benchmarked layer size.

    Attributes
    ----------
    batch, channels, height, width : int
        Input shape ``(B, C, H, W)``.
    levels : int
        Wavelet levels ``L``.
    kernel_size : int
        Odd ``K``.
    grid : str
        The grid it belongs to (``"convnext"``, ``"paper"`` or ``"tiny"``).
    """

    batch: int
    channels: int
    height: int
    width: int
    levels: int
    kernel_size: int = KERNEL_SIZE
    grid: str = "convnext"

    @property
    def shape(self) -> tuple:
        """``(B, C, H, W)``."""
        return (self.batch, self.channels, self.height, self.width)

    @property
    def label(self) -> str:
        """Short text such as ``"64x96x56x56 L5"``."""
        return "x".join(str(v) for v in self.shape) + f" L{self.levels}"


#: WTConvNeXt-T: the four ConvNeXt-T stages at batch 64 with the published levels, K = 5.
CONVNEXT_T = (
    Config(64, 96, 56, 56, 5),
    Config(64, 192, 28, 28, 4),
    Config(64, 384, 14, 14, 3),
    Config(64, 768, 7, 7, 2),
)
PAPER_BATCH = 8
PAPER_CHANNELS = (32, 64, 128)
PAPER_SIZES = (128, 256, 512)
PAPER_LEVELS = (1, 3, 5)
#: The two paper-grid sizes kept by ``--quick`` (the kernel benchmark's large planes).
QUICK_PAPER = (Config(8, 64, 256, 256, 3, grid="paper"), Config(8, 32, 512, 512, 5, grid="paper"))

#: Benchmarked storage dtypes, in order.
DTYPES = ("float32", "float16", "bfloat16")
_DTYPE_ALIASES = {"fp32": "float32", "float32": "float32", "f32": "float32",
                  "fp16": "float16", "float16": "float16", "half": "float16", "f16": "float16",
                  "bf16": "bfloat16", "bfloat16": "bfloat16"}
_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def paper_grid() -> list:
    """The paper's grid: B = 8, C in {32, 64, 128}, H = W in {128, 256, 512}, L in {1, 3, 5}.

    Returns
    -------
    list of Config
        27 configurations with ``K = 5``, ordered by ``C``, then size, then ``L``.
    """
    return [Config(PAPER_BATCH, c, s, s, lv, grid="paper")
            for c in PAPER_CHANNELS for s in PAPER_SIZES for lv in PAPER_LEVELS]


def select_configs(shapes: str, quick: bool = False) -> list:
    """The configurations of a ``--shapes`` choice.

    Parameters
    ----------
    shapes : {"convnext", "paper", "all"}
        Which grid(s).
    quick : bool, default False
        Keep only :data:`QUICK_PAPER` of the paper's grid.

    Returns
    -------
    list of Config
        ConvNeXt stages first, then the paper's grid.

    Raises
    ------
    ValueError
        Unknown ``shapes``.
    """
    if shapes not in ("convnext", "paper", "all"):
        raise ValueError(f"shapes must be convnext, paper or all, got {shapes!r}")
    configs = []
    if shapes in ("convnext", "all"):
        configs += list(CONVNEXT_T)
    if shapes in ("paper", "all"):
        configs += list(QUICK_PAPER) if quick else paper_grid()
    return configs


def ordered_work(configs: Sequence[Config], dtypes: Sequence[str]) -> list:
    """The (config, dtype) pairs in measuring order.

    ConvNeXt stages come first (every dtype), then the other grids from the
    smallest input to the largest, so that a run cut short by its time budget
    loses the most expensive sizes and keeps the most configurations.

    Parameters
    ----------
    configs : sequence of Config
    dtypes : sequence of str

    Returns
    -------
    list of (Config, str)
    """
    def elements(cfg):
        return cfg.batch * cfg.channels * cfg.height * cfg.width

    first = [(c, d) for c in configs if c.grid == "convnext" for d in dtypes]
    rest = sorted(((c, d) for c in configs if c.grid != "convnext" for d in dtypes),
                  key=lambda cd: (elements(cd[0]), cd[0].levels, dtypes.index(cd[1])))
    return first + rest


def parse_dtypes(values: Sequence[str]) -> list:
    """Normalise ``--dtypes`` values (``fp32``, ``float16``, ``bf16``, comma lists, ...).

    Parameters
    ----------
    values : sequence of str

    Returns
    -------
    list of str
        Canonical names from :data:`DTYPES`, without repeats, in the given order.

    Raises
    ------
    ValueError
        An unknown name.
    """
    out = []
    for value in values:
        for part in value.split(","):
            part = part.strip().lower()
            if not part:
                continue
            if part not in _DTYPE_ALIASES:
                raise ValueError(f"unknown dtype {part!r}; choose from fp32, fp16, bf16")
            name = _DTYPE_ALIASES[part]
            if name not in out:
                out.append(name)
    if not out:
        raise ValueError("no dtype given")
    return out


def itemsize_of(dtype: str) -> int:
    """Bytes per element of a dtype name (``float32`` -> 4).

    Parameters
    ----------
    dtype : str

    Returns
    -------
    int
    """
    return _ITEMSIZE[dtype]


def tensor_bytes(shape: Sequence[int], itemsize: int) -> int:
    """Bytes of a dense tensor.

    Parameters
    ----------
    shape : sequence of int
    itemsize : int

    Returns
    -------
    int
    """
    n = itemsize
    for v in shape:
        n *= int(v)
    return n


def compulsory_bytes(shape: Sequence[int], itemsize: int, stride: int = 1) -> dict:
    """Bytes that any implementation must move through memory.

    Forward reads ``x`` and writes ``y``; backward reads ``x`` and ``dy`` and
    writes ``dx``; a training step does both (weights and weight gradients
    are negligible and not counted). With stride 1 that is 2x and 3x the
    bytes of ``x``, 5x for a training step.

    Parameters
    ----------
    shape : sequence of int
        ``(B, C, H, W)`` of ``x``.
    itemsize : int
        Bytes per element.
    stride : int, default 1
        Output subsampling; ``y`` and ``dy`` are ``ceil(H/s) x ceil(W/s)``.

    Returns
    -------
    dict
        ``x``, ``y``, ``inference`` (forward), ``backward`` and ``training``
        byte counts (ints).
    """
    b, c, h, w = (int(v) for v in shape)
    x = tensor_bytes((b, c, h, w), itemsize)
    y = tensor_bytes((b, c, -(-h // stride), -(-w // stride)), itemsize)
    backward = x + y + x
    return {"x": x, "y": y, "inference": x + y, "backward": backward,
            "training": x + y + backward}


def floor_ms(nbytes: float, bandwidth: float) -> float:
    """Time to move ``nbytes`` at ``bandwidth`` bytes/s, in milliseconds.

    Parameters
    ----------
    nbytes : float
    bandwidth : float
        Bytes per second (read + write counted), > 0.

    Returns
    -------
    float
    """
    return nbytes / bandwidth * 1e3


def roofline_fraction(nbytes: float, ms, bandwidth) -> float | None:
    """Fraction of the memory roofline reached: ``floor_ms / ms``.

    Parameters
    ----------
    nbytes : float
        Compulsory bytes of the operation.
    ms : float or None
        Measured time in milliseconds.
    bandwidth : float or None
        Measured copy bandwidth in bytes/s.

    Returns
    -------
    float or None
        ``None`` when a time or the bandwidth is missing or not positive.
    """
    if not ms or not bandwidth or ms <= 0 or bandwidth <= 0:
        return None
    return floor_ms(nbytes, bandwidth) / ms


def speedup(baseline_ms, ours_ms) -> float | None:
    """How many times faster ours is than a baseline (``baseline / ours``).

    Parameters
    ----------
    baseline_ms, ours_ms : float or None

    Returns
    -------
    float or None
        ``None`` when either time is missing or not positive.
    """
    if not baseline_ms or not ours_ms or baseline_ms <= 0 or ours_ms <= 0:
        return None
    return baseline_ms / ours_ms


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


class Timing(NamedTuple):
    """Summary of one timed loop (milliseconds).

    Attributes
    ----------
    median_ms, min_ms, max_ms : float
    runs : int
        Number of timed runs.
    """

    median_ms: float
    min_ms: float
    max_ms: float
    runs: int

    def as_dict(self) -> dict:
        """The fields as a plain dict (for JSON)."""
        return self._asdict()


class PerfCounterTimer:
    """Host wall-clock timer (``time.perf_counter``), for CPU runs.

    Parameters
    ----------
    sync : callable, optional
        Called before each mark and by :meth:`sync` (default: nothing).
    clock : callable, optional
        Returns seconds (default ``time.perf_counter``).
    """

    def __init__(self, sync: Callable[[], Any] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self._sync = sync or (lambda: None)
        self._clock = clock

    def mark(self) -> float:
        """The current time (after synchronising)."""
        self._sync()
        return self._clock()

    def sync(self) -> None:
        """Wait for queued work (if a sync function was given)."""
        self._sync()

    @staticmethod
    def elapsed_ms(start: float, stop: float) -> float:
        """Milliseconds between two marks."""
        return (stop - start) * 1e3


class CudaEventTimer:
    """GPU timer with CUDA events on PyTorch's current stream.

    Marks are recorded without synchronising, so consecutive runs queue
    back to back and the host's launch cost is hidden behind the GPU work
    of earlier runs (host cost is measured separately, end to end). A call
    that the GPU finishes before the host issues the next one is timed by
    the host: the interval then holds the call's host time and whatever the
    stop mark does before its record reaches the stream, so a mark only
    records (the stream is looked up when the timer is made, the events by
    :meth:`reserve`): ``torch.cuda.current_stream(device)`` costs
    microseconds of host time, which a short host-bound call would otherwise
    be charged (``benchmarks/NOTES.md``, twelfth session).

    Parameters
    ----------
    torch : module
        The ``torch`` module.
    device : torch.device or None
        The CUDA device (default: the current one). Its stream current when
        the timer is made is the one timed.
    """

    def __init__(self, torch, device=None):
        self._torch = torch
        self._device = device
        self._stream = torch.cuda.current_stream(device)
        self._spare: list = []

    def reserve(self, n: int) -> None:
        """Create ``n`` events ahead, so that :meth:`mark` only records one.

        A mark inside the timed interval that first creates its event adds
        the creation's host time to a call that the GPU finishes before the
        host issues the next one.
        """
        while len(self._spare) < n:
            self._spare.append(self._torch.cuda.Event(enable_timing=True))

    def mark(self):
        """Record a timing event on the timer's stream and return it (a reserved one
        when there is one)."""
        event = self._spare.pop() if self._spare else self._torch.cuda.Event(enable_timing=True)
        event.record(self._stream)
        return event

    def sync(self) -> None:
        """Wait for the device."""
        self._torch.cuda.synchronize(self._device)

    @staticmethod
    def elapsed_ms(start, stop) -> float:
        """Milliseconds between two recorded (and completed) events."""
        return float(start.elapsed_time(stop))


class CupyEventTimer:
    """GPU timer with CUDA events on CuPy's current stream (see :class:`CudaEventTimer`).

    Parameters
    ----------
    cupy : module
        The ``cupy`` module.
    """

    def __init__(self, cupy):
        self._cupy = cupy
        self._spare: list = []

    def reserve(self, n: int) -> None:
        """Create ``n`` events ahead (see :meth:`CudaEventTimer.reserve`)."""
        while len(self._spare) < n:
            self._spare.append(self._cupy.cuda.Event())

    def mark(self):
        """Record a timing event on CuPy's current stream and return it (a reserved one
        when there is one)."""
        event = self._spare.pop() if self._spare else self._cupy.cuda.Event()
        event.record()
        return event

    def sync(self) -> None:
        """Wait for the current device."""
        self._cupy.cuda.Device().synchronize()

    def elapsed_ms(self, start, stop) -> float:
        """Milliseconds between two recorded (and completed) events."""
        return float(self._cupy.cuda.get_elapsed_time(start, stop))


def time_median(fn: Callable, inputs: Sequence[tuple], timer, repeat: int = 30,
                warmup: int = 3) -> Timing:
    """Median time of ``fn(*inputs[i % len(inputs)])`` over ``repeat`` runs.

    ``warmup`` untimed calls come first (rotating through the inputs too);
    the timed calls then rotate through ``inputs`` so that caches hold the
    previous set, not the one being read. The timer's marks bracket each
    call; times are read after one final :meth:`sync`. A timer with a
    ``reserve(n)`` method is asked for the ``2 * repeat`` marks first.

    Parameters
    ----------
    fn : callable
    inputs : sequence of tuple
        Argument tuples, used in turn (at least one).
    timer : object
        With ``mark()``, ``sync()`` and ``elapsed_ms(start, stop)``
        (:class:`CudaEventTimer`, :class:`PerfCounterTimer` or a fake).
    repeat : int, default 30
        Timed runs, >= 1.
    warmup : int, default 3
        Untimed runs first, >= 0.

    Returns
    -------
    Timing

    Raises
    ------
    ValueError
        ``repeat < 1``, ``warmup < 0`` or no inputs.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if not inputs:
        raise ValueError("at least one input tuple is needed")
    n = len(inputs)
    for i in range(warmup):
        fn(*inputs[i % n])
    if hasattr(timer, "reserve"):
        timer.reserve(2 * repeat)
    timer.sync()
    marks = []
    for i in range(repeat):
        args = inputs[i % n]
        start = timer.mark()
        fn(*args)
        stop = timer.mark()
        marks.append((start, stop))
    timer.sync()
    times = [timer.elapsed_ms(a, b) for a, b in marks]
    return Timing(statistics.median(times), min(times), max(times), len(times))


class HostTime(NamedTuple):
    """Microseconds per call of a back-to-back loop (:func:`host_times_per_call`).

    Attributes
    ----------
    queued_us : float
        Until the last call returned: the host's cost per call where the
        device keeps up.
    wall_us : float
        Until the device had finished every call as well. ``wall_us`` well
        above ``queued_us`` means the device, not the host, set the pace.
    """

    queued_us: float
    wall_us: float


def host_times_per_call(fn: Callable, args: tuple = (), calls: int = 500, warmup: int = 20,
                        sync: Callable[[], Any] | None = None,
                        clock: Callable[[], float] = time.perf_counter) -> HostTime:
    """Queued and end-to-end microseconds per call of ``fn(*args)`` in a back-to-back loop.

    The clock runs from before the first call to after the last call has
    returned (queued) and to after a final synchronisation (wall), so the
    wall time is the host cost per call when the work is tiny and the device
    time when it is not.

    Parameters
    ----------
    fn : callable
    args : tuple, default ()
    calls : int, default 500
        Timed calls, >= 1.
    warmup : int, default 20
        Untimed calls first.
    sync : callable, optional
        Waits for the device (default: nothing).
    clock : callable, default time.perf_counter

    Returns
    -------
    HostTime

    Raises
    ------
    ValueError
        ``calls < 1``.
    """
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn(*args)
    sync()
    start = clock()
    for _ in range(calls):
        fn(*args)
    queued = clock()
    sync()
    done = clock()
    return HostTime((queued - start) / calls * 1e6, (done - start) / calls * 1e6)


def host_time_per_call(fn: Callable, args: tuple = (), calls: int = 500, warmup: int = 20,
                       sync: Callable[[], Any] | None = None,
                       clock: Callable[[], float] = time.perf_counter) -> float:
    """End-to-end microseconds per call: :func:`host_times_per_call`'s ``wall_us``.

    Parameters
    ----------
    fn, args, calls, warmup, sync, clock
        As in :func:`host_times_per_call`.

    Returns
    -------
    float
        Microseconds per call.

    Raises
    ------
    ValueError
        ``calls < 1``.
    """
    return host_times_per_call(fn, args, calls, warmup, sync, clock).wall_us


class BudgetGuard:
    """Decides whether the next configuration still fits in a time budget.

    A configuration's cost is predicted from the most recently measured one,
    scaled by the ratio of their work (elements of ``x``): configurations
    are measured from small to large, so the last one is the closest.

    Parameters
    ----------
    budget_s : float or None
        Seconds from ``start``; ``None`` or <= 0: no limit.
    clock : callable, default time.monotonic
    start : float, optional
        Clock value the budget counts from (default: now).
    """

    def __init__(self, budget_s, clock: Callable[[], float] = time.monotonic, start=None):
        self.budget_s = budget_s if budget_s and budget_s > 0 else None
        self._clock = clock
        self.start = clock() if start is None else start
        self._rate = None

    def elapsed(self) -> float:
        """Seconds since ``start``."""
        return self._clock() - self.start

    def record(self, work: float, seconds: float) -> None:
        """Account a finished configuration.

        Parameters
        ----------
        work : float
            Its size (elements of ``x``), > 0.
        seconds : float
            What it took.
        """
        if work > 0:
            self._rate = seconds / work

    def predict(self, work: float) -> float:
        """Predicted seconds for ``work`` (0 before anything was recorded)."""
        return 0.0 if self._rate is None else self._rate * work

    def allows(self, work: float) -> bool:
        """Whether a configuration of size ``work`` should still be run."""
        if self.budget_s is None:
            return True
        return self.elapsed() + self.predict(work) <= self.budget_s


# ---------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------


class SimpleProgress:
    """A minimal progress bar for when ``tqdm`` is not installed.

    On a terminal it redraws one line; otherwise (a log file) it prints one
    line per step.

    Parameters
    ----------
    total : int
    desc : str, default ""
    stream : file-like, default sys.stderr
    width : int, default 30
        Characters of the bar.
    """

    def __init__(self, total: int, desc: str = "", stream=None, width: int = 30):
        self.total = max(int(total), 0)
        self.n = 0
        self.desc = desc
        self.postfix = ""
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._start = time.monotonic()

    def render(self) -> str:
        """The current bar as text."""
        frac = self.n / self.total if self.total else 1.0
        filled = int(round(frac * self.width))
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.monotonic() - self._start
        text = f"{self.desc} [{bar}] {self.n}/{self.total} {elapsed:5.0f}s"
        return f"{text} {self.postfix}".rstrip()

    def _draw(self) -> None:
        if self._tty:
            self.stream.write("\r" + self.render())
        else:
            self.stream.write(self.render() + "\n")
        self.stream.flush()

    def set_postfix_str(self, text: str) -> None:
        """Show ``text`` after the bar (the current item)."""
        self.postfix = text
        if self._tty:
            self._draw()

    def update(self, n: int = 1) -> None:
        """Advance by ``n`` steps."""
        self.n = min(self.total, self.n + n)
        self._draw()

    def close(self) -> None:
        """Finish the line."""
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()


def progress_bar(total: int, desc: str = "", enable: bool = True, stream=None):
    """A progress bar on standard error.

    On a terminal: ``tqdm`` if installed, else :class:`SimpleProgress`.
    When standard error is not a terminal (a log file, a remote run's
    captured output), :class:`SimpleProgress` writes one line per step
    instead of carriage-return redraws.

    Parameters
    ----------
    total : int
    desc : str, default ""
    enable : bool, default True
        ``False`` returns a bar that draws nothing.
    stream : file-like, optional
        Default ``sys.stderr``.

    Returns
    -------
    object
        With ``update(n)``, ``set_postfix_str(text)`` and ``close()``.
    """
    stream = stream if stream is not None else sys.stderr
    if not enable:
        return SimpleProgress(total, desc, stream=_NullStream())
    if not getattr(stream, "isatty", lambda: False)():
        return SimpleProgress(total, desc, stream=stream)
    try:
        from tqdm import tqdm
    except ImportError:
        return SimpleProgress(total, desc, stream=stream)
    return tqdm(total=total, desc=desc, file=stream, dynamic_ncols=True, mininterval=0.5)


class _NullStream:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


# ---------------------------------------------------------------------------
# Names and paths
# ---------------------------------------------------------------------------


def device_slug(name: str) -> str:
    """A file-name friendly device name (``"NVIDIA H200"`` -> ``"nvidia-h200"``).

    Parameters
    ----------
    name : str

    Returns
    -------
    str
        Lower case letters, digits and single dashes; ``"unknown"`` if empty.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "unknown"


def default_json_path(out_dir, device_name: str, date: datetime.date | None = None) -> Path:
    """``<out_dir>/bench-<device>-<YYYY-MM-DD>.json``.

    Parameters
    ----------
    out_dir : str or Path
    device_name : str
    date : datetime.date, optional
        Default: today.

    Returns
    -------
    Path
    """
    date = date or datetime.date.today()
    return Path(out_dir) / f"bench-{device_slug(device_name)}-{date.isoformat()}.json"
