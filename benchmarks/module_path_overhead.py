"""Host cost of a WTConv2d training step: the module path against the functional path.

The module's eager path (``_ModuleWTConv``: parameters passed as they are)
against what the module did before, ``wtconv2d(x, *layer.kernel_weights())``
(a view node per parameter, stacks for L > 1, casts under autocast), in the
same process, alternating, on a tiny shape where host cost is the whole step.
Prints microseconds per step (median over rounds of ``--calls`` steps). Needs
CUDA; ``benchmarks/host_proxy_cpu.py`` is the CPU proxy.

    python benchmarks/module_path_overhead.py --levels 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from wtconv_cuda.bindings.torch import WTConv2d, wtconv2d


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=4, default=(1, 8, 16, 16), metavar="BCHW")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    b, c, h, w = args.shape
    dev = torch.device("cuda")
    print(f"shape {tuple(args.shape)}, K 5, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'levels':>6} {'autocast':>9} {'module us':>10} {'functional us':>14}")
    for levels in args.levels:
        layer = WTConv2d(c, c, 5, wt_levels=levels).to(dev)
        x = torch.randn(b, c, h, w, device=dev, requires_grad=True)
        for autocast in (None, torch.bfloat16):
            def module_step():
                layer(x).sum().backward()

            def functional_step():
                wtconv2d(x, *layer.kernel_weights(), levels=levels).sum().backward()

            times = {"module": [], "functional": []}
            for _ in range(args.rounds):
                for name, step in (("module", module_step), ("functional", functional_step)):
                    with torch.autocast("cuda", dtype=autocast or torch.float32,
                                        enabled=autocast is not None):
                        for _ in range(5):
                            step()
                        torch.cuda.synchronize()
                        start = time.perf_counter()
                        for _ in range(args.calls):
                            step()
                        torch.cuda.synchronize()
                    times[name].append((time.perf_counter() - start) / args.calls * 1e6)
            label = "bf16" if autocast else "off"
            print(f"{levels:>6} {label:>9} {statistics.median(times['module']):>10.1f} "
                  f"{statistics.median(times['functional']):>14.1f}")


if __name__ == "__main__":
    main()
