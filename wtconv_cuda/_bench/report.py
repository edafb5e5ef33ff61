"""Terminal tables, the JSON file and the speedup plot of a benchmark run."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Sequence

from .floors import floor_fraction, fp32_fma_rate
from .targets import targets_lines

__all__ = [
    "format_table",
    "fmt_ms",
    "fmt_times",
    "fmt_pct",
    "fmt_mib",
    "inference_table",
    "training_table",
    "host_table",
    "render_report",
    "write_json",
    "read_json",
    "plot_speedups",
]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Plain-text table: first column left-aligned, the others right-aligned.

    Parameters
    ----------
    headers : sequence of str
    rows : sequence of sequence of str
        Each as long as ``headers``.

    Returns
    -------
    str
        Header line, a rule, then one line per row (no trailing newline).

    Raises
    ------
    ValueError
        A row of the wrong length.
    """
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {row!r} has {len(row)} cells, expected {len(headers)}")
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        parts = [cells[0].ljust(widths[0])]
        parts += [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule] + [line(r) for r in rows])


def fmt_ms(value) -> str:
    """Milliseconds with 3 decimals (``"-"`` for None)."""
    return "-" if value is None else f"{value:.3f}"


def fmt_times(value) -> str:
    """A speedup as ``"1.25x"`` (``"-"`` for None)."""
    return "-" if value is None else f"{value:.2f}x"


def fmt_pct(value) -> str:
    """A fraction as a percentage, ``"7.1%"`` (``"-"`` for None)."""
    return "-" if value is None else f"{100 * value:.1f}%"


def fmt_mib(value) -> str:
    """Bytes as MiB without decimals (``"-"`` for None)."""
    return "-" if value is None else f"{value / 2**20:.0f}"


def _check_cell(row) -> str:
    check = row.get("check") or {}
    values = [check.get(k) for k in ("y", "dx", "dweights", "cupy_y") if check.get(k) is not None]
    if not values:
        return "-"
    worst = max(values)
    return f"ok {worst:.0e}" if check.get("ok") else f"DIFF {worst:.0e}"


def _skipped(row, width: int) -> list:
    return [row["label"], row["dtype"], f"skipped ({row['skipped']})"] + [""] * (width - 3)


def _floor_cell(row, mode: str, floors) -> str:
    """``fmt_pct`` of the CuPy path's fraction of its time floor (``floors``: the run's
    copy bandwidth and fp32 multiply-add rate). The CuPy path, because ``WTConv2d``'s
    time includes PyTorch's host cost wherever it is host-bound."""
    bandwidth, fma_rate = floors
    if not bandwidth and not fma_rate:
        return "-"
    return fmt_pct(floor_fraction(row, mode, "cupy", bandwidth, fma_rate))


def inference_table(rows: Sequence[dict], floors=(None, None)) -> str:
    """Forward-only medians, speedups of ours, roofline and floor fractions and check.

    Parameters
    ----------
    rows : sequence of dict
        Rows of :func:`wtconv_cuda._bench.measure.measure_config`.
    floors : tuple, optional
        ``(copy bandwidth, fp32 multiply-adds per second)`` of the run, either
        None where unknown, for the "cupy of floor" column
        (:func:`wtconv_cuda._bench.floors.floor_fraction`); "-" without both.

    Returns
    -------
    str
    """
    headers = ["config", "dtype", "ours ms", "cupy ms", "mat. ms", "dw7x7 ms", "vs mat.",
               "vs dw7x7", "roofline", "cupy of floor", "check vs mat."]
    body = []
    for row in rows:
        if "skipped" in row:
            body.append(_skipped(row, len(headers)))
            continue
        t, s = row["inference_ms"], row["speedup"]
        body.append([row["label"], row["dtype"], fmt_ms(t.get("ours")), fmt_ms(t.get("cupy")),
                     fmt_ms(t.get("materialising")), fmt_ms(t.get("dw7")),
                     fmt_times(s.get("inference_vs_materialising")),
                     fmt_times(s.get("inference_vs_dw7")),
                     fmt_pct(row["roofline"]["inference"].get("ours")),
                     _floor_cell(row, "inference", floors), _check_cell(row)])
    return format_table(headers, body)


