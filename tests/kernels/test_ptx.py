"""Every code path of the generated kernels compiles to PTX for Hopper.

The simulator does not type-check; compiling with ``numba.cuda.compile_ptx``
does. numba takes 10-240 s per variant, so the variants below are chosen to
reach every code path once rather than every combination: each storage type
forward and backward, the input and output stride paths (1, 2 and the
generic one), shared memory and global scratch, block and warp (``syncwarp``)
barriers (one and two planes per warp), the tiled passes, the split passes'
pre- and post-passes, the register kernel, fused finalize, the weights-only
backward, the lane kernels, more tap rows than threads and a large kernel. The simulator suite
runs each of these paths on data.

The compile runs in a subprocess (the rest of the CPU suite imports numba in
simulator mode, which cannot compile), started in the background when
collection ends (``conftest.py``).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("numba.cuda")

SPECS = textwrap.dedent("""
    from wtconv_cuda.kernels.codegen import FinalizeSpec, PlaneSpec
    from wtconv_cuda.kernels.coarse import CoarseOutSpec, CoarseSpec, PartialSumSpec
    from wtconv_cuda.kernels.flip import FlipSpec
    from wtconv_cuda.kernels.lanes import LaneForwardSpec, LaneSpec
    from wtconv_cuda.kernels.registers import RegisterSpec
    from wtconv_cuda.kernels.tiles import TileSpec
    # The plane kernel's stride paths: (in, out) = (1, 1), (1, 2) and the generic (1, 3)
    # forward, (1, 1) and (2, 1) backward; each storage forward and backward; global
    # scratch (it differs from shared memory in addressing only) forward and backward.
    specs = [PlaneSpec(3, "float32", 1, 1, False, False, 32, 2, 128, 8, False),
             PlaneSpec(3, "float32", 1, 2, False, False, 32, 2, 128, 8, False),
             PlaneSpec(3, "float16", 1, 3, False, False, 32, 2, 128, 8, False),
             PlaneSpec(3, "bfloat16", 1, 2, False, True, 32, 2, 128, 8, True),
             PlaneSpec(3, "float32", 1, 1, True, False, 32, 2, 128, 8, False),
             PlaneSpec(3, "float32", 2, 1, True, True, 32, 2, 128, 8, True),
             PlaneSpec(3, "float16", 2, 1, True, False, 32, 2, 128, 8, False)]
    # Launch shapes: two 128-thread planes a block (block barriers, strips of 4 rows),
    # two 16-thread planes a warp (warp barriers), 32-thread planes without a cap.
    specs += [PlaneSpec(1, "float32", 1, 1, False, False, 128, 4, 0, 2, False),
              PlaneSpec(1, "float32", 1, 1, True, False, 16, 1, 0, 16, True),
              PlaneSpec(5, "float32", 1, 1, False, False, 32, 1, 0, 8, False)]
    specs += [FinalizeSpec(k, storage) for k, storage in
              zip((1, 3, 5, 7), ("float32", "bfloat16", "float16", "float32"))]
    # Tiles: levels 0 to 3, strips of 4 and 2 rows and single items, the backward.
    specs += [TileSpec(5, "bfloat16", 3, 64, 128, 4, 128), TileSpec(5, "float16", 0, 64, 128),
              TileSpec(3, "float32", 2, 16, 64, 1, 0),
              TileSpec(3, "bfloat16", 2, 16, 64, 2, 128, backward=True)]
    # Split passes: the pre-pass (every storage, one and two pooled arrays, splits 1 to
    # 3), a backward tile fed by it and the gradients' store.
    specs += [CoarseSpec("float32", 3, height=5, width=9),
              CoarseSpec("bfloat16", 2, 2, height=7, width=7),
              CoarseSpec("float16", 1, height=11, width=10),
              TileSpec(3, "float16", 1, 32, 128, 2, 128, backward=True, coarse=True)]
    specs += [CoarseOutSpec(storage) for storage in ("float32", "float16", "bfloat16")]
    specs += [PartialSumSpec()]  # a split backward's batch chunks: their partials' sums
    # The tiles of two ConvNeXt-T stages, plane size compile-time: the 28 x 28 split
    # (32-pixel tiles of 32 threads, fed by the pre-pass), the 56 x 56 inner levels.
    specs += [TileSpec(5, "float32", 2, 32, 32, 4, 128, coarse=True, height=28, width=28),
              TileSpec(5, "float32", 2, 56, 128, 7, 128, inner_levels=3, height=56, width=56)]
    # ... the 28 x 28 split's tile with four planes of a channel a block (TileSpec.planes).
    specs += [TileSpec(5, "bfloat16", 2, 32, 32, 4, 128, coarse=True, height=28, width=28,
                       planes=4)]
    # A backward block that writes the gradients itself (fused finalize), from scratch.
    specs += [PlaneSpec(5, "bfloat16", 1, 1, True, True, 128, 1, 128, 1, False, True)]
    # The register kernel: the ConvNeXt-T 7 x 7 stage's default (no spills at its cap),
    # bfloat16 at stride 2 on an odd plane, float16 without levels; a small backward.
    specs += [RegisterSpec(5, "float32", 7, 7, 2, max_registers=168),
              RegisterSpec(3, "bfloat16", 5, 6, 3, 2), RegisterSpec(1, "float16", 3, 1, 0),
              RegisterSpec(3, "bfloat16", 3, 4, 1, 2, 64, 255, backward=True)]
    # The stride-1 backward: the weight gradients alone with the plane's level table
    # compiled in (the ConvNeXt-T 56 x 56 launch in shared memory, a fused 14 x 14 one
    # in scratch, a 16-bit 28 x 28 one), and the filters flipped for dx.
    specs += [PlaneSpec(5, "float32", 1, 1, True, False, 128, 4, 128, 1, False, False,
                        weights_only=True, plane=(56, 56, 5)),
              PlaneSpec(5, "bfloat16", 1, 1, True, True, 32, 1, 128, 8, True, True,
                        weights_only=True, plane=(14, 14, 3)),
              PlaneSpec(5, "float16", 1, 1, True, False, 64, 2, 128, 2, False, False,
                        weights_only=True, plane=(28, 28, 4))]
    # ... and on register blocks (PlaneSpec.blocked): an odd fp32 plane with padded grids
    # (K 3, four levels; the 56 x 56 launch took numba 136 s here, this one 56 s) and a
    # 16-bit 28 x 28 launch.
    specs += [PlaneSpec(3, "float32", 1, 1, True, False, 64, 2, 128, 2, False, False,
                        weights_only=True, plane=(27, 31, 4), blocked=True),
              PlaneSpec(5, "float16", 1, 1, True, False, 64, 2, 128, 2, False, False,
                        weights_only=True, plane=(28, 28, 4), blocked=True)]
    specs += [FlipSpec(storage, k) for k in (1, 5) for storage in ("float32", "float16",
                                                                   "bfloat16")]
    # The lane kernels (weight gradients and forward, a plane to one, two or four threads): odd
    # planes whose grids need the padded row and column, 16-bit storage, a small tap batch,
    # four levels (numba's control-flow walk once overflowed Python's stack there), blocks of
    # two groups of planes.
    specs += [LaneSpec(3, "bfloat16", 9, 6, 4, 2, tap_batch=20),
              LaneSpec(3, "float16", 5, 7, 1, 1, groups=2),
              LaneForwardSpec(3, "bfloat16", 9, 6, 2, 2), LaneForwardSpec(3, "float16", 5, 7, 1, 1),
              LaneForwardSpec(3, "float32", 7, 5, 2, 4)]
    # More tap rows than threads (K 5 on 4-thread planes): the correlation items as
    # loops, code both backward kernels share. A large kernel (K 15) forward.
    specs += [PlaneSpec(5, "float32", 1, 1, True, False, 4, 1, 0, 8, True, False, True),
              PlaneSpec(15, "float32", 1, 1, False, False, 32, 1, 0, 8)]
