"""A run's summary in Markdown, in the form the README shows it.

The ConvNeXt-T stages' table (times of both of the layer's paths and the
baselines, peak memory), the CuPy path's speedups per dtype, and the targets
(:mod:`wtconv_cuda._bench.targets`), all computed from the run's JSON, so that a
new run's rows go into the README as measured, with no arithmetic by hand.
"""

from __future__ import annotations

from .core import speedup
from .report import fmt_ms
from .targets import verdicts

__all__ = ["markdown_summary"]

#: Short dtype names, in the README's order.
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _stage_row(row: dict) -> str:
    b, c, h, w = row["shape"]
    t, i = row.get("training_ms") or {}, row.get("inference_ms") or {}
    peaks = row.get("training_peak_bytes") or {}
    memory = (f"{peaks['ours'] / peaks['dw7']:.3f}x" if peaks.get("ours") and peaks.get("dw7")
              else "-")
    forward = " / ".join(fmt_ms(i.get(n)) for n in ("ours", "cupy", "dw7"))
    training = " / ".join(fmt_ms(t.get(n)) for n in ("ours", "cupy", "materialising", "dw7"))
    return (f"| {b}, {c}, {h}, {w}, L{row['levels']}, {SHORT.get(row['dtype'], row['dtype'])} "
            f"| {forward} ms | {training} ms | {memory} |")


def _ratios(rows: list, mode: str, baseline: str, digits: int) -> str:
    """The CuPy path's speedups over ``baseline`` across ``rows``, `` / ``-separated."""
    out = []
    for row in rows:
        times = row.get(f"{mode}_ms") or {}
        ratio = speedup(times.get(baseline), times.get("cupy"))
        out.append("-" if ratio is None else f"{ratio:.{digits}f}x")
    return " / ".join(out)


def markdown_summary(report: dict) -> str:
    """The README's summary of a run.

    Parameters
    ----------
    report : dict
        A run's JSON document.

    Returns
    -------
    str
        Markdown: a heading line, the ConvNeXt-T table, the CuPy path's
        speedups per dtype, and the targets as a list.
    """
    bandwidth = report.get("copy_bandwidth")
    commit = (report.get("git_commit") or "?")[:7]
    lines = [f"{report.get('device')}, tree `{commit}`, {(report.get('date') or '?')[:10]}, "
             "copy bandwidth "
             + ("-" if not bandwidth else f"{bandwidth / 1e12:.2f} TB/s")
             + "; medians of CUDA-event times, K = 5.", ""]
    stages = [row for row in report.get("rows", [])
              if row.get("grid") == "convnext" and "skipped" not in row]
    by_dtype = {d: [row for row in stages if row["dtype"] == d] for d in SHORT}
    if stages:
        lines += ["| shape (B, C, H, W), L, dtype | forward: ours / CuPy / dw7x7 | "
                  "training step: ours / CuPy / mat. / dw7x7 | "
                  "peak training memory, ours / dw7x7 |",
                  "| --- | --- | --- | --- |"]
        lines += [_stage_row(row) for d in SHORT for row in by_dtype[d]]
        lines.append("")
        for d, rows in by_dtype.items():
            if not rows:
                continue
            edges = " / ".join(str(row["shape"][2]) for row in rows)
            lines.append(
                f"- {SHORT[d]}, CuPy path, at {edges}: training step "
                f"{_ratios(rows, 'training', 'dw7', 2)} depthwise 7x7's speed and "
                f"{_ratios(rows, 'training', 'materialising', 1)} the materialising "
                f"layer's; forward {_ratios(rows, 'inference', 'dw7', 2)} depthwise 7x7's.")
        lines.append("")
    lines.append("Targets (on the row that comes closest to failing each):")
    lines.append("")
    for target, described in verdicts(report):
        lines.append(f"- {target.name}: "
                     + "; ".join(f"{heading} {text}" for heading, text in described) + ".")
    return "\n".join(lines)