def training_table(rows: Sequence[dict], floors=(None, None)) -> str:
    """Training-step medians, speedups, roofline and floor fractions and peak memory.

    Parameters
    ----------
    rows : sequence of dict
    floors : tuple, optional
        As :func:`inference_table`'s.

    Returns
    -------
    str
    """
    headers = ["config", "dtype", "ours ms", "cupy ms", "mat. ms", "dw7x7 ms", "vs mat.",
               "vs dw7x7", "roofline", "cupy of floor", "peak MiB ours", "mat.", "dw7x7"]
    body = []
    for row in rows:
        if "skipped" in row:
            body.append(_skipped(row, len(headers)))
            continue
        t, s, m = row["training_ms"], row["speedup"], row["training_peak_bytes"]
        body.append([row["label"], row["dtype"], fmt_ms(t.get("ours")), fmt_ms(t.get("cupy")),
                     fmt_ms(t.get("materialising")), fmt_ms(t.get("dw7")),
                     fmt_times(s.get("training_vs_materialising")),
                     fmt_times(s.get("training_vs_dw7")),
                     fmt_pct(row["roofline"]["training"].get("ours")),
                     _floor_cell(row, "training", floors), fmt_mib(m.get("ours")),
                     fmt_mib(m.get("materialising")), fmt_mib(m.get("dw7"))])
    return format_table(headers, body)


def host_table(overhead: dict) -> str:
    """Host overhead per call (microseconds) of each implementation.

    The forward and the training step until the device finished the loop,
    and the step until its last call returned ("queued"; absent from runs
    before 2026-12-06: "-"). Where the two step times differ, the device
    set the pace, not the host. Each is the median over rounds where the run
    had several, and "step rounds" gives the rounds' range ("-" before
    2026-12-07).

    Parameters
    ----------
    overhead : dict
        From :func:`wtconv_cuda._bench.measure.host_overhead`.

    Returns
    -------
    str
    """
    body = []

    def cell(value):
        return "-" if value is None else f"{value:.1f}"

    for name, entry in overhead.get("us", {}).items():
        if "error" in entry:
            body.append([name, "error", entry["error"][:60], "", ""])
            continue
        spread = entry.get("training_rounds_us") or []
        body.append([name, cell(entry.get("forward_us")), cell(entry.get("training_us")),
                     cell(entry.get("training_queued_us")),
                     f"{min(spread):.1f}-{max(spread):.1f}" if spread else "-"])
    return format_table(["implementation", "forward us", "training step us",
                         "step queued us", "step rounds us"], body)


def render_report(report: dict) -> str:
    """The whole terminal summary of a run.

    Parameters
    ----------
    report : dict
        The JSON document of a run.

    Returns
    -------
    str
    """
    lines = []
    bandwidth = report.get("copy_bandwidth")
    # runs before 2026-12-08 did not store the rate: their device name gives it
    fma_rate = report.get("fp32_fma_per_s") or fp32_fma_rate(report.get("device"))
    lines.append(f"device: {report.get('device')}   copy bandwidth: "
                 + ("-" if not bandwidth else f"{bandwidth / 1e12:.2f} TB/s")
                 + "   fp32 multiply-adds: "
                 + ("-" if not fma_rate else f"{fma_rate / 1e12:.2f} T/s (datasheet)"))
    opts = report.get("options", {})
    lines.append(f"times: medians of {opts.get('repeats', '?')} runs (CUDA events, "
                 f"{opts.get('rotations', '?')} rotating input sets); "
                 "speedup = baseline time / ours; roofline = compulsory bytes / copy bandwidth "
                 "/ time (ours); cupy of floor = the longer of those bytes' time and the "
                 "convolutions' multiply-adds at the fp32 rate, / the CuPy path's time")
    rows = report.get("rows", [])
    floors = (bandwidth, fma_rate)
    lines += ["", "Inference (forward only)", inference_table(rows, floors)]
    lines += ["", "Training step (forward + backward, every gradient)",
              training_table(rows, floors)]
    overhead = report.get("host_overhead")
    if overhead:
        shape = "x".join(str(v) for v in overhead["shape"])
        rounds = overhead.get("rounds", 1)
        lines += ["", f"Host overhead per call, end to end ({shape}, L{overhead['levels']}, "
                      f"{overhead['calls']} calls"
                      + (f", median of {rounds} rounds)" if rounds > 1 else ")"),
                  host_table(overhead)]
    lines += ["", "Targets (stated for an H200; each on the row that comes closest to "
                  "failing it)"] + targets_lines(report)
    errors = [(row["label"], row["dtype"], key, text) for row in rows
              for key, text in (row.get("errors") or {}).items() if not key.endswith("_trace")]
    if errors:
        lines += ["", "Errors:"]
        lines += [f"  {label} {dtype} {key}: {text}" for label, dtype, key, text in errors]
    skipped = sum(1 for row in rows if "skipped" in row)
    if skipped:
        lines += ["", f"{skipped} configurations skipped (time budget; raise --time-budget)."]
    return "\n".join(lines)


