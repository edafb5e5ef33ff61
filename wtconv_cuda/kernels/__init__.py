"""Fused Numba-CUDA kernels of the WTConv layer.

* :mod:`.layout` lays out one plane's on-chip working set;
* :mod:`.codegen` generates the kernels as unrolled scalar code;
* :mod:`.tiles` generates the tiled kernel that large planes take (forward;
  the backward variant on request);
* :mod:`.flip` turns the filters for a stride-1 backward's ``dx``, which runs
  on the forward kernels;
* :mod:`.compiler` compiles them to PTX (cached on disk) and loads them;
* :mod:`.launch` plans launches and issues them on a GPU (CuPy) or on the
  CUDA simulator;
* :mod:`.warmup` compiles kernel variants ahead of use into the on-disk cache
  (``python -m wtconv_cuda.kernels.warmup``).

``_numba_compat`` is internal: every module imports numba-cuda through it, so
that a NumPy shim is in place before numba-cuda loads.
"""
