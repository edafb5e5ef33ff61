# docs-example: run

import numpy as np

from wtconv_cuda import reference

# The published layer builds its Haar filters in float32 from 1/sqrt(2):
published_tap = np.float32(1 / np.sqrt(2)) ** 2
assert published_tap == np.float32(0.49999997) and published_tap != 0.5


def down_and_up(x, levels, gain):
    """The LL chain down and back up, each step's taps scaled by ``gain``."""
    for _ in range(levels):
        x = gain * reference.haar_analysis(x)[0]
    for _ in range(levels):
        u = np.zeros((4, *x.shape))
        u[0] = gain * x
        x = reference.haar_synthesis(u, (2 * x.shape[0], 2 * x.shape[1]))
    return x


x = np.random.default_rng(6).standard_normal((64, 64))
for levels in (1, 3, 5):
    exact = down_and_up(x, levels, 1.0)
    published = down_and_up(x, levels, 2 * float(published_tap))
    relative = np.abs(published - exact).max() / np.abs(exact).max()
    print(f"L = {levels}: relative difference {relative:.1e}")
    assert 0.9e-7 * levels < relative < 1.5e-7 * levels  # ~1.2e-7 per level
