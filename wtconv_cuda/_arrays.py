"""Identify the array library of an object, and the few namespace operations
that the weights conversion needs.

``reshape`` and indexing are methods on every supported array type, so only
``stack`` and ``asarray`` need a per-library namespace.

The library of an array is read from ``type(x).__module__``; NumPy, CuPy,
PyTorch and JAX are imported here only when an object of theirs is handled,
so importing :mod:`wtconv_cuda` stays light.
"""

from __future__ import annotations

import importlib

import numpy as np

__all__ = ["array_library", "stack", "asarray_like", "to_numpy"]

# Top-level module name of an array type -> library name.
_LIBRARY_OF_ROOT = {
    "numpy": "numpy",
    "cupy": "cupy",
    "torch": "torch",
    "jax": "jax",
    "jaxlib": "jax",
}

# Library name -> module providing stack / asarray in the NumPy style.
_NAMESPACE_MODULE = {"numpy": "numpy", "cupy": "cupy", "jax": "jax.numpy"}


def array_library(x) -> str | None:
    """Name the array library that ``x`` belongs to.

    Parameters
    ----------
    x : object
        Any object.

    Returns
    -------
    str or None
        One of ``"numpy"``, ``"cupy"``, ``"torch"``, ``"jax"``, or ``None``
        when ``x`` is not an array of a known library (lists, scalars, ...).
    """
    root = type(x).__module__.partition(".")[0]
    return _LIBRARY_OF_ROOT.get(root)


def _library_or_raise(like) -> str:
    library = array_library(like)
    if library is None:
        raise TypeError(f"expected a NumPy, CuPy, PyTorch or JAX array, got {type(like).__name__}")
    return library


def stack(arrays, like):
    """Stack arrays along a new leading axis, in the library of ``like``.

    Parameters
    ----------
    arrays : sequence of arrays
        Arrays of equal shape ``S``, all of the library of ``like``.
    like : array
        An array of the target library.

    Returns
    -------
    array
        Shape ``(len(arrays), *S)``, same library as ``like``.
    """
    library = _library_or_raise(like)
    if library == "torch":
        import torch

        return torch.stack(list(arrays), 0)
    return importlib.import_module(_NAMESPACE_MODULE[library]).stack(list(arrays), axis=0)


def asarray_like(values: np.ndarray, like):
    """Copy host values into a new array with the library, dtype and device of ``like``.

    Parameters
    ----------
    values : numpy.ndarray
        Host values of any shape (e.g. the fixed Haar filters).
    like : array
        An array of the target library; its dtype (and device) are used.

    Returns
    -------
    array
        A new array of ``values.shape`` holding ``values`` cast to ``like.dtype``.
    """
    library = _library_or_raise(like)
    if library == "torch":
        import torch

        return torch.as_tensor(values, device=like.device).to(like.dtype)
    if library == "cupy":
        import cupy

        with like.device:
            return cupy.asarray(values, dtype=like.dtype)
    xp = importlib.import_module(_NAMESPACE_MODULE[library])
    return xp.asarray(values, dtype=like.dtype)


def to_numpy(x) -> np.ndarray:
    """Copy (or view) an array of any supported library into host memory.

    Parameters
    ----------
    x : array
        NumPy, CuPy, PyTorch (any device, any float dtype) or JAX array.

    Returns
    -------
    numpy.ndarray
        The values of ``x``; reduced-precision types without a NumPy
        equivalent (``torch.bfloat16``) are widened to float32.
    """
    library = _library_or_raise(x)
    if library == "cupy":
        return x.get()
    if library == "torch":
        import torch

        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()
    return np.asarray(x)
