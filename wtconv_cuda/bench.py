"""Benchmark the WTConv layer on a GPU: ``python -m wtconv_cuda.bench``.

Times, side by side in one process and on the same random inputs and
parameters:

- ours: :class:`wtconv_cuda.bindings.torch.WTConv2d` (the fused kernels
  through the PyTorch custom ops), and also the CuPy path
  :func:`wtconv_cuda.forward` (with a :class:`wtconv_cuda.Tape` for training);
- a materialising PyTorch implementation of SPEC.md that mirrors the
  published layer op for op (``benchmarks/materialising.py``, imported from
  the repository checkout; the run says so when it is absent);
- PyTorch's depthwise ``nn.Conv2d(C, C, 7, padding=3, groups=C)``;

with ``torch.backends.cudnn.benchmark = True``. Measured:

- inference (forward only, no autograd) and training step (forward and
  backward computing the gradients of ``x`` and of every parameter): medians
  of >= 30 runs timed with CUDA events after a warm-up, rotating 3 random
  input sets so that caches do not flatter;
- peak memory of an inference call and of a training step above the resident
  inputs (``torch.cuda.max_memory_allocated`` minus the memory allocated
  before; the statistic is reset for each measurement);
- host overhead: end-to-end time per call of a tiny ``(1, 8, 16, 16)`` input,
  and of the training step also the time until its last call returned (the
  "queued" column: where it is well below the end-to-end time, the device
  set the pace, not the host);
- the roofline fraction: compulsory bytes (inference: read ``x``, write
  ``y``, 2x the bytes of ``x``; training: that plus reading ``x`` and ``dy``
  and writing ``dx``, 5x) over the time, against a measured
  device-to-device copy bandwidth;
- the fraction of the time floor: the longer of those bytes' time and the
  convolutions' multiply-adds at the card's datasheet fp32 rate
  (:mod:`wtconv_cuda._bench.floors`), for the CuPy path;
- agreement of ours with the materialising implementation (norm-relative
  differences of ``y``, ``dx`` and the weight gradients).

The summary ends with the benchmark issue's targets, each judged on the run
for both of the layer's paths (:mod:`wtconv_cuda._bench.targets`).

Grid (``--shapes``): ``convnext`` is the four WTConvNeXt-T stages at batch 64
with the published levels, ``(64, 96, 56, 56, L5)``, ``(64, 192, 28, 28, L4)``,
``(64, 384, 14, 14, L3)``, ``(64, 768, 7, 7, L2)``; ``paper`` is the paper's
grid, B = 8, C in {32, 64, 128}, H = W in {128, 256, 512}, L in {1, 3, 5};
``all`` (default) is both. K = 5, stride 1; dtypes float32, float16 and
bfloat16 (``--dtypes``), every implementation in that dtype. The ConvNeXt
stages run first, then the other sizes from small to large; a configuration
that would end past ``--time-budget`` seconds (default 420, counted from the
start, kernel compilation included) is skipped and listed as skipped, so the
run fits in one 10-minute device call. ``--quick`` keeps 2 of the paper's
sizes and takes 10 runs per median.

Output: tables on the terminal, a JSON file (default
``benchmarks/results/bench-<device>-<date>.json``; ``--out DIR`` changes the
folder, ``--json PATH`` the file, and it is rewritten after every
configuration so that a cut-short run keeps what it measured), a PNG plot
of the speedups next to it, and the summary in Markdown in the README's form
(``.md``, :mod:`wtconv_cuda._bench.markdown`). ``--from-json PATH`` prints the
tables and draws the plot again from a saved file, on any machine
(``--markdown``: prints the Markdown summary instead). ``--compile-only`` compiles
the kernel variants the run would use into the PTX cache and exits; it needs
no GPU (``scripts/build_ptx_cache.sh bench`` runs it for a device call to
carry).

On a machine without CUDA (or without PyTorch) it says so ("CPU-only
machine: running the tiny CPU demo instead") and runs a tiny CPU comparison
instead: our CPU path and the materialising implementation on a
``(1, 8, 16, 16)`` input, checked against the float64 oracle and timed; it
exits 0 when both agree with the oracle.

Examples
--------
On the GPU machine, from the repository root::

    python -m wtconv_cuda.bench --out "$OUT"          # full grid, about 4-5.5 minutes
    python -m wtconv_cuda.bench --quick --out "$OUT"  # about 1 minute

Run time on an H100 (2026-12-06, ``benchmarks/results/h100-2026-12-06e/``):
compiling the 167 kernel variants of the full grid took 75 s on 16 cores with a
partly filled PTX cache, 1 s with the one ``scripts/build_ptx_cache.sh bench``
builds. Measuring took 37 s for the ConvNeXt stages (three dtypes) and 94 s for
the paper grid in float32; a 16-bit row takes about as long as its float32 one
(1.5-3.9 s against 1.9 s at 8 x 32 x 512 x 512). Two rows took 9-16 s
(8 x 64 x 256 x 256 at L 3 and 5 in float32, the first to run their split
tiles; not profiled), every other 0.4-3.9 s. That run, with the old 240 s
default budget, cut 16 of the 93 configurations after 242 s (75 of them
compiling); the whole grid comes to about 4 minutes with a filled cache and
5.5 without (the cut rows estimated from their float32 times), inside the
420 s default.

The progress bar is ``tqdm`` on a terminal (a simple bar without it); in a
log it is one line per configuration.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import subprocess
import sys
from pathlib import Path

from ._bench.core import (
    DTYPES,
    BudgetGuard,
    default_json_path,
    ordered_work,
    parse_dtypes,
    progress_bar,
    select_configs,
    tensor_bytes,
)
from ._bench.floors import fp32_fma_rate
from ._bench.markdown import markdown_summary
from ._bench.report import plot_speedups, read_json, render_report, write_json

__all__ = ["main", "find_materialising", "CPU_LABEL", "MATERIALISING_PATH"]

#: Printed first when no CUDA device is available.
CPU_LABEL = "CPU-only machine: running the tiny CPU demo instead"
#: Where the materialising implementation lives in a repository checkout.
MATERIALISING_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "materialising.py"
DEFAULT_TIME_BUDGET = 420.0


def find_materialising(path=MATERIALISING_PATH):
    """Import ``MaterialisingWTConv2d`` from the repository checkout, if present.

    Parameters
    ----------
    path : Path, default MATERIALISING_PATH
        ``benchmarks/materialising.py`` next to the package.

    Returns
    -------
    cls : type or None
        ``MaterialisingWTConv2d``, or ``None`` when the file is absent (an
        installed package without the repository).
    origin : str
        The file, or why it is missing.
    """
    path = Path(path)
    if not path.is_file():
        return None, (f"not found ({path} is absent: the materialising implementation is "
                      "part of the repository, not of the installed package)")
    spec = importlib.util.spec_from_file_location("wtconv_bench_materialising", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MaterialisingWTConv2d, str(path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m wtconv_cuda.bench",
        description="Time WTConv2d (fused kernels) against a materialising PyTorch WTConv and "
                    "PyTorch's depthwise 7x7 convolution on a GPU (a tiny CPU demo without "
                    "CUDA).")
    parser.add_argument("--quick", action="store_true",
                        help="fewer shapes (2 of the paper grid) and 10 runs per median")
    parser.add_argument("--shapes", choices=("convnext", "paper", "all"), default="all",
                        help="ConvNeXt-T stages, the paper's grid, or both (default)")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES),
                        help="any of fp32 fp16 bf16 (default: all three)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed runs per median (default 30; 10 with --quick)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results"),
                        help="folder of the JSON and PNG files (default benchmarks/results)")
    parser.add_argument("--json", default=None,
                        help="JSON file (default <out>/bench-<device>-<date>.json); the PNG "
                             "goes next to it")
    parser.add_argument("--no-plot", action="store_true", help="do not draw the PNG")
    parser.add_argument("--time-budget", type=float, default=DEFAULT_TIME_BUDGET,
                        help="skip configurations that would end later than this many seconds "
                             "after the start (default 420; 0: no limit)")
    parser.add_argument("--no-precompile", action="store_true",
                        help="do not compile the kernel variants in parallel first")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the kernel variants the run would use into the PTX "
                             "cache, then exit (no GPU needed: the target is the GPU's, "
                             "else sm_90)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="compile processes (default: all cores)")
    parser.add_argument("--host-calls", type=int, default=None,
                        help="calls per host-overhead loop (default 500; 100 with --quick)")
    parser.add_argument("--host-rounds", type=int, default=None,
                        help="host-overhead loops per implementation and mode, "
                             "interleaved; the row is their median (default 5; 3 with "
                             "--quick)")
    parser.add_argument("--device", default="cuda", help="CUDA device (default cuda)")
    parser.add_argument("--from-json", default=None, metavar="PATH",
                        help="print the tables and draw the plot of a saved run, then exit")
    parser.add_argument("--markdown", action="store_true",
                        help="with --from-json: print the run's summary in Markdown, as the "
                             "README shows it (a run writes it beside its JSON as .md)")
    return parser


def _import_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _git_commit():
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _version(name):
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def precompile_command(configs, dtypes, jobs: int) -> tuple[list, dict]:
    """The warmup command that compiles every kernel variant a run needs.

    Parameters
    ----------
    configs : sequence of Config
    dtypes : sequence of str
    jobs : int
        Compile processes.

    Returns
    -------
    cmd : list of str
        ``python -m wtconv_cuda.kernels.warmup`` with the run's kernel sizes,
        storages (float32 always: the host-overhead row), plane sizes and levels.
    env : dict
        This process's environment with this package first on ``PYTHONPATH``.
    """
    from ._bench.measure import HOST_CONFIG

    pairs = sorted({f"{c.height}x{c.width}:{c.levels}" for c in list(configs) + [HOST_CONFIG]})
    storages = list(dict.fromkeys(list(dtypes) + ["float32"]))
    sizes = sorted({str(c.kernel_size) for c in list(configs) + [HOST_CONFIG]})
    cmd = [sys.executable, "-m", "wtconv_cuda.kernels.warmup", "--kernel-sizes", *sizes,
           "--strides", "1", "--storage", *storages, "--configs", *pairs,
           "--jobs", str(max(1, jobs))]
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"]
                                        if env.get("PYTHONPATH") else "")
    return cmd, env


def precompile(configs, dtypes, jobs: int, timeout: float) -> str:
    """Compile every kernel variant the run needs, in parallel, into the PTX cache.

    Runs :func:`precompile_command` in a subprocess (so the compile processes
    never share this process's CUDA state). Without it each variant compiles
    on first use, one after the other.

    Parameters
    ----------
    configs, dtypes, jobs
        As for :func:`precompile_command`.
    timeout : float
        Seconds before giving up (the kernels then compile on first use).

    Returns
    -------
    str
        One line saying what happened.
    """
    from .kernels.warmup import run_compile_subprocess

    cmd, env = precompile_command(configs, dtypes, jobs)
    return run_compile_subprocess(cmd, timeout, env)


def _compile_only(args) -> int:
    """Compile the run's kernel variants into the PTX cache, its output shown as it
    comes, with no time limit; the compile's exit status."""
    cmd, env = precompile_command(select_configs(args.shapes, args.quick),
                                  parse_dtypes(args.dtypes), args.jobs)
    return subprocess.run(cmd, env=env).returncode


def _cpu_main(args, torch) -> int:
    print(CPU_LABEL)
    if torch is None:
        print("  (PyTorch is not installed)")
    else:
        print(f"  (torch {torch.__version__}: torch.cuda.is_available() is False)")
    materialising, origin = (None, "not loaded (no PyTorch)")
    if torch is not None:
        materialising, origin = find_materialising()
        print(f"materialising implementation: {origin}")
    from ._bench.cpu_demo import run_cpu_demo

    report = run_cpu_demo(quick=args.quick, materialising=materialising,
                          materialising_origin=origin if materialising is not None else None)
    report["date"] = datetime.datetime.now().isoformat(timespec="seconds")
    report["python"] = platform.python_version()
    report["torch"] = None if torch is None else torch.__version__
    if args.json:
        print(f"wrote {write_json(args.json, report)}")
    return 0 if report["ok"] else 1


def _replay(args) -> int:
    report = read_json(args.from_json)
    if report.get("mode") == "cpu-demo":
        print("a CPU demo report: nothing to plot")
        return 0
    if args.markdown:
        print(markdown_summary(report))
        return 0
    print(render_report(report))
    if not args.no_plot:
        png = plot_speedups(report, Path(args.from_json).with_suffix(".png"))
        print(f"plot: {png}" if png else "plot: not drawn (matplotlib missing or no data)")
    return 0


def _exit_status(report) -> int:
    """1 when ours failed somewhere or disagreed with the materialising implementation."""
    for row in report["rows"]:
        if "skipped" in row:
            continue
        errors = row.get("errors") or {}
        if any(key == "setup" or key.startswith("ours/") for key in errors):
            return 1
        if (row.get("check") or {}).get("ok") is False:
            return 1
    return 0


def _gpu_main(args, torch) -> int:
    try:
        import cupy
    except ImportError as exc:
        print(f"CuPy is required to run the fused kernels on the GPU ({exc}); install "
              "cupy-cuda13x (pip install -e '.[gpu]')")
        return 2
    from ._bench.measure import (
        LABELS,
        MeasureOptions,
        Runtime,
        copy_bandwidth,
        host_overhead,
        measure_config,
        skipped_row,
    )

    guard = BudgetGuard(args.time_budget)
    runtime = Runtime(torch, args.device, cupy if torch.device(args.device).type == "cuda"
                      else None)
    materialising, origin = find_materialising()
    configs = select_configs(args.shapes, args.quick)
    dtypes = parse_dtypes(args.dtypes)
    work = ordered_work(configs, dtypes)
    repeats = args.repeats or (10 if args.quick else 30)
    host_calls = args.host_calls or (100 if args.quick else 500)
    host_rounds = args.host_rounds or (3 if args.quick else 5)
    opts = MeasureOptions(repeats=repeats, warmup=args.warmup, rotations=3, seed=0,
                          host_calls=host_calls, host_rounds=host_rounds)
    json_path = Path(args.json) if args.json else default_json_path(args.out, runtime.name)
    png_path = json_path.with_suffix(".png")

    print(f"wtconv_cuda benchmark on {runtime.name} ({runtime.device}): {len(work)} "
          f"configurations, {repeats} runs per median, time budget "
          f"{'none' if guard.budget_s is None else f'{guard.budget_s:.0f} s'}")
    if materialising is None:
        print(f"materialising implementation: {origin}; comparing against the depthwise 7x7 "
              "convolution only")
    else:
        print(f"materialising implementation: {origin}")
    if repeats < 30 and not args.quick:
        print(f"note: {repeats} runs per median (a real measurement uses >= 30)")

    if not args.no_precompile:
        print("compiling kernel variants ...", flush=True)
        limit = max(120.0, args.time_budget) if args.time_budget > 0 else 600.0
        print(" ", precompile(configs, dtypes, args.jobs, timeout=limit))
        print(f"  ({guard.elapsed():.0f} s elapsed)", flush=True)

    torch.backends.cudnn.benchmark = True
    report = {
        "tool": "python -m wtconv_cuda.bench",
        "version": _package_version(),
        "git_commit": _git_commit(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": runtime.name,
        "fp32_fma_per_s": fp32_fma_rate(runtime.name),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "cupy": cupy.__version__,
        "numba_cuda": _version("numba-cuda"),
        "settings": {"cudnn_benchmark": True,
                     "cudnn_allow_tf32": _setting(lambda: torch.backends.cudnn.allow_tf32)},
        "options": {"shapes": args.shapes, "quick": args.quick, "dtypes": dtypes,
                    "repeats": repeats, "warmup": args.warmup, "rotations": opts.rotations,
                    "host_calls": host_calls, "host_rounds": host_rounds,
                    "time_budget_s": guard.budget_s},
        "implementations": LABELS,
        "materialising": origin if materialising is not None else None,
        "complete": False,
        "rows": [],
    }
    report["copy_bandwidth"] = bandwidth = copy_bandwidth(runtime)
    print(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s", flush=True)
    report["host_overhead"] = host_overhead(runtime, opts, materialising, cupy)
    write_json(json_path, report)

    bar = progress_bar(len(work), "bench")
    try:
        for cfg, dtype in work:
            bar.set_postfix_str(f"{cfg.label} {dtype}")
            elements = tensor_bytes(cfg.shape, 1)
            if not guard.allows(elements):
                report["rows"].append(skipped_row(cfg, dtype, "time budget", bandwidth))
            else:
                row = measure_config(cfg, dtype, runtime, opts, materialising, cupy, bandwidth)
                guard.record(elements, row["seconds"])
                report["rows"].append(row)
                report["wall_s"] = guard.elapsed()
                write_json(json_path, report)
            bar.update(1)
    finally:
        bar.close()
    report["complete"] = True
    report["wall_s"] = guard.elapsed()
    write_json(json_path, report)
    print()
    print(render_report(report))
    print()
    print(f"JSON: {json_path}")
    summary = Path(json_path).with_suffix(".md")
    summary.write_text(markdown_summary(report) + "\n")
    print(f"Markdown summary (the README's form): {summary}")
    if not args.no_plot:
        png = plot_speedups(report, png_path)
        print(f"plot: {png}" if png else "plot: not drawn (matplotlib missing or no data)")
    print(f"wall time: {report['wall_s']:.0f} s")
    return _exit_status(report)


def _setting(read):
    try:
        return read()
    except Exception:  # a renamed or removed flag must not stop the run
        return None


def _package_version():
    from . import __version__

    return __version__


def main(argv=None) -> int:
    """Run the benchmark (or the CPU demo); see the module docstring.

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status: 0 on success; 1 when ours failed or disagreed with the
        materialising implementation (GPU) or with the oracle (CPU demo);
        2 when CUDA is there but CuPy is not.
    """
    args = _parser().parse_args(argv)
    try:
        parse_dtypes(args.dtypes)
    except ValueError as exc:
        _parser().error(str(exc))
    if args.repeats is not None and args.repeats < 1:
        _parser().error("--repeats must be >= 1")
    if args.markdown and not args.from_json:
        _parser().error("--markdown needs --from-json (a run writes its Markdown itself)")
    if args.from_json:
        return _replay(args)
    if args.compile_only:
        return _compile_only(args)
    torch = _import_torch()
    if torch is None or not torch.cuda.is_available():
        return _cpu_main(args, torch)
    return _gpu_main(args, torch)


if __name__ == "__main__":
    raise SystemExit(main())
