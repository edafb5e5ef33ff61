"""One forward and one backward at a given shape, for Nsight Compute.

Warm-up calls compile and load the kernels first; ``ncu --launch-skip`` in
``scripts/device_check.sh`` skips them so only the measured pair is profiled.

    python benchmarks/ncu_target.py 64 96 56 56 5 5
    python benchmarks/ncu_target.py 64 96 56 56 5 5 backward   # backward calls only
    python benchmarks/ncu_target.py 64 96 56 56 5 5 forward    # three forwards only
    python benchmarks/ncu_target.py 64 96 56 56 5 5 plane-launches   # print, run nothing
    python benchmarks/ncu_target.py 64 384 14 14 3 5 backward lanes=2  # lane kernels on

``plane-launches`` prints how many ``wtconv_plane`` launches one backward at
that shape issues (fp32, as planned on this GPU): the last of them computes
the weight gradients, so ``--kernel-name regex:wtconv_plane --launch-skip
$((4 * n - 1))`` selects it in the fourth (measured) backward.

An argument ``tile_planes=P`` runs the forward tiles over their whole plane with ``P``
planes of one channel a block (``TileSpec.planes``; the split at 28 x 28), as the
planner's default.

An argument ``blocked=1`` runs the weights-only plane backward on register blocks
(``PlaneSpec.blocked``, ``launch.BLOCKED_WEIGHTS``) wherever they are planned.

An argument ``lanes=1``, ``lanes=2`` or ``lanes=2,4`` (threads a plane of the
weight gradients, then of the forwards) turns the lane kernels on for the
forward and the backward (:mod:`wtconv_cuda.kernels.lanes`) for every plane they take;
``lane-launches`` then prints the ``wtconv_lanes`` launches of one backward,
the weight-gradient kernel being the last of them.
"""

import sys

import numpy as np

import cupy

import wtconv_cuda as wt
from wtconv_cuda.weights import WTConvWeights


def _backward_launches(b, c, h, w, levels, k, own, forward) -> int:
    """Launches of one fp32 backward at this shape, as planned here, of the backward's
    own specs that ``own(spec)`` selects plus the ``dx`` forward's that ``forward(spec)``
    selects.

    A backward that computes ``dx`` with the forward kernels runs them once per
    batch chunk (``dx_forward_batches``); ``planned_specs`` lists the specs of
    each chunk size once, so the chunks are counted here.
    """
    from wtconv_cuda.kernels.launch import (CupyBackend, Problem, dx_forward_batches,
                                            planned_specs)

    backend = CupyBackend()
    limits = (backend.shared_limit, backend.max_slots)
    problem = Problem(b, c, h, w, k, levels, 1, "float32", True)
    backward = sum(map(own, planned_specs(problem, True, *limits)))
    return backward + sum(forward(spec) for chunk in dx_forward_batches(problem, *limits)
                          for spec in planned_specs(problem._replace(batch=chunk), False,
                                                    *limits))


def plane_launches(b, c, h, w, levels, k) -> int:
    """``wtconv_plane`` launches of one fp32 backward at this shape (the dx forward's too)."""
    from wtconv_cuda.kernels.codegen import PlaneSpec

    return _backward_launches(b, c, h, w, levels, k,
                              lambda spec: isinstance(spec, PlaneSpec) and spec.backward,
                              lambda spec: isinstance(spec, PlaneSpec))


def lane_launches(b, c, h, w, levels, k) -> int:
    """Launches matching ``wtconv_lanes`` in one fp32 backward (lane kernels on)."""
    from wtconv_cuda.kernels.lanes import LaneForwardSpec, LaneSpec

    return _backward_launches(b, c, h, w, levels, k,
                              lambda spec: isinstance(spec, LaneSpec),
                              lambda spec: isinstance(spec, LaneForwardSpec))


def use_lanes(threads: str) -> None:
    """The lane kernels for every plane they take: ``threads`` threads a plane, or
    ``"W,F"``: ``W`` for the weight gradients and ``F`` for the forwards."""
    from wtconv_cuda.kernels import launch

    weights, _, forward = threads.partition(",")
    launch.LANES_MAX_PIXELS = launch.LANES_FORWARD_MAX_PIXELS = launch.LANES_FORCE_MAX_PIXELS
    launch.LANES_DEFAULT = int(weights)
    launch.LANES_FORWARD_DEFAULT = int(forward or weights)
    launch.clear_plan_caches()


def use_tile_planes(planes: str) -> None:
    """``planes`` planes of one channel a block for the whole-plane forward tiles."""
    from wtconv_cuda.kernels import launch

    launch.TILE_PLANES = int(planes)  # and in place of the small-plane rules' own count
    launch.SPLIT_SMALL_TILES = {edge: rule._replace(planes=int(planes))
                                for edge, rule in launch.SPLIT_SMALL_TILES.items()}
    launch.clear_plan_caches()


def use_blocked(on: str) -> None:
    """The weights-only plane backward on register blocks (``on``: "1") or not ("0")."""
    from wtconv_cuda.kernels import launch

    launch.BLOCKED_WEIGHTS = on == "1"
    launch.clear_plan_caches()


OPTIONS = {"lanes": use_lanes, "tile_planes": use_tile_planes, "blocked": use_blocked}


def main():
    b, c, h, w, levels, k = (int(v) for v in sys.argv[1:7])
    mode = [arg for arg in sys.argv[7:] if arg.partition("=")[0] not in OPTIONS]
    for arg in set(sys.argv[7:]) - set(mode):
        name, _, value = arg.partition("=")
        OPTIONS[name](value)
    if mode == ["plane-launches"]:
        print(plane_launches(b, c, h, w, levels, k))
        return
    if mode == ["lane-launches"]:
        print(lane_launches(b, c, h, w, levels, k))
        return
    backward_only = mode == ["backward"]
    rng = np.random.default_rng(0)
    weights = wt.init_weights(c, k, levels, dtype=np.float32, seed=0)
    weights = WTConvWeights(*(None if a is None else cupy.asarray(a) for a in weights))
    x = cupy.asarray(rng.standard_normal((b, c, h, w)).astype(np.float32))
    dy = cupy.asarray(rng.standard_normal((b, c, h, w)).astype(np.float32))
    if mode == ["forward"]:  # two warm-up forwards, then the measured one
        for _ in range(3):
            wt.forward(x, weights)
        cupy.cuda.Device().synchronize()
        print(f"x bytes: {x.nbytes}")
        return
    for _ in range(4 if backward_only else 2):  # warm-up, then the measured launches
        if not backward_only:
            wt.forward(x, weights)
        wt.backward(wt.Saved(x, weights, levels, 1), dy)
    cupy.cuda.Device().synchronize()
    print(f"x bytes: {x.nbytes}")


if __name__ == "__main__":
    main()
