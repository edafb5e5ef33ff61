# docs-example: run

import numpy as np

import wtconv_cuda as wt

rng = np.random.default_rng(4)
x = rng.standard_normal((2, 3, 11, 14))  # float64: full precision on the CPU
w = wt.init_weights(3, kernel_size=3, levels=2, dtype=np.float64, seed=5)
dy = rng.standard_normal((2, 3, 6, 7))  # gradient of forward(x, w, stride=2)

tape = wt.Tape()
wt.forward(x, w, stride=2, tape=tape)
dx, dw = tape.backward(dy)  # the tape references x and w: no activations
dx_again, _ = wt.backward(tape.saved, dy)  # the same, as a free function
assert np.array_equal(dx, dx_again)

# dx is the adjoint of the linear part of x -> y: <A v, dy> = <v, dx>.
v = rng.standard_normal(x.shape)
bias_only = wt.forward(np.zeros_like(x), w, stride=2)
lhs = np.vdot(wt.forward(v, w, stride=2) - bias_only, dy)
assert np.isclose(lhs, np.vdot(v, dx), rtol=1e-12)


# A weight gradient against a central difference of <y, dy>.
def objective(scale):
    y = wt.forward(x, w._replace(wavelet_scale=scale), stride=2)
    return np.vdot(y, dy)


e = np.zeros_like(w.wavelet_scale)
e[1, 2, 3] = 1e-4  # level 2, channel 2, subband HH
s = w.wavelet_scale
numeric = (objective(s + e) - objective(s - e)) / 2e-4
assert np.isclose(numeric, dw.wavelet_scale[1, 2, 3], rtol=1e-7)
