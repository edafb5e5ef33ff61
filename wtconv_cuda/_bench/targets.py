"""The benchmark issue's performance targets, judged on one run's report.

The targets are stated for an H200 and read off the rows of one run (see
:mod:`wtconv_cuda._bench.measure`), for each of the layer's two paths: ``ours``
(``WTConv2d`` through the PyTorch binding) and ``cupy`` (``wtconv_cuda.forward``
with a ``Tape``). A target holds where it holds on every row it covers; the
summary gives the row where it is closest to failing (the least speedup, the
least roofline fraction, the most memory), so a missed target reads with the
row that misses it and by how much.

A run that measured none of a target's rows (another ``--shapes``, skipped
rows, errors) says ``not measured``; one that measured only some of them says
how many, so a partial run is not read as a pass.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .core import speedup

__all__ = ["PATHS", "Target", "TARGETS", "Verdict", "judge", "describe", "verdicts",
           "targets_lines"]

#: The layer's paths that the targets judge: (key in the report, column heading).
PATHS = (("cupy", "CuPy path"), ("ours", "WTConv2d"))
#: The dtypes of the ConvNeXt-T targets (the issue names fp32 and bf16 for the
#: training step; the forward's target names none, so it covers every dtype run).
STAGE_DTYPES = ("float32", "bfloat16")


class Target(NamedTuple):
    """One target.

    Attributes
    ----------
    name : str
        What it asks, as the summary prints it.
    kind : str
        ``"speedup"`` (a baseline's time over ours, at least ``bound``),
        ``"roofline"`` (fraction of the copy roofline, at least ``bound``),
        ``"memory"`` (peak training bytes over a baseline's, at most ``bound``)
        or ``"host"`` (microseconds of the tiny training step, below ``bound``).
    bound : float
    mode : str
        ``"inference"`` or ``"training"`` (unused by ``"host"``).
    baseline : str
        ``"materialising"`` or ``"dw7"`` for speedups and memory.
    grid : str or None
        Rows of this grid only (``"convnext"``, ``"paper"``), or every row.
    dtypes : tuple of str or None
        Rows of these dtypes only, or every dtype.
    largest : bool
        Only the rows of the grid's largest planes (the paper's large shapes).
    paths : tuple of str
        The layer's paths the run measures it on (peak memory: PyTorch's
        allocator statistics, so ``WTConv2d`` alone).
    """

    name: str
    kind: str
    bound: float
    mode: str = "training"
    baseline: str = "dw7"
    grid: str | None = None
    dtypes: tuple | None = None
    largest: bool = False
    paths: tuple = ("cupy", "ours")


#: Issue #4's targets, in its order.
TARGETS = (
    Target("training step >= 15x the materialising layer (ConvNeXt-T stages, fp32 and bf16)",
           "speedup", 15.0, "training", "materialising", "convnext", STAGE_DTYPES),
    Target("training step >= 3x depthwise 7x7 (ConvNeXt-T stages, fp32 and bf16)",
           "speedup", 3.0, "training", "dw7", "convnext", STAGE_DTYPES),
    Target("forward >= 3x depthwise 7x7 (ConvNeXt-T stages)",
           "speedup", 3.0, "inference", "dw7", "convnext"),
    Target("forward >= 50% of the memory roofline (paper grid's largest planes, fp32)",
           "roofline", 0.5, "inference", grid="paper", dtypes=("float32",), largest=True),
    Target("peak training memory <= 1.1x depthwise 7x7 (every row)",
           "memory", 1.1, "training", "dw7", paths=("ours",)),
    Target("a (1, 8, 16, 16) training step < 150 us of host time", "host", 150.0),
)


class Verdict(NamedTuple):
    """A target on one path of one run.

    Attributes
    ----------
    status : str
        ``"met"``, ``"missed"`` or ``"not measured"``.
    value : float or None
        The value closest to failing (a ratio, a fraction or microseconds).
    where : str
        The row it comes from (``"64x192x28x28 L4 float32"``), or ``""``.
    measured, rows : int
        Rows with a value, and rows the target covers (0 and 0 for ``"host"``).
    """

    status: str
    value: float | None
    where: str
    measured: int
    rows: int


def _covered(target: Target, rows: Sequence[dict]) -> list:
    """The rows ``target`` covers, skipped ones included (they count as not measured)."""
    out = [row for row in rows
           if (target.grid is None or row.get("grid") == target.grid)
           and (target.dtypes is None or row.get("dtype") in target.dtypes)]
    if target.largest and out:
        pixels = max(row["shape"][2] * row["shape"][3] for row in out)
        out = [row for row in out if row["shape"][2] * row["shape"][3] == pixels]
    return out


def _value(target: Target, row: dict, path: str):
    """The row's value of ``target`` on ``path``, or None where the run has none."""
    if "skipped" in row:
        return None
    if target.kind == "speedup":
        times = row.get(f"{target.mode}_ms") or {}
        return speedup(times.get(target.baseline), times.get(path))
    if target.kind == "roofline":
        return ((row.get("roofline") or {}).get(target.mode) or {}).get(path)
    # memory: the allocator's statistics are PyTorch's, so only the module path has them
    peaks = row.get("training_peak_bytes") or {}
    ours, base = peaks.get(path), peaks.get(target.baseline)
    return ours / base if ours and base else None


