"""One tiled forward and one tiled backward at a given shape, for Nsight Compute.

The tiles are forced on (``Tuning(tiles=True)``); a warm-up pair compiles and
loads the kernels, then the measured pair runs. ``scripts/device_check.sh
tileprofile`` profiles the second launch of each kind (``--launch-skip 2``).

    python benchmarks/tile_ncu_target.py 8 128 512 512 1 5
"""

import sys

import numpy as np

import cupy

from tile_bench import random_array, random_inputs
from wtconv_cuda.kernels.launch import (
    CupyBackend, Problem, Tuning, Weights, run_backward, run_forward,
)


def main():
    b, c, h, w, levels, k = (int(v) for v in sys.argv[1:7])
    storage = sys.argv[7] if len(sys.argv) > 7 else "float32"
    backend = CupyBackend()
    problem = Problem(b, c, h, w, k, levels, 1, storage, True)
    rng = np.random.default_rng(0)
    (x,), weights = random_inputs(rng, problem, rotations=1)
    dy = random_array(rng, x.shape, storage)
    y, dx = cupy.empty_like(x), cupy.empty_like(x)
    grads = Weights(*(cupy.empty_like(a) for a in weights))
    tuning = Tuning(tiles=True)
    for _ in range(2):  # warm-up, then the measured pair
        run_forward(backend, problem, x, y, weights, tuning)
        run_backward(backend, problem, x, dy, dx, weights, grads, tuning)
    cupy.cuda.Device().synchronize()
    print(f"x bytes: {x.nbytes}")


if __name__ == "__main__":
    main()
