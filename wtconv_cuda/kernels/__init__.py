"""Fused Numba-CUDA kernels of the WTConv layer.

* :mod:`.layout` lays out one plane's on-chip working set;
* :mod:`.codegen` generates the kernels as unrolled scalar code;
* :mod:`.compiler` compiles them to PTX (cached on disk) and loads them;
* :mod:`.launch` plans launches and issues them on a GPU (CuPy) or on the
  CUDA simulator.
"""
