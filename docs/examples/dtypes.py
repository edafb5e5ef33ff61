# docs-example: run

import numpy as np

import wtconv_cuda as wt

w = wt.init_weights(channels=4, kernel_size=3, levels=2, dtype=np.float16)
x = np.random.default_rng(8).standard_normal((1, 4, 20, 20))

# CPU: any mix of float16, float32 and float64, computed in float64 and
# rounded once to the dtype of the array each result belongs to.
assert wt.forward(x.astype(np.float16), w).dtype == np.float16
assert wt.forward(x, w).dtype == np.float64

tape = wt.Tape()
wt.forward(x.astype(np.float32), w, tape=tape)
dx, dw = tape.backward(np.ones((1, 4, 20, 20), np.float64))
assert dx.dtype == np.float32 and dw.base_weight.dtype == np.float16

# Integer arrays are rejected, with a message naming the argument.
try:
    wt.forward(x.astype(np.int32), w)
except TypeError as exc:
    print(exc)
else:
    raise AssertionError("int32 input accepted")
