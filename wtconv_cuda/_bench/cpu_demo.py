"""The tiny CPU comparison that ``python -m wtconv_cuda.bench`` runs without CUDA.

Our CPU path (the PyTorch binding on CPU tensors, which runs the float64
NumPy oracle) and the materialising PyTorch implementation, both in float32 on
a ``1 x 8 x 16 x 16`` input: each output and gradient is compared with the
float64 oracle, and forward and training-step times are taken (wall clock,
medians over rotating input sets). CPU times say nothing about the GPU
kernels; the point is that the benchmark's machinery runs and that both
implementations agree with SPEC.md.
"""

from __future__ import annotations

import sys

import numpy as np

import wtconv_cuda as wt
from wtconv_cuda import reference

from .core import PerfCounterTimer, time_median
from .report import fmt_ms, format_table

__all__ = ["SHAPE", "LEVELS", "KERNEL_SIZE", "TOLERANCE", "run_cpu_demo", "max_relative_error"]

SHAPE = (1, 8, 16, 16)
LEVELS = 3
KERNEL_SIZE = 5
#: Largest accepted max-abs error relative to the oracle's largest value (float32 runs).
TOLERANCE = 1e-4


def max_relative_error(got, want) -> float:
    """``max|got - want| / max|want|`` in float64 (``max|got - want|`` if ``want`` is 0).

    Parameters
    ----------
    got, want : array_like
        Same shape (tensors are detached and converted).

    Returns
    -------
    float
    """
    got = np.asarray(got.detach().double() if hasattr(got, "detach") else got, np.float64)
    want = np.asarray(want, np.float64)
    diff = float(np.abs(got - want).max()) if got.size else 0.0
    scale = float(np.abs(want).max()) if want.size else 0.0
    return diff / scale if scale > 0 else diff


def _weights(rng):
    w = wt.init_weights(SHAPE[1], KERNEL_SIZE, LEVELS, dtype=np.float32, seed=rng)
    return w._replace(
        base_scale=rng.uniform(0.5, 1.5, w.base_scale.shape).astype(np.float32),
        wavelet_scale=rng.uniform(0.05, 0.15, w.wavelet_scale.shape).astype(np.float32))


