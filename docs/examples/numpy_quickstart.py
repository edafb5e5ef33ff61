# docs-example: run

import numpy as np

import wtconv_cuda as wt

# Parameters of one layer: NumPy float32 arrays, initialised like the paper's.
w = wt.init_weights(channels=8, kernel_size=5, levels=3, seed=0)
x = np.random.default_rng(0).standard_normal((2, 8, 37, 45))
x = x.astype(np.float32)

tape = wt.Tape()
y = wt.forward(x, w, levels=3, tape=tape)  # CPU: float64 oracle, then float32
dx, dw = tape.backward(np.ones_like(y))  # gradients of sum(y)

assert y.shape == (2, 8, 37, 45) and y.dtype == np.float32
assert dx.shape == x.shape and dw.wavelet_weight.shape == (3, 8, 4, 5, 5)
print({name: g.shape for name, g in dw._asdict().items()})
