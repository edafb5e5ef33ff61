"""Why the user benchmark's host cost differs from the CuPy host profile's.

``cupy_host_profile.py`` has timed the (1, 8, 16, 16) L 3 CuPy training step
at 58 us (H200), while the user benchmark's host row read 72-179 us on the
same kind of machine for what should be the same work. The two differ in the
process around the step: the benchmark has imported and initialised PyTorch,
its inputs and weights are PyTorch tensors seen by CuPy through DLPack, and
it syncs through ``torch.cuda.synchronize``. This script times the same step
in one process as the process changes, a few rounds each, so the difference
can be put on one of them:

1. CuPy alone (PyTorch not imported): CuPy's own arrays;
2. after ``import torch`` and a CUDA tensor: the same arrays;
3. PyTorch tensors through ``cupy.from_dlpack`` (x, dy and the weights of a
   ``WTConv2d``), as ``wtconv_cuda._bench.measure.cupy_impl`` makes them;
4. the same with the garbage collector off;
5. the benchmark's own ``host_overhead`` (all its implementations).

    python benchmarks/host_state_probe.py --calls 500 --rounds 3

Prints microseconds per step: host (until the loop returns) and wall (until
the GPU has finished).
"""

from __future__ import annotations

import argparse
import gc

import numpy as np

from wtconv_cuda._bench.core import host_times_per_call


def _rounds(label: str, fn, calls: int, rounds: int, sync, gc_off: bool = False) -> None:
    results = []
    for _ in range(rounds):
        if gc_off:
            gc.disable()
        try:
            results.append(host_times_per_call(fn, calls=calls, sync=sync))
        finally:
            gc.enable()
    host = " ".join(f"{h:6.1f}" for h, _ in results)
    wall = " ".join(f"{w:6.1f}" for _, w in results)
    print(f"{label:58s} host {host} | wall {wall}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    import cupy

    import wtconv_cuda as wt

    shape, k, levels = (1, 8, 16, 16), 5, 3
    rng = np.random.default_rng(0)
    w_np = wt.init_weights(shape[1], k, levels, seed=0, dtype=np.float32)
    x_np = rng.standard_normal(shape, dtype=np.float32)
    dy_np = rng.standard_normal(shape, dtype=np.float32)

    def step_on(x, dy, weights):
        def train():
            tape = wt.Tape()
            wt.forward(x, weights, tape=tape)
            return tape.backward(dy)
        return train

    own = wt.WTConvWeights(*(None if a is None else cupy.asarray(a) for a in w_np))
    x_c, dy_c = cupy.asarray(x_np), cupy.asarray(dy_np)
    cupy_sync = cupy.cuda.get_current_stream().synchronize
    print(f"shape {shape}, K {k}, L {levels}, float32, "
          f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}; "
          f"{args.calls} calls a round, {args.rounds} rounds", flush=True)
    _rounds("1 CuPy alone, CuPy arrays", step_on(x_c, dy_c, own), args.calls, args.rounds,
            cupy_sync)

    import torch

    from wtconv_cuda.bindings.torch import WTConv2d

    dev = torch.device("cuda", 0)
    torch.ones(1, device=dev).sum().item()
    torch_sync = lambda: torch.cuda.synchronize(dev)  # noqa: E731
    _rounds("2 torch imported, CuPy arrays", step_on(x_c, dy_c, own), args.calls, args.rounds,
            cupy_sync)
    _rounds("2b the same, torch.cuda.synchronize", step_on(x_c, dy_c, own), args.calls,
            args.rounds, torch_sync)

    layer = WTConv2d.from_weights(wt.WTConvWeights(*w_np)).to(dev)
    held = [None if t is None else t.detach().contiguous() for t in layer.kernel_weights()]
    viewed = wt.WTConvWeights(*(None if t is None else cupy.from_dlpack(t) for t in held))
    x_t, dy_t = torch.from_numpy(x_np).to(dev), torch.from_numpy(dy_np).to(dev)
    x_v, dy_v = cupy.from_dlpack(x_t), cupy.from_dlpack(dy_t)
    _rounds("3 DLPack views: x, dy", step_on(x_v, dy_v, own), args.calls, args.rounds,
            torch_sync)
    _rounds("3b DLPack views: the weights", step_on(x_c, dy_c, viewed), args.calls,
            args.rounds, torch_sync)
    _rounds("3c DLPack views: x, dy and the weights (the benchmark's)",
            step_on(x_v, dy_v, viewed), args.calls, args.rounds, torch_sync)
    _rounds("4 the same, gc off", step_on(x_v, dy_v, viewed), args.calls, args.rounds,
            torch_sync, gc_off=True)

    conv = torch.nn.Conv2d(shape[1], shape[1], 7, padding=3, groups=shape[1]).to(dev)
    x_g = x_t.clone().requires_grad_()

    def dw7_step():
        conv.zero_grad(set_to_none=True)
        x_g.grad = None
        conv(x_g).backward(dy_t)

    _rounds("depthwise 7x7 training step (PyTorch autograd)", dw7_step, args.calls,
            args.rounds, torch_sync)

    from wtconv_cuda.bench import find_materialising
    from wtconv_cuda._bench.measure import MeasureOptions, Runtime, host_overhead

    runtime = Runtime(torch, "cuda", cupy)
    opts = MeasureOptions(repeats=30, warmup=10, rotations=3, seed=0, host_calls=args.calls)
    materialising, _ = find_materialising()
    for r in range(args.rounds):
        report = host_overhead(runtime, opts, materialising, cupy)
        cells = ", ".join(f"{name} {entry.get('training_us', float('nan')):.1f}"
                          for name, entry in report["us"].items())
        print(f"5 the benchmark's host_overhead, round {r + 1}: training us: {cells}",
              flush=True)


if __name__ == "__main__":
    main()
