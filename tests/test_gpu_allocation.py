"""The GPU path's weight-gradient arrays (NumPy stands in for CuPy)."""

from types import SimpleNamespace

import numpy as np
import pytest

from wtconv_cuda import gpu, init_weights


class _Pointer(SimpleNamespace):
    """A stand-in for ``cupy.cuda.MemoryPointer``: a byte buffer and an offset."""

    def __add__(self, offset):
        return _Pointer(buffer=self.buffer, offset=self.offset + offset)


def _fake_cupy(allocations):
    """``cuda.alloc`` and ``ndarray(shape, dtype, memptr)`` on NumPy, counting allocations."""
    def alloc(nbytes):
        allocations.append(nbytes)
        return _Pointer(buffer=np.zeros(nbytes, np.uint8), offset=0)

    def ndarray(shape, dtype, memptr):
        return np.ndarray(shape, dtype, buffer=memptr.buffer, offset=memptr.offset)

    return SimpleNamespace(cuda=SimpleNamespace(alloc=alloc), ndarray=ndarray)

DTYPES = [np.float32, np.float16, pytest.param("bfloat16", id="bfloat16")]


def _dtype(name):
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels, kernel_size, levels", [(3, 5, 2), (96, 7, 0), (1, 1, 4)])
def test_gradient_arrays_have_the_weights_layouts_on_one_allocation(channels, kernel_size,
                                                                       levels, dtype, bias):
    dtype = _dtype(dtype)
    w = init_weights(channels, kernel_size, levels, seed=0, dtype=np.float32)
    if not bias:
        w = w._replace(base_bias=None)
    allocations = []
    grads = gpu.gradient_arrays(w, dtype, _fake_cupy(allocations))

    assert (grads.base_bias is None) == (not bias)
    present = [(g, a) for g, a in zip(grads, w) if a is not None]
    for g, a in present:
        assert g.shape == a.shape and g.dtype == dtype and g.flags.c_contiguous
    for i, (g, _) in enumerate(present):
        for h, _ in present[i + 1:]:
            assert not np.shares_memory(g, h)

    # every element belongs to one gradient: writing each leaves the others alone
    for i, (g, _) in enumerate(present):
        g[...] = i + 1
    for i, (g, _) in enumerate(present):
        assert (g.astype(np.float32) == i + 1).all()

    # one allocation, each gradient at an aligned offset inside it
    assert len(allocations) == 1
    base = present[0][0].__array_interface__["data"][0]
    for g, _ in present:
        start = g.__array_interface__["data"][0] - base
        assert start % gpu.GRADIENT_ALIGN == 0
        assert start + g.nbytes <= allocations[0]