def write_json(path, report: dict) -> Path:
    """Write ``report`` as JSON atomically (parents created).

    Parameters
    ----------
    path : str or Path
    report : dict

    Returns
    -------
    Path
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(report, handle, indent=1)
        handle.write("\n")
    os.replace(tmp, path)
    return path


def read_json(path) -> dict:
    """Read a report written by :func:`write_json`.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    dict
    """
    with open(path) as handle:
        return json.load(handle)


_SPEEDUP_TICKS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 1.5, 2, 3, 5, 10, 20, 50, 100]
_DTYPE_COLOURS = {"float32": "#1f77b4", "float16": "#ff7f0e", "bfloat16": "#2ca02c",
                  "float64": "#7f7f7f"}


def plot_speedups(report: dict, path) -> Path | None:
    """Bar charts of ours' speedups per shape and dtype (PNG, Agg backend).

    One panel per mode (inference, training) and baseline (depthwise 7x7,
    materialising), one bar per shape and dtype on a log scale, growing from
    1x: up where ours is faster, down where it is slower.

    Parameters
    ----------
    report : dict
        The JSON document of a run.
    path : str or Path
        PNG file to write (parents created).

    Returns
    -------
    Path or None
        ``None`` when matplotlib is not installed or nothing was measured.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import FixedLocator, FuncFormatter
    except ImportError:
        return None
    rows = [r for r in report.get("rows", []) if "skipped" not in r]
    baselines = [b for b in ("dw7", "materialising")
                 if any(r["speedup"].get(f"inference_vs_{b}") or
                        r["speedup"].get(f"training_vs_{b}") for r in rows)]
    if not rows or not baselines:
        return None
    labels = list(dict.fromkeys(r["label"] for r in rows))
    present = {r["dtype"] for r in rows}
    dtypes = [d for d in _DTYPE_COLOURS if d in present] + sorted(present - set(_DTYPE_COLOURS))
    names = {"dw7": "PyTorch depthwise 7x7", "materialising": "materialising PyTorch WTConv"}
    panels = [(mode, base) for mode in ("inference", "training") for base in baselines]
    fig = Figure(figsize=(max(8.0, 0.4 * len(labels) + 2.0), 2.6 * len(panels) + 1.6),
                 layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    bar = 0.8 / len(dtypes)
    for ax, (mode, base) in zip(axes, panels):
        values = []
        for d, dtype in enumerate(dtypes):
            xs, ys = [], []
            for r in rows:
                value = r["speedup"].get(f"{mode}_vs_{base}")
                if r["dtype"] == dtype and value:
                    xs.append(labels.index(r["label"]) - 0.4 + (d + 0.5) * bar)
                    ys.append(value)
            values += ys
            # bars grow from 1x: up where ours is faster, down where it is slower
            ax.bar(xs, [y - 1.0 for y in ys], bar, bottom=1.0, label=dtype,
                   color=_DTYPE_COLOURS.get(dtype, "#7f7f7f"))
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        if values:
            ax.set_ylim(min(values + [1.0]) / 1.25, max(values + [1.0]) * 1.25)
        else:
            ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center",
                    va="center", color="gray")
        ax.yaxis.set_major_locator(FixedLocator(_SPEEDUP_TICKS))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_ylabel("speedup")
        ax.set_title(f"{mode}: ours vs {names[base]} (baseline time / ours; > 1: ours faster)",
                     fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
        if ax is axes[0]:
            ax.legend(fontsize=8, loc="best")
    axes[-1].set_xticks(range(len(labels)))
    axes[-1].set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    fig.suptitle(f"WTConv2d fused kernels on {report.get('device')} "
                 f"({str(report.get('date', ''))[:10]}), K=5, stride 1", fontsize=11)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
