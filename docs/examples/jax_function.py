# docs-example: not-executed (needs JAX with CUDA)

import jax
import jax.numpy as jnp

import wtconv_cuda as wt
from wtconv_cuda.bindings.jax import wtconv2d

# WTConvWeights is a NamedTuple, hence a pytree: map it onto the device.
w_host = wt.init_weights(channels=96, kernel_size=5, levels=3, seed=0)
w = jax.tree.map(jnp.asarray, w_host)
x = jax.random.normal(jax.random.key(0), (8, 96, 56, 56), jnp.float32)

y = wtconv2d(x, w, levels=3, stride=1)  # (8, 96, 56, 56)


def loss(x, w):
    return jnp.sum(wtconv2d(x, w, 3, 1) ** 2)


# The fused backward, through the binding's custom VJP.
dx, dw = jax.grad(loss, argnums=(0, 1))(x, w)
