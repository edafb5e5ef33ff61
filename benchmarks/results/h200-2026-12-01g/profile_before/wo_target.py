import sys
import numpy as np
import cupy
sys.path.insert(0, "benchmarks")
from tile_bench import random_array, random_inputs
from wtconv_cuda.kernels.launch import CupyBackend, Problem, Weights, run_backward
h = int(sys.argv[1])
cfg = {56: (64, 96, 56, 56, 5), 28: (64, 192, 28, 28, 4)}
b, c, hh, ww, L = cfg[h]
backend = CupyBackend()
problem = Problem(b, c, hh, ww, 5, L, 1, "float32", True)
rng = np.random.default_rng(0)
(x,), weights = random_inputs(rng, problem, rotations=1)
dy = random_array(rng, x.shape, "float32")
dx = cupy.empty_like(x)
grads = Weights(*(cupy.empty_like(a) for a in weights))
for _ in range(2):
    run_backward(backend, problem, x, dy, dx, weights, grads)
cupy.cuda.Device().synchronize()
