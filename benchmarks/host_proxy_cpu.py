"""Host cost of the PyTorch ``WTConv2d`` training step on a CPU, kernels stubbed out.

A proxy for the Python and autograd overhead of the binding that runs without
a GPU: CPU tensors take stand-in implementations that only allocate the
outputs the CUDA path allocates (``y``; ``dx`` and the weight gradients), so
what is timed is the module, the autograd ``Function``, checks, casts and the
engine, not the oracle. It leaves out what only a GPU has (the autograd
device thread's hand-off, the launches, the caching allocator), so use it to
compare two versions of the binding, in one session, not as a GPU number.

    python benchmarks/host_proxy_cpu.py                       # this tree
    python benchmarks/host_proxy_cpu.py --tree /path/to/other # another checkout

Wall times on a shared 2-core machine move by 30%; instruction counts much
less. ``--steps N`` runs 30 warm-up steps and ``N`` more of one
configuration (the first of ``--levels``, ``--autocast``) without timing,
for callgrind; the difference between ``N = 400`` and ``N = 0``, divided by
400, is the instruction count of one step. Fix the hash seed: without it the
start-up count moves by up to 20 M instructions between runs (with it, by
about 4 M)::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python benchmarks/host_proxy_cpu.py --levels 3 --steps 400 2>&1 | grep Collected

Prints microseconds per training step: the fastest and the median of
``--rounds`` rounds (the fastest is the steadier estimate of fixed work on a
shared machine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=None, help="checkout whose wtconv_cuda to import")
    parser.add_argument("--shape", type=int, nargs=4, default=(1, 8, 16, 16), metavar="BCHW")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--autocast", choices=("off", "bf16"), default="off",
                        help="with --steps: the configuration to run")
    parser.add_argument("--steps", type=int, default=None,
                        help="untimed: 30 warm-up steps and this many more, then exit")
    parser.add_argument("--launch-path", action="store_true",
                        help="run the binding's CUDA implementations (checks, planning, "
                             "launcher, argument packing) on CPU tensors with a stand-in "
                             "device whose kernels do nothing, instead of the stubs")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print a cProfile of N steps of the first configuration")
    args = parser.parse_args(argv)
    if args.tree:
        sys.path.insert(0, args.tree)
    import torch

    from wtconv_cuda.bindings import torch as binding

    torch.set_num_threads(1)

    def forward_stub(x, bw, bb, bs, ww, ws, stride, sizes):
        ho, wo = -(-sizes.height // stride), -(-sizes.width // stride)
        return torch.empty((sizes.batch, sizes.channels, ho, wo), dtype=x.dtype)

    def backward_stub(dy, x, bw, bb, bs, ww, ws, stride, sizes):
        grads = [torch.empty(t.shape, dtype=t.dtype) for t in (bw, bs, ww, ws)]
        d_bias = bs.new_empty((0,)) if bb is None else torch.empty_like(bb)
        return torch.empty(x.shape, dtype=x.dtype), grads[0], d_bias, *grads[1:]

    launches = None
    if args.launch_path:
        launches = install_stand_in_device(binding)
    else:
        binding._IMPLS["cpu"] = (forward_stub, backward_stub)
        # Versions that pick the GPU branch by identity with the CUDA functions
        # take that branch with the stand-ins too.
        binding._forward_cuda, binding._backward_cuda = forward_stub, backward_stub
    b, c, h, w = args.shape

    def make_step(levels, autocast):
        layer = binding.WTConv2d(c, c, 5, wt_levels=levels)
        x = torch.randn(b, c, h, w, requires_grad=True)

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                y = layer(x)
            y.sum().backward()
        return step

    if args.steps is not None:
        step = make_step(args.levels[0], args.autocast == "bf16")
        for _ in range(30 + args.steps):
            step()
        return
    if args.profile:
        import cProfile
        import pstats

        step = make_step(args.levels[0], args.autocast == "bf16")
        for _ in range(30):
            step()
        profile = cProfile.Profile()
        profile.runcall(lambda: [step() for _ in range(args.profile)])
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        return
    what = "launch path on a stand-in device" if args.launch_path else "kernels stubbed"
    print(f"shape {tuple(args.shape)}, K 5, torch {torch.__version__}, {what}, "
          f"{args.tree or 'this tree'}")
    print(f"{'levels':>6} {'autocast':>9} {'min us':>8} {'median us':>10}")
    for levels in args.levels:
        for autocast in (False, True):
            step = make_step(levels, autocast)
            for _ in range(50):
                step()
            times = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                for _ in range(args.calls):
                    step()
                times.append((time.perf_counter() - start) / args.calls * 1e6)
            print(f"{levels:>6} {'bf16' if autocast else 'off':>9} {min(times):>8.1f} "
                  f"{statistics.median(times):>10.1f}")
            if launches is not None:  # one more step, counted
                before = launches[0]
                step()
                print(f"{'':>6} {'':>9} launches per step: {launches[0] - before}")


def install_stand_in_device(binding) -> list:
    """Route CPU tensors through ``_forward_cuda`` / ``_backward_cuda`` with a device
    whose kernels, launches, streams and device switches do nothing (addresses are the
    CPU tensors'; no kernel runs, so outputs are garbage). Calls replay recorded
    programs (:mod:`wtconv_cuda.kernels.program`), as on a GPU, with a launch that
    returns at once. Returns a one-element list counting the launches."""
    import contextlib
    import types

    import torch

    from wtconv_cuda.bindings import _common
    from wtconv_cuda.kernels import program

    class Backend:  # an H200's limits (CupyBackend: 227 KiB less 1 KiB, 2 slots per SM)
        shared_limit, max_slots = 226 * 1024, 2 * 132

        def kernel(self, spec):
            return lambda grid, block, args, shared_mem=0, stream=None: None

        def driver_handle(self, kernel):
            return 1  # any int: launches go to the stand-in below

    device = _common.DeviceKernels(0, backend=Backend())
    stream = types.SimpleNamespace(ptr=0)

    def allocate(n):
        buffer = torch.empty(n, dtype=torch.float32)
        return buffer, buffer.data_ptr()

    def make_table(values):
        table = torch.from_numpy(values.copy())
        return table, table.data_ptr()

    launches = [0]

    def launch(function, grid, block, shared, stream, args):
        launches[0] += 1

    program.launch_packed = launch
    binding._per_device[None] = (device, allocate, make_table)  # CPU tensors: index None
    binding._current_stream = lambda index: 0
    binding._launcher = lambda dev: _common.PointerLauncher(device, stream, allocate, make_table)
    _common.DeviceScope = lambda index: contextlib.nullcontext()
    binding._IMPLS["cpu"] = (binding._forward_cuda, binding._backward_cuda)
    return launches


if __name__ == "__main__":
    main()
