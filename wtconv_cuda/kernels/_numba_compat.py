"""Import numba-cuda safely on every supported NumPy.

numba-cuda 0.30 refers to ``np.row_stack``, which NumPy 2.5 removed (it was an
alias of ``np.vstack`` since NumPy 1.0). Restoring the alias before numba-cuda
is imported lets the package run on the NumPy that ships with current CUDA
images instead of pinning an older NumPy.
"""

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402  (must follow the shim)

__all__ = ["cuda"]
