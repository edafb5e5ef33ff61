"""Adapters of the framework-agnostic API to deep-learning frameworks.

Each framework (PyTorch autograd, JAX custom VJP, ...) gets its own module
here, importable as ``wtconv_cuda.bindings.<framework>``; they are added in a
later issue. This package itself imports nothing.
"""
