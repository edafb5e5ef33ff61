"""Per-call host overhead of each framework binding on a tiny problem.

The problem is so small that the GPU work is a few microseconds; what is
measured is the Python/dispatcher cost of getting the kernels queued. For each
path: ``host_us``, the host time per call over ``--calls`` back-to-back calls
(no synchronisation inside the loop), and ``wall_us``, the same including the
final synchronisation divided by the number of calls. Also measured: the two
ways of launching on a foreign stream (a cached ``cupy.cuda.ExternalStream``
passed as the launch's ``stream`` argument, which the bindings use, against
creating an ``ExternalStream`` and entering it as CuPy's current stream on
every call), and PyTorch's own depthwise convolution as a reference point.

    python benchmarks/binding_overhead.py --calls 2000 > overhead.json

Prints one JSON object; a path that cannot run here (no CUDA JAX, ...) is
reported with an ``error`` entry instead of timings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import traceback

import numpy as np

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def measure(fn, sync, calls, warmup):
    """Host and wall microseconds per call of ``fn``."""
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    queued = time.perf_counter()
    sync()
    done = time.perf_counter()
    return {"host_us": (queued - start) / calls * 1e6, "wall_us": (done - start) / calls * 1e6}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--shape", type=int, nargs=4, default=(1, 8, 16, 16), metavar="BCHW")
    parser.add_argument("--levels", type=int, default=1)
    parser.add_argument("--kernel-size", type=int, default=5)
    args = parser.parse_args(argv)

    import cupy
    import torch

    import wtconv_cuda as wt
    from wtconv_cuda import WTConvWeights
    from wtconv_cuda.bindings import _common
    from wtconv_cuda.bindings import cupy as wtcupy
    from wtconv_cuda.bindings import torch as wttorch
    from wtconv_cuda.kernels.launch import Problem, Weights, run_forward

    b, c, h, w = args.shape
    k, levels = args.kernel_size, args.levels
    dev = torch.device("cuda", 0)
    weights64 = wt.init_weights(c, k, levels, seed=0, dtype=np.float64)
    x_np = np.random.default_rng(0).standard_normal((b, c, h, w)).astype(np.float32)
    wt_np = WTConvWeights(*(None if a is None else a.astype(np.float32) for a in weights64))

    x_t = torch.from_numpy(x_np).to(dev)
    w_t = WTConvWeights(*(None if a is None else torch.from_numpy(a).to(dev) for a in wt_np))
    x_c = cupy.asarray(x_np)
    w_c = WTConvWeights(*(None if a is None else cupy.asarray(a) for a in wt_np))
    layer = wttorch.WTConv2d.from_weights(wt_np).to(dev)
    x_grad = x_t.clone().requires_grad_()
    conv = torch.nn.Conv2d(c, c, k, padding=k // 2, groups=c).to(dev)

    def sync_all():
        torch.cuda.synchronize()
        cupy.cuda.runtime.deviceSynchronize()

    paths = {}

    def add(name, fn, sync=sync_all):
        try:
            paths[name] = measure(fn, sync, args.calls, args.warmup)
        except Exception as exc:  # report and go on: one missing framework must not hide the rest
            paths[name] = {"error": f"{type(exc).__name__}: {exc}",
                           "trace": traceback.format_exc(limit=3)}

    # --- PyTorch ---------------------------------------------------------
    with torch.no_grad():
        add("torch: op wtconv2d_fwd (no grad)", lambda: wttorch.wtconv2d_fwd(x_t, *w_t, 1))
        add("torch: functional wtconv2d (no grad)", lambda: wttorch.wtconv2d(x_t, *w_t))
        add("torch: WTConv2d forward (no grad)", lambda: layer(x_t))
        add("torch: nn.Conv2d depthwise (reference)", lambda: conv(x_t))

    dy_t = torch.ones(b, c, h, w, device=dev)

    def torch_train_step():
        layer(x_grad).backward(dy_t)

    add("torch: WTConv2d forward + backward", torch_train_step)
    add("torch: nn.Conv2d depthwise forward + backward (reference)",
        lambda: conv(x_grad).backward(dy_t))

    # --- Raw launches: the stream mechanism --------------------------------
    problem = Problem(b, c, h, w, k, levels, 1, "float32", True)
    y_t = torch.empty_like(x_t)
    ptr = np.uint64
    kweights = Weights(*(ptr(a.data_ptr()) for a in (w_t.base_weight, w_t.base_bias,
                                                    w_t.base_scale, w_t.wavelet_weight,
                                                    w_t.wavelet_scale)))
    raw_stream = torch.cuda.current_stream(dev).cuda_stream

    def launch_cached_stream():
        launcher = wttorch._launcher(dev)
        run_forward(launcher, problem, ptr(x_t.data_ptr()), ptr(y_t.data_ptr()), kweights)

    class ContextLauncher(_common.PointerLauncher):
        __slots__ = ()

        def call(self, kernel, grid, block, args, shared_bytes):
            with cupy.cuda.ExternalStream(raw_stream):
                kernel((grid,), (block,), args, shared_mem=shared_bytes)

    def launch_context_stream():
        base = wttorch._launcher(dev)
        launcher = ContextLauncher(_common.device_kernels(0), None, base._allocate,
                                   base._make_table)
        run_forward(launcher, problem, ptr(x_t.data_ptr()), ptr(y_t.data_ptr()), kweights)

    add("raw: run_forward, cached ExternalStream as launch argument", launch_cached_stream)
    add("raw: run_forward, new ExternalStream entered per call", launch_context_stream)

    # --- CuPy -------------------------------------------------------------
    add("cupy: forward (CuPy arrays, native)", lambda: wtcupy.forward(x_c, w_c))
    add("cupy: forward_dlpack (PyTorch tensors)", lambda: wtcupy.forward_dlpack(x_t, w_t))

    # --- JAX --------------------------------------------------------------
    try:
        import jax
        import jax.numpy as jnp

        from wtconv_cuda.bindings import jax as wtjax

        if jax.default_backend() != "gpu":
            raise RuntimeError(f"JAX backend is {jax.default_backend()!r}, not 'gpu'")
        x_j = jnp.asarray(x_np)
        w_j = WTConvWeights(*(None if a is None else jnp.asarray(a) for a in wt_np))
        holder = []

        def jax_sync():
            if holder:
                jax.block_until_ready(holder[-1])
            holder.clear()
            sync_all()

        def keep(value):
            holder[:] = [value]

        def eager(mechanism):
            def run():
                wtjax.set_eager_mechanism(mechanism)
                keep(wtjax.wtconv2d(x_j, w_j))
            return run

        add("jax: eager, DLPack + CuPy", eager("dlpack"), jax_sync)
        add("jax: eager, buffer_callback", eager("callback"), jax_sync)
        wtjax.set_eager_mechanism("dlpack")
        jitted = jax.jit(wtjax.wtconv2d)
        add("jax: jit forward (buffer_callback)", lambda: keep(jitted(x_j, w_j)), jax_sync)
        grad = jax.jit(jax.grad(lambda x, w: jnp.sum(wtjax.wtconv2d(x, w)), argnums=(0, 1)))
        add("jax: jit forward + backward (buffer_callback)", lambda: keep(grad(x_j, w_j)),
            jax_sync)
        conv_j = jax.jit(lambda x, k_: jax.lax.conv_general_dilated(
            x, k_, (1, 1), "SAME", feature_group_count=c))
        kernel_j = jnp.ones((c, 1, k, k), jnp.float32)
        add("jax: jit depthwise conv (reference)", lambda: keep(conv_j(x_j, kernel_j)), jax_sync)
        jax_version = jax.__version__
    except Exception as exc:
        paths["jax"] = {"error": f"{type(exc).__name__}: {exc}"}
        jax_version = None

    report = {
        "device": torch.cuda.get_device_name(dev),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cupy": cupy.__version__,
        "jax": jax_version,
        "shape": [b, c, h, w],
        "kernel_size": k,
        "levels": levels,
        "calls": args.calls,
        "paths": {name: ({key: round(value, 2) for key, value in result.items()}
                         if "error" not in result else result)
                  for name, result in paths.items()},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
