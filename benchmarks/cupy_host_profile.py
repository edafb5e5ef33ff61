"""Where the host time of a CuPy training step goes, piece by piece.

The library's own API (``wtconv_cuda.forward`` with a ``Tape``, then
``Tape.backward``) on CuPy arrays, at a tiny shape where the GPU work is a few
microseconds: each row is the host cost of one piece of the call, from the
public functions down to the raw kernel launch. A cProfile of whole training
steps follows the table.

    python benchmarks/cupy_host_profile.py --calls 1000 > cupy_host_profile.txt

Prints microseconds per call (host: until the call returns; wall: until the
GPU has finished every call), then the profile's top entries.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import numpy as np
from binding_overhead import measure  # a sibling script: benchmarks/ is on sys.path


def _views_of_one(weights, align: int = 512):
    """The weight gradients as ``gpu.gradient_arrays`` made them before ``3c51d9a``: one
    allocation, sliced at ``align``-byte offsets and reshaped, for the comparison."""
    import cupy

    step = align // 4
    sizes = [-(-a.size // step) * step for a in weights if a is not None]
    flat = cupy.empty(sum(sizes), dtype=cupy.float32)
    views, start = [], 0
    for a, size in zip((a for a in weights if a is not None), sizes):
        views.append(flat[start:start + a.size].reshape(a.shape))
        start += size
    return views


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--shape", type=int, nargs=4, default=(1, 8, 16, 16), metavar="BCHW")
    parser.add_argument("--levels", type=int, default=3)
    parser.add_argument("--kernel-size", type=int, default=5)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)

    import cupy

    import wtconv_cuda as wt
    from wtconv_cuda import _validate, gpu
    from wtconv_cuda.kernels.launch import plan_plane

    b, c, h, w = args.shape
    k, levels = args.kernel_size, args.levels
    rng = np.random.default_rng(0)
    weights = wt.WTConvWeights(*(None if a is None else cupy.asarray(a) for a in
                                 wt.init_weights(c, k, levels, seed=0, dtype=np.float32)))
    x = cupy.asarray(rng.standard_normal((b, c, h, w), dtype=np.float32))
    dy = cupy.asarray(rng.standard_normal((b, c, h, w), dtype=np.float32))
    sync = cupy.cuda.get_current_stream().synchronize

    def train():
        tape = wt.Tape()
        wt.forward(x, weights, tape=tape)
        return tape.backward(dy)

    problem = gpu._problem(x, weights, levels, 1)
    backend = gpu._backend(x.device.id)
    launch = plan_plane(problem, False, backend.shared_limit, backend.max_slots)
    kernel = backend.kernel(launch.spec)
    geo = backend.table(launch.geo)
    y = cupy.empty_like(x)
    kw = gpu._kernel_weights(weights, cupy)
    launch_args = (x, y, x, *kw, geo, geo, geo, *launch.header)

    forward_program = gpu._program(x.device.id, problem, False)
    forward_addresses = [a.data.ptr for a in (x, y, *kw)]
    stream = cupy.cuda.get_current_stream()

    recorded = wt.Tape()
    wt.forward(x, weights, tape=recorded)
    recorded_backward = recorded.backward

    def enter_device():
        with cupy.cuda.Device(x.device.id):
            pass

    pieces = [
        ("training step: forward(tape) + Tape.backward", train),
        ("wt.forward", lambda: wt.forward(x, weights)),
        ("wt.backward (Saved built once)",
         lambda saved=wt.Saved(x, weights, levels, 1): wt.backward(saved, dy)),
        ("Tape.backward (the forward's record: dy checked)", lambda: recorded_backward(dy)),
        ("_validate.check_forward", lambda: _validate.check_forward(x, weights, None, 1,
                                                                    same_dtype=True)),
        ("_validate.check_dy", lambda: _validate.check_dy(dy, x, 1, same_dtype=True)),
        ("gpu.forward (no checks)", lambda: gpu.forward(x, weights, levels, 1)),
        ("gpu.backward (no checks)", lambda: gpu.backward(x, weights, dy, levels, 1)),
        ("gpu._problem", lambda: gpu._problem(x, weights, levels, 1)),
        ("gpu._kernel_weights", lambda: gpu._kernel_weights(weights, cupy)),
        ("plan_plane (cached)", lambda: plan_plane(problem, True, backend.shared_limit,
                                                   backend.max_slots)),
        ("backend.kernel(spec) (cached)", lambda: backend.kernel(launch.spec)),
        ("backend.table(geo) (cached)", lambda: backend.table(launch.geo)),
        ("cupy.empty(x.shape)", lambda: cupy.empty(x.shape, dtype=x.dtype)),
        ("weight gradients: gpu.gradient_arrays (five ndarrays on one allocation)",
         lambda: gpu.gradient_arrays(weights, x.dtype, cupy)),
        ("weight gradients: five cupy.empty calls",
         lambda: [cupy.empty(a.shape, dtype=x.dtype) for a in weights if a is not None]),
        ("weight gradients: one allocation, five views", lambda: _views_of_one(weights)),
        ("cupy.ascontiguousarray(x)", lambda: cupy.ascontiguousarray(x)),
        ("with cupy.cuda.Device(0)", enter_device),
        ("forward kernel launch (CupyBackend.call)",
         lambda: backend.call(kernel, launch.grid, launch.block, launch_args,
                              launch.shared_bytes)),
        ("forward program replay (Program.run)",
         lambda: forward_program.run(forward_addresses, gpu._allocate, stream.ptr)),
    ]
    print(f"shape {args.shape}, K {k}, L {levels}, float32, "
          f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, cupy {cupy.__version__}")
    print(f"{'piece':50s} {'host us':>9s} {'wall us':>9s}")
    for name, fn in pieces:
        result = measure(fn, sync, args.calls, warmup=20)
        print(f"{name:50s} {result['host_us']:9.1f} {result['wall_us']:9.1f}")

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.calls):
        train()
    profiler.disable()
    sync()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
    print(f"\n== cProfile of {args.calls} training steps, by tottime")
    print(out.getvalue())


if __name__ == "__main__":
    main()
