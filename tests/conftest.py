"""Shared fixtures and helpers of the CPU test suite."""

import os
import zlib

# Kernel tests run in numba's CUDA simulator unless the GPU suite is asked for.
# The variable must be set before numba is first imported.
if os.environ.get("WTCONV_TEST_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

# One CPU thread for torch's and BLAS's pools (read when they load): on CI's two
# cores the PTX tier's compile takes one (tests/kernels/conftest.py), and a second
# intra-op thread then only waits for it. The bench's CPU dry run took 88 s with the
# default pool beside that compile and 12.5 s with one thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest

from wtconv_cuda import WTConvWeights


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id, so each test is reproducible."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def random_weights(rng, channels, kernel_size, levels, bias=True, dtype=np.float64):
    """Weights whose every entry (scales included) is random and non-zero."""
    c, k = channels, kernel_size

    def draw(*shape):
        return rng.standard_normal(shape).astype(dtype)

    return WTConvWeights(
        base_weight=draw(c, k, k),
        base_bias=draw(c) if bias else None,
        base_scale=draw(c),
        wavelet_weight=draw(levels, c, 4, k, k),
        wavelet_scale=draw(levels, c, 4),
    )


def autocast_or_off(device_type, dtype):
    """``torch.autocast(device_type, dtype=dtype)``, or autocast switched off when
    ``dtype`` is None (so a test can run the same body both ways)."""
    import torch

    if dtype is None:
        return torch.autocast(device_type, enabled=False)
    return torch.autocast(device_type, dtype=dtype)