""")


def allowed_local_bytes(spec) -> int:
    """Local memory per thread that ptxas 13.5 (nvJitLink) is known to leave in ``spec``.

    None in the tiled kernels, the finalize kernel and the plane kernel's forward in
    shared memory. The plane kernel's backward at the 128-register cap spills 8-64 B at
    K 5 (the ConvNeXt-T stages' defaults among them; the H200 driver's own compiler
    reported no local memory for them in an earlier session), and the global-scratch
    variants 8-392 B. The register-blocked weights-only variants (``blocked``) keep
    none: a spill there would sit in their multiply-add blocks. A variant beyond these
    bounds fails the test.
    """
    from wtconv_cuda.kernels.codegen import PlaneSpec
    if isinstance(spec, PlaneSpec) and spec.blocked:
        return 0
    if isinstance(spec, PlaneSpec) and spec.scratch:
        return 512
    if isinstance(spec, PlaneSpec) and spec.backward and spec.max_registers:
        return 64
    return 0


def local_memory_over_bounds(usage: dict) -> dict:
    """``{repr: local bytes}`` of the variants in ``usage`` (as the subprocess writes it)
    that keep more local memory than :func:`allowed_local_bytes`."""
    from wtconv_cuda.kernels.compiler import spec_from_repr
    return {name: local for name, (_, local, _) in usage.items()
            if local > allowed_local_bytes(spec_from_repr(name))}


def test_local_memory_bounds():
    from wtconv_cuda.kernels.codegen import PlaneSpec
    from wtconv_cuda.kernels.tiles import TileSpec
    tile = repr(TileSpec(5, "float32", 1, 64, 128, 4, 128))
    capped = repr(PlaneSpec(5, "float32", 1, 1, True, False, 16, 1, 128, 16, True, True))
    blocked = repr(PlaneSpec(5, "float32", 1, 1, True, False, 128, 4, 128, 1, False, False,
                             weights_only=True, plane=(56, 56, 5), blocked=True))
    usage = {tile: [95, 0, False], capped: [128, 48, False], blocked: [128, 0, False]}
    assert local_memory_over_bounds(usage) == {}
    usage[tile] = [128, 8, False]
    usage[capped] = [128, 96, False]
    usage[blocked] = [128, 8, False]
    assert local_memory_over_bounds(usage) == {tile: 8, capped: 96, blocked: 8}


@pytest.mark.ptx_background
def test_every_code_path_compiles_without_local_arrays(ptx_background):
    """No local arrays and no float64 arithmetic in the PTX, and ptxas (through
    nvJitLink) leaves no more local memory than :func:`allowed_local_bytes` in any
    variant."""
    count = ptx_background.wait(timeout=2400)
    usage_file = ptx_background.usage_file
    ptx_files = sorted(ptx_background.cache.glob("*.ptx"))
    assert len(ptx_files) == count >= 40
    for path in ptx_files:
        text = path.read_text()
        assert ".entry" in text
        assert "__local_depot" not in text, f"{path.name} keeps an array in local memory"
        # a Python float constant in generated code makes its arithmetic float64
        assert ".f64" not in text, f"{path.name} computes in float64"
    if not usage_file.exists():
        pytest.skip("nvJitLink is not installed: PTX checked, ptxas not run")
    usage = json.loads(usage_file.read_text())
    assert len(usage) == count
    over = local_memory_over_bounds(usage)
    assert not over, f"variants with more local memory than allowed (bytes per thread): {over}"
    assert all(regs > 0 for regs, _, _ in usage.values())


def test_corrupted_cache_entry_is_compiled_again(tmp_path):
    """A cached PTX file that no longer declares its entry is rebuilt, not handed to the
    driver."""
    code = textwrap.dedent("""
        from wtconv_cuda.kernels.codegen import FinalizeSpec
        from wtconv_cuda.kernels.compiler import cached_ptx
        spec = FinalizeSpec(1, "float32")
        path, entry = cached_ptx(spec, (9, 0))
        path.write_text("this is not PTX\\n")
        again, entry_again = cached_ptx(spec, (9, 0))  # (numba numbers each compile: new name)
        assert again == path
        assert f".entry {entry_again}" in path.read_text()
        print("healed")
    """)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["WTCONV_CUDA_CACHE"] = str(tmp_path)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get(
        "PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("healed")
