"""Framework bindings of the WTConv operator.

Import the one you need; this package itself imports no framework:

``wtconv_cuda.bindings.torch``
    ``WTConv2d`` (the published layer's constructor and state-dict names),
    the functional ``wtconv2d`` and the custom ops
    ``torch.ops.wtconv_cuda.wtconv2d_fwd`` / ``wtconv2d_bwd`` (autograd,
    ``torch.compile``, ``torch.export``, autocast, CUDA graphs).
``wtconv_cuda.bindings.jax``
    ``wtconv2d(x, w, levels, stride)`` with a ``custom_vjp``; eager and under
    ``jax.jit``.
``wtconv_cuda.bindings.cupy``
    The native CuPy path and ``forward_dlpack`` / ``backward_dlpack`` for any
    DLPack producer.

On a GPU every binding passes the caller's buffers to the fused kernels
without copies, allocates outputs with the caller's framework and queues the
kernels on the caller's stream without host synchronisation. On the CPU they
run the float64 oracle :mod:`wtconv_cuda.reference`.
"""
