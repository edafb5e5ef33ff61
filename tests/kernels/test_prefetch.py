"""The forward tiles' L2 prefetch (``TileSpec.prefetch``): the planner's choice and the
kernels, which must give the same bits with or without it.

The planner runs anywhere; the kernels run in numba's CUDA simulator, where an
address outside ``x`` raises and the store that keeps the prefetched element
(never meant to run) would overwrite a poisoned output's first pixel.
"""

import os

import numpy as np
import pytest

from wtconv_cuda import reference
from wtconv_cuda.kernels import launch
from wtconv_cuda.kernels.launch import (
    Problem, Tuning, plan_split, plan_tiles, prefetch_planes, run_forward,
)
from wtconv_cuda.kernels.tiles import TileSpec, tile_kernel_source

from ._backends import RecordingBackend
from ._oracle import random_layer

simulator = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                               reason="needs numba's CUDA simulator")

#: Dynamic shared memory of an H200 block, as the planner sees it.
H200_SHARED = 227 * 1024


@pytest.mark.parametrize("h,storage,want", [
    (56, "float32", 256),     # 12,544-byte planes: 334 within 4 MiB
    (28, "float32", 1024),    # 3,136 bytes: 1,337
    (14, "float32", 4096),    # 784 bytes: 5,349
    (56, "bfloat16", 512),
    (2048, "float32", 1),     # a plane larger than the prefetch distance
])
def test_prefetch_planes(h, storage, want):
    assert prefetch_planes(Problem(64, 96, h, h, 5, 3, 1, storage, False)) == want


def test_planner_prefetches_one_tile_per_plane_forwards():
    """The ConvNeXt-T stages' forward tiles (one per plane) prefetch; tiles that share a
    plane, the backward and Tuning(prefetch=0) do not."""
    stage56 = Problem(64, 96, 56, 56, 5, 5, 1, "float32", False)
    assert plan_tiles(stage56, H200_SHARED).spec.prefetch == 256  # inner levels
    for h, levels, want in ((28, 4, 1024), (14, 3, 4096)):
        problem = Problem(64, 384 * 14 // h, h, h, 5, levels, 1, "float32", False)
        assert plan_split(problem, H200_SHARED).tiles.spec.prefetch == want
    assert plan_tiles(stage56, H200_SHARED, Tuning(prefetch=0)).spec.prefetch == 0
    assert plan_tiles(stage56, H200_SHARED, Tuning(prefetch=8)).spec.prefetch == 8
    paper = Problem(8, 64, 256, 256, 5, 3, 1, "float32", False)
    assert plan_tiles(paper, H200_SHARED).ntiles > 1
    assert plan_tiles(paper, H200_SHARED).spec.prefetch == 0
    tiled = Tuning(tiles=True, tile=64)
    assert plan_tiles(Problem(2, 3, 64, 64, 5, 2, 1, "float32", False), H200_SHARED,
                      tiled, backward=True).spec.prefetch == 0


def test_prefetch_needs_a_forward_tile():
    source = tile_kernel_source(TileSpec(3, "float32", 1, 8, 32, 2, prefetch=2))
    assert "ahead = plane + 2" in source and "if H < 0:" in source
    assert "ahead" not in tile_kernel_source(TileSpec(3, "float32", 1, 8, 32, 2))
    for spec in (TileSpec(3, "float32", 1, 8, 32, 2, backward=True, prefetch=2),
                 TileSpec(3, "float32", 1, 8, 32, 2, prefetch=-1)):
        with pytest.raises(ValueError, match="prefetch"):
            tile_kernel_source(spec)


@simulator
@pytest.mark.parametrize("storage", ["float32", "float16"])
def test_prefetch_gives_the_same_bits(rng, monkeypatch, storage):
    """Six planes of a split forward's one-tile-per-plane launch, prefetching 1 and 4
    planes on (the last planes' prefetch falls back to their own plane) and none: the
    oracle's output, and bit for bit the same."""
    monkeypatch.setattr(launch, "plan_registers", lambda *args, **kwargs: None)
    shape, levels, k = (2, 3, 13, 11), 2, 3
    dtype, tol = {"float32": (np.float32, 2e-6), "float16": (np.float16, 2e-3)}[storage]
    x, wts, weights, problem = random_layer(rng, shape, levels, k, 1, storage, True)
    backend = RecordingBackend()
    outputs = []
    for ahead in (1, 4, 0):
        tuning = Tuning(split=1, tile=16, threads=32, strip=2, prefetch=ahead)
        assert plan_split(problem, backend.shared_limit, tuning).tiles.spec.prefetch == ahead
        y = np.full(shape, np.nan, dtype)
        run_forward(backend, problem, x, y, weights, tuning)
        outputs.append(y)
    got = outputs[0].astype(np.float64)
    want = reference.forward(x, wts, levels, 1)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < tol
    for other in outputs[1:]:
        np.testing.assert_array_equal(outputs[0], other)
