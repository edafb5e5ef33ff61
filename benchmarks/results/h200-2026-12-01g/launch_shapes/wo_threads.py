"""Backward times of the weights-only kernel under launch shapes (temporary)."""
import os, sys
import numpy as np
import cupy
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
from kernel_bench import cuda_time, device_weights
from wtconv_cuda.kernels.launch import CupyBackend, Problem, Tuning, Weights, planned_specs, plan_plane, run_backward
from wtconv_cuda.kernels.warmup import compile_all
from wtconv_cuda.kernels.compiler import gpu_kernel

CASES = [((64, 96, 56, 56, 5), Tuning()), ((64, 96, 56, 56, 5), Tuning(threads=256, planes_per_block=1)),
         ((64, 96, 56, 56, 5), Tuning(threads=192, planes_per_block=1)),
         ((64, 192, 28, 28, 4), Tuning()), ((64, 192, 28, 28, 4), Tuning(threads=128, planes_per_block=1))]
backend = CupyBackend()
specs = []
for (b, c, h, w, L), t in CASES:
    specs += planned_specs(Problem(b, c, h, w, 5, L, 1, "float32", True), True, backend.shared_limit, backend.max_slots, t)
compile_all(sorted(set(specs), key=repr), (9, 0), 16)
for rnd in range(2):
    for (b, c, h, w, L), t in CASES:
        p = Problem(b, c, h, w, 5, L, 1, "float32", True)
        rng = np.random.default_rng(0)
        wts = Weights(*device_weights(c, 5, L, np.float32, rng))
        xs = [cupy.asarray(rng.standard_normal((b, c, h, w)).astype(np.float32)) for _ in range(3)]
        dys = [cupy.asarray(rng.standard_normal((b, c, h, w)).astype(np.float32)) for _ in range(3)]
        dx = cupy.empty_like(xs[0]); grads = Weights(*(cupy.empty_like(a) for a in wts))
        la = plan_plane(p, True, backend.shared_limit, backend.max_slots, t)
        attrs = gpu_kernel(la.spec, backend.device_id).attributes
        ms = cuda_time(lambda x, dy: run_backward(backend, p, x, dy, dx, wts, grads, t), list(zip(xs, dys)))
        print(f"round {rnd} {h} T{la.spec.threads} G{la.spec.planes_per_block} rb{la.batch_chunk} grid {la.grid} smem {la.shared_bytes} regs {attrs['num_regs']} local {attrs['local_size_bytes']}: backward {ms:.4f} ms", flush=True)
