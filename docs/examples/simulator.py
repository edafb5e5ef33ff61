# docs-example: subprocess

import os

# Before numba is first imported: run the kernels in the CUDA simulator.
os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import numpy as np  # noqa: E402

import wtconv_cuda as wt  # noqa: E402
from wtconv_cuda.kernels.launch import (  # noqa: E402
    Problem, SimulatorBackend, Weights, plan_plane, run_backward, run_forward,
)

B, C, H, W, K, L = 1, 2, 9, 10, 3, 2
w = wt.init_weights(C, K, L, seed=0)  # float32
x = np.random.default_rng(9).standard_normal((B, C, H, W)).astype(np.float32)
problem = Problem(B, C, H, W, K, L, 1, "float32", True)  # stride 1, bias

backend = SimulatorBackend()
launch = plan_plane(problem, False, backend.shared_limit, backend.max_slots)
print(launch.spec, "grid", launch.grid, "block", launch.block)


def relative_error(a, ref):
    return np.abs(a - ref).max() / np.abs(ref).max()


y = np.empty_like(x)
run_forward(backend, problem, x, y, Weights(*w))  # the generated kernel
assert relative_error(y, wt.reference.forward(x, w)) < 1e-5

dx = np.empty_like(x)
grads = Weights(*(np.empty_like(a) for a in w))
run_backward(backend, problem, x, np.ones_like(y), dx, Weights(*w), grads)
ref_dx, ref_dw = wt.reference.backward(x, w, np.ones_like(y))
assert relative_error(dx, ref_dx) < 1e-5
for got, ref in zip(grads, ref_dw):
    assert relative_error(got, ref) < 1e-5
