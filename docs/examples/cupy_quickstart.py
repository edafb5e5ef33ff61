# docs-example: not-executed (needs a CUDA GPU and CuPy)

import cupy as cp

import wtconv_cuda as wt

w_host = wt.init_weights(channels=96, kernel_size=5, levels=3, seed=0)
w = wt.WTConvWeights(*(None if a is None else cp.asarray(a) for a in w_host))
x = cp.random.standard_normal((8, 96, 56, 56), dtype=cp.float32)

tape = wt.Tape()
y = wt.forward(x, w, levels=3, tape=tape)  # one kernel launch
dx, dw = tape.backward(cp.ones_like(y))  # two launches: plane, finalize

# Half precision: x, every weight array and dy share one dtype on the GPU.
w16 = wt.WTConvWeights(*(None if a is None else a.astype(cp.float16)
                         for a in w))
y16 = wt.forward(x.astype(cp.float16), w16)  # accumulates in float32

# Weight gradients are summed in a fixed order: a second run is bitwise equal.
dx2, dw2 = tape.backward(cp.ones_like(y))
assert all(bool((a == b).all()) for a, b in zip(dw, dw2) if a is not None)
