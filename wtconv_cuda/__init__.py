"""wtconv_cuda: exact wavelet convolutions (WTConv, ECCV 2024) for GPUs.

The operator is specified in SPEC.md. :func:`forward` and :func:`backward`
accept NumPy arrays (computed on the CPU by the float64 oracle in
:mod:`wtconv_cuda.reference`) and CuPy arrays (computed by the GPU kernels).
Importing this package imports neither Numba nor CuPy.
"""

from . import reference
from .api import Saved, Tape, backward, forward
from .weights import (
    WTConvWeights,
    init_weights,
    weights_from_state_dict,
    weights_to_state_dict,
)

__version__ = "0.1.0"

__all__ = [
    "forward",
    "backward",
    "Tape",
    "Saved",
    "WTConvWeights",
    "init_weights",
    "weights_from_state_dict",
    "weights_to_state_dict",
    "reference",
    "__version__",
]
