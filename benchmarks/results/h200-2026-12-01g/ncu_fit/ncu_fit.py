import sys
import numpy as np
import cupy
sys.path.insert(0, "benchmarks")
from tile_bench import random_inputs
from wtconv_cuda.kernels.launch import CupyBackend, Problem, Tuning, run_forward
cfg = {56: (64, 96, 56, 56, 5, 2), 28: (64, 192, 28, 28, 4, 2)}
backend = CupyBackend()
for tag in sys.argv[1:]:
    h, t, thr, q = (int(v) for v in tag.split(":"))
    b, c, hh, ww, L, s = cfg[h]
    problem = Problem(b, c, hh, ww, 5, L, 1, "float32", True)
    (x,), weights = random_inputs(np.random.default_rng(0), problem, rotations=1)
    y = cupy.empty_like(x)
    tuning = Tuning(split=s, tile=t, threads=thr, strip=q)
    for _ in range(2):
        run_forward(backend, problem, x, y, weights, tuning)
    cupy.cuda.Device().synchronize()