def run_cpu_demo(quick: bool = False, materialising=None, materialising_origin=None,
                 out=None) -> dict:
    """Run the CPU comparison and print it.

    Parameters
    ----------
    quick : bool, default False
        10 timed runs instead of 30.
    materialising : type, optional
        ``MaterialisingWTConv2d``; without it only our path is checked.
    materialising_origin : str, optional
        Where it was loaded from (for the report).
    out : file-like, default sys.stdout

    Returns
    -------
    dict
        JSON-ready report; ``report["ok"]`` is whether every compared output
        and gradient is within :data:`TOLERANCE` of the oracle.
    """
    out = out or sys.stdout
    repeats, warmup = (10, 2) if quick else (30, 3)
    rng = np.random.default_rng(0)
    weights = _weights(rng)
    xs = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3)]
    dys = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3)]
    report = {"mode": "cpu-demo", "device": "cpu", "shape": list(SHAPE), "levels": LEVELS,
              "kernel_size": KERNEL_SIZE, "dtype": "float32", "stride": 1,
              "options": {"repeats": repeats, "warmup": warmup, "rotations": 3},
              "materialising": materialising_origin, "tolerance": TOLERANCE, "rows": {}}
    print(f"tiny CPU comparison: x {SHAPE} float32, K={KERNEL_SIZE}, L={LEVELS}, stride 1; "
          f"medians of {repeats} runs (wall clock, 3 rotating input sets)", file=out)

    y_ref = reference.forward(xs[0], weights)
    dx_ref, dw_ref = reference.backward(xs[0], weights, dys[0])
    grads_ref = wt.weights_to_state_dict(dw_ref)

    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: timing the NumPy CPU path only", file=out)
        return _numpy_only(report, weights, xs, dys, y_ref, dx_ref, dw_ref, repeats, warmup, out)

    from ..bindings.torch import WTConv2d
    from .measure import module_impl

    layer = WTConv2d.from_weights(weights)
    impls = {"ours": module_impl("ours", layer, torch)}
    if materialising is not None:
        impls["materialising"] = module_impl("materialising", materialising.from_layer(layer),
                                             torch)
    torch.manual_seed(0)
    c = SHAPE[1]
    impls["dw7"] = module_impl("dw7", torch.nn.Conv2d(c, c, 7, padding=3, groups=c), torch)
    txs = [torch.from_numpy(x).requires_grad_(True) for x in xs]
    tdys = [torch.from_numpy(dy) for dy in dys]

    ok = True
    body = []
    for name, impl in impls.items():
        row = {}
        if name != "dw7":  # the 7x7 convolution is another operator: timing only
            y = impl.forward(txs[0])
            grads = impl.train(txs[0], tdys[0])
            row["error_y"] = max_relative_error(y, y_ref)
            row["error_dx"] = max_relative_error(grads[0], dx_ref)
            row["error_dweights"] = max(
                max_relative_error(g.reshape(np.shape(grads_ref[n])), grads_ref[n])
                for n, g in zip(impl.param_names, grads[1:]))
            row["ok"] = max(row["error_y"], row["error_dx"], row["error_dweights"]) <= TOLERANCE
            ok = ok and row["ok"]
        timer = PerfCounterTimer()
        row["forward_ms"] = time_median(impl.forward, [(x,) for x in txs], timer, repeats,
                                        warmup).median_ms
        row["training_ms"] = time_median(impl.train, list(zip(txs, tdys)), timer, repeats,
                                         warmup).median_ms
        report["rows"][name] = row
        errors = ("-" if "ok" not in row else
                  f"{row['error_y']:.1e} / {row['error_dx']:.1e} / {row['error_dweights']:.1e}")
        body.append([_NAMES[name], fmt_ms(row["forward_ms"]), fmt_ms(row["training_ms"]),
                     errors])
    print(format_table(["implementation (CPU, float32)", "forward ms", "training step ms",
                        "rel. error vs oracle: y / dx / weights"], body), file=out)
    report["ok"] = ok
    verdict = "OK" if ok else "MISMATCH"
    print(f"correctness against the float64 oracle: {verdict} (tolerance {TOLERANCE:g})",
          file=out)
    print("CPU times do not say anything about the GPU kernels (our CPU path is the float64 "
          "NumPy oracle); run this command on a machine with an NVIDIA GPU for the benchmark.",
          file=out)
    return report


_NAMES = {"ours": "ours: WTConv2d (torch binding, CPU path)",
          "materialising": "materialising PyTorch",
          "dw7": "PyTorch depthwise 7x7 (other op)"}


def _numpy_only(report, weights, xs, dys, y_ref, dx_ref, dw_ref, repeats, warmup, out):
    def forward(x):
        return wt.forward(x, weights)

    def train(x, dy):
        tape = wt.Tape()
        wt.forward(x, weights, tape=tape)
        return tape.backward(dy)

    tape = wt.Tape()
    y = wt.forward(xs[0], weights, tape=tape)
    dx, _ = tape.backward(dys[0])
    row = {"error_y": max_relative_error(y, y_ref), "error_dx": max_relative_error(dx, dx_ref)}
    row["ok"] = max(row.values()) <= TOLERANCE
    timer = PerfCounterTimer()
    row["forward_ms"] = time_median(forward, [(x,) for x in xs], timer, repeats, warmup).median_ms
    row["training_ms"] = time_median(train, list(zip(xs, dys)), timer, repeats,
                                     warmup).median_ms
    report["rows"]["numpy"] = row
    report["ok"] = row["ok"]
    print(format_table(["implementation (CPU, float32)", "forward ms", "training step ms",
                        "rel. error vs oracle: y / dx"],
                       [["wtconv_cuda.forward (NumPy)", fmt_ms(row["forward_ms"]),
                         fmt_ms(row["training_ms"]),
                         f"{row['error_y']:.1e} / {row['error_dx']:.1e}"]]), file=out)
    print(f"correctness against the float64 oracle: {'OK' if row['ok'] else 'MISMATCH'}",
          file=out)
    return report
