# docs-example: run

import numpy as np

import wtconv_cuda as wt
from wtconv_cuda import reference

rng = np.random.default_rng(1)
x = rng.standard_normal((2, 3, 13, 10))  # odd height: one zero row is padded

# One Haar step: LL, LH, HL, HH of every 2x2 block, an orthogonal transform.
u = reference.haar_analysis(x)  # (2, 3, 4, 7, 5)
a, b, c, d = x[..., 0, 0], x[..., 0, 1], x[..., 1, 0], x[..., 1, 1]
first_block = np.stack([a + b + c + d, a + b - c - d,
                        a - b + c - d, a - b - c + d], axis=-1) / 2
assert np.allclose(u[..., :, 0, 0], first_block)
assert np.allclose(reference.haar_synthesis(u, (13, 10)), x)  # inverse

# The level-by-level synthesis equals the one-pass closed form.
grids = [(-(-13 // 2**j), -(-10 // 2**j)) for j in (1, 2, 3)]
zs = [rng.standard_normal((2, 3, 4, h, w)) for h, w in grids]
assert np.allclose(reference.synthesis_chain(zs, (13, 10)),
                   reference.closed_form_synthesis(zs, (13, 10)))

# L = 0 is a scaled depthwise convolution with a scaled bias.
w0 = wt.init_weights(3, kernel_size=3, levels=0, dtype=np.float64, seed=2)
conv = reference.depthwise_conv_same(x, w0.base_weight)
expected = w0.base_scale[:, None, None] * (conv + w0.base_bias[:, None, None])
assert np.allclose(reference.forward(x, w0), expected)

# Stride subsamples the full-resolution output.
w3 = wt.init_weights(3, kernel_size=5, levels=3, dtype=np.float64, seed=3)
full = reference.forward(x, w3)
assert np.array_equal(reference.forward(x, w3, stride=2), full[..., ::2, ::2])
