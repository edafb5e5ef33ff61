# docs-example: run

import numpy as np

import wtconv_cuda as wt

# One layer of a published checkpoint, made up with NumPy: C = 4, K = 5, L = 2.
rng = np.random.default_rng(0)
C, K, P = 4, 5, "stages.0.blocks.1.dwconv."
# The published layer stores its Haar taps as float32(1/sqrt(2))**2.
signs = [[[1, 1], [1, 1]], [[1, 1], [-1, -1]], [[1, -1], [1, -1]],
         [[1, -1], [-1, 1]]]  # LL, LH, HL, HH
haar = np.float32(0.49999997) * np.array(signs)
filters = np.tile(haar[:, None], (C, 1, 1, 1)).astype(np.float32)


def draw(*shape):
    return rng.standard_normal(shape).astype(np.float32)


checkpoint = {
    P + "base_conv.weight": draw(C, 1, K, K),
    P + "base_conv.bias": draw(C),
    P + "base_scale.weight": np.ones((1, C, 1, 1), np.float32),
    P + "wt_filter": filters,
    P + "iwt_filter": filters,
    "head.fc.weight": draw(10, 4),  # other layers are ignored
}
for i in range(2):
    checkpoint[P + f"wavelet_convs.{i}.weight"] = draw(4 * C, 1, K, K)
    checkpoint[P + f"wavelet_scale.{i}.weight"] = np.full((1, 4 * C, 1, 1),
                                                          0.1, np.float32)

w = wt.weights_from_state_dict(checkpoint, prefix="stages.0.blocks.1.dwconv")
assert (w.channels, w.kernel_size, w.levels) == (4, 5, 2)
# Row 4*c + k of a level's (4C, 1, K, K) weight is channel c, subband k.
level2 = checkpoint[P + "wavelet_convs.1.weight"]
assert np.array_equal(w.wavelet_weight[1, 3, 2], level2[4 * 3 + 2, 0])

y = wt.forward(draw(1, 4, 28, 28), w)  # levels: taken from w

# And back: the same names, with exact 0.5 Haar filters.
exported = wt.weights_to_state_dict(w, prefix="stages.0.blocks.1.dwconv")
assert set(exported) == set(checkpoint) - {"head.fc.weight"}
assert np.abs(exported[P + "wt_filter"]).max() == 0.5
