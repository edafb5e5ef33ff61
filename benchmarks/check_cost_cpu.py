"""Host cost of the public API's per-call checks on a CPU, with CuPy-like stand-ins.

:func:`wtconv_cuda._validate.check_forward` runs on every ``wtconv_cuda.forward``
and ``backward`` call. On the GPU path its arrays are ``cupy.ndarray``; this
script times it on stand-ins that look like them to the checks (module name,
``shape``, ``ndim``, ``dtype``, ``data.device_id`` and a ``device`` object built
on each access, as CuPy's is), so two trees can be compared without a GPU.
What it leaves out: CuPy's own attribute costs (Cython, cheaper than these
Python properties), so read it as a comparison of two trees on one host, not
as a GPU host's number.

    python benchmarks/check_cost_cpu.py                        # this tree
    python benchmarks/check_cost_cpu.py --tree /path/to/other  # another checkout

Prints microseconds per call, the fastest of ``--rounds`` rounds, for the
7 x 7 ConvNeXt-T stage's shapes (64 x 768 x 7 x 7, K 5, L 2) in each dtype,
with ``device`` as a property (as CuPy's) and as a plain attribute (the
cheapest a real one could be).
"""

from __future__ import annotations

import argparse
import sys
import timeit


class _Device:
    def __init__(self, ordinal):
        self.id = int(ordinal)


class _MemoryPointer:
    __slots__ = ("device_id", "ptr")

    def __init__(self, ordinal):
        self.device_id = ordinal
        self.ptr = 1


class StandIn:
    """A CuPy-like array for the checks: ``device`` is rebuilt on each access."""

    def __init__(self, shape, dtype):
        import numpy as np
        self.shape, self.ndim, self.dtype = tuple(shape), len(shape), np.dtype(dtype)
        self.data = _MemoryPointer(0)

    @property
    def device(self):
        return _Device(self.data.device_id)


class StandInPlainDevice(StandIn):
    """The same with ``device`` a plain attribute."""

    device = _Device(0)


StandIn.__module__ = StandInPlainDevice.__module__ = "cupy._core.core"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=None, help="checkout whose wtconv_cuda to import")
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.tree:
        sys.path.insert(0, args.tree)
    try:
        import ml_dtypes
        dtypes = ("float32", "float16", ml_dtypes.bfloat16)
    except ImportError:  # bfloat16 comes with ml_dtypes (a JAX dependency)
        dtypes = ("float32", "float16")

    from wtconv_cuda import _validate
    from wtconv_cuda.weights import WTConvWeights

    c, k, levels = 768, 5, 2
    print(f"check_forward at 64 x {c} x 7 x 7, K {k}, L {levels}: us per call "
          f"({args.tree or 'this tree'})")
    for kind in (StandIn, StandInPlainDevice):
        for dtype in dtypes:
            x = kind((64, c, 7, 7), dtype)
            w = WTConvWeights(kind((c, k, k), dtype), kind((c,), dtype), kind((c,), dtype),
                              kind((levels, c, 4, k, k), dtype), kind((levels, c, 4), dtype))
            call = lambda: _validate.check_forward(x, w, None, 1, same_dtype=True)  # noqa: E731
            best = min(timeit.repeat(call, number=args.calls, repeat=args.rounds))
            device = "property" if kind is StandIn else "attribute"
            print(f"  device {device:9s} {x.dtype.name:9s} {best / args.calls * 1e6:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