def judge(target: Target, report: dict, path: str) -> Verdict:
    """``target`` on the layer's ``path`` (``"ours"`` or ``"cupy"``) in ``report``.

    Parameters
    ----------
    target : Target
    report : dict
        A run's JSON document (:func:`wtconv_cuda._bench.report.read_json`).
    path : str
        ``"ours"`` or ``"cupy"``.

    Returns
    -------
    Verdict
    """
    if target.kind == "host":
        entry = ((report.get("host_overhead") or {}).get("us") or {}).get(path) or {}
        us = entry.get("training_us")
        if us is None:
            return Verdict("not measured", None, "", 0, 0)
        return Verdict("met" if us < target.bound else "missed", us, "", 0, 0)
    covered = _covered(target, report.get("rows") or [])
    values = [(v, f"{row['label']} {row['dtype']}") for row in covered
              if (v := _value(target, row, path)) is not None]
    if not values:
        return Verdict("not measured", None, "", 0, len(covered))
    worst = max(values) if target.kind == "memory" else min(values)
    holds = worst[0] <= target.bound if target.kind == "memory" else worst[0] >= target.bound
    return Verdict("met" if holds else "missed", worst[0], worst[1], len(values), len(covered))


def describe(target: Target, verdict: Verdict) -> str:
    """A verdict in words: ``"missed: 9.75x at 64x192x28x28 L4 float32"``, with the rows
    measured where fewer than the target covers.

    Parameters
    ----------
    target : Target
    verdict : Verdict
        :func:`judge`'s for ``target``.

    Returns
    -------
    str
    """
    if verdict.value is None:
        return "not measured" + (f" (0 of {verdict.rows} rows)" if verdict.rows else "")
    if target.kind == "roofline":
        value = f"{100 * verdict.value:.1f}%"
    elif target.kind == "host":
        value = f"{verdict.value:.1f} us"
    elif target.kind == "memory":
        value = f"{verdict.value:.3f}x at most"
    else:
        value = f"{verdict.value:.2f}x"
    text = f"{verdict.status}: {value}" + (f" at {verdict.where}" if verdict.where else "")
    if verdict.measured < verdict.rows:
        text += f" ({verdict.measured} of {verdict.rows} rows measured)"
    return text


def verdicts(report: dict) -> list:
    """Every target in words on each path that measures it.

    Parameters
    ----------
    report : dict
        A run's JSON document.

    Returns
    -------
    list of tuple
        ``(target, [(path heading, description), ...])`` in `TARGETS`' order:
        speedups and fractions are the least over the target's rows, memory
        the most (:func:`describe`).
    """
    return [(target, [(heading, describe(target, judge(target, report, path)))
                      for path, heading in PATHS if path in target.paths])
            for target in TARGETS]


def targets_lines(report: dict) -> list:
    """:func:`verdicts` as plain-text lines: a target's name, then a line per path.

    Parameters
    ----------
    report : dict
        A run's JSON document.

    Returns
    -------
    list of str
    """
    width = max(len(heading) for _, heading in PATHS)
    lines = []
    for target, described in verdicts(report):
        lines.append(target.name)
        lines += [f"  {heading.ljust(width)}  {text}" for heading, text in described]
    return lines
