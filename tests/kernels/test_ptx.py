"""Every code path of the generated kernels compiles to PTX for Hopper.

The simulator does not type-check; compiling with ``numba.cuda.compile_ptx``
does. The variants below cover every storage type, direction, input and
output stride path (1, 2 and the generic one), shared memory and global
scratch, the tiled forward, the split passes' pre- and post-passes, the
register kernel, block and warp (``syncwarp``) barriers (one and two planes
per warp), several kernel sizes and launch shapes. This runs in a subprocess
because the rest of the CPU suite imports numba in simulator mode, which
cannot compile.
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
    from wtconv_cuda.kernels.codegen import STORAGE, FinalizeSpec, PlaneSpec
    paths = [(1, 1, False), (1, 2, False), (1, 3, False), (1, 1, True), (2, 1, True)]
    # (global scratch differs from shared memory in addressing, not in the storage type:
    # two storages take that path)
    specs = [PlaneSpec(3, storage, i, o, bwd, scratch, 32, 2, 128, 8, scratch)
             for storage in STORAGE for (i, o, bwd) in paths for scratch in (False, True)
             if not (scratch and storage == "float16")]
    specs += [PlaneSpec(k, "float32", 1, 1, bwd, False, threads, strip, 0, group, sync)
              for k in (1, 5) for bwd in (False, True)
              for (threads, strip, group, sync) in ((128, 4, 2, False), (32, 1, 8, False),
                                                    (16, 1, 16, True))]
    specs += [FinalizeSpec(k, storage) for k in (1, 3, 5, 7) for storage in STORAGE]
    # Tiled kernels: every storage, L = 0, strips of 8, 4 and 1 rows and single items, the
    # backward (its correlations and partials) in float32 and bfloat16.
    from wtconv_cuda.kernels.tiles import TileSpec
    specs += [TileSpec(5, "bfloat16", 3, 64, 128, 4, 128), TileSpec(5, "float16", 0, 64, 128),
              TileSpec(3, "float32", 2, 16, 64, 1, 0),
              TileSpec(3, "bfloat16", 2, 16, 64, 2, 128, backward=True),
              TileSpec(5, "float32", 1, 64, 256, 4, 128, backward=True)]
    # Split passes: the pre-pass (every storage, one and two pooled arrays, splits 1 to
    # 3), tiles fed by it (forward and backward) and the gradients' store.
    from wtconv_cuda.kernels.coarse import CoarseOutSpec, CoarseSpec
    specs += [CoarseSpec("float32", 3, height=5, width=9),
              CoarseSpec("bfloat16", 2, 2, height=7, width=7),
              CoarseSpec("float16", 1, height=11, width=10),
              TileSpec(5, "bfloat16", 2, 32, 128, 4, 128, coarse=True),
              TileSpec(3, "float16", 1, 32, 128, 2, 128, backward=True, coarse=True)]
    specs += [CoarseOutSpec(storage) for storage in STORAGE]
    # Backward blocks that write the gradients themselves (fused finalize).
    specs += [PlaneSpec(5, storage, 1, 1, True, scratch, threads, 1, 128, group, sync, True)
              for storage in ("float32", "bfloat16") for scratch in (False, True)
              for (threads, group, sync) in ((16, 16, True), (128, 1, False))]
    # The register kernel: the ConvNeXt-T 7 x 7 stage's default (no spills at its cap),
    # bfloat16 at stride 2 on an odd plane, float16 without levels; a small backward.
    from wtconv_cuda.kernels.registers import RegisterSpec
    specs += [RegisterSpec(5, "float32", 7, 7, 2, max_registers=168),
              RegisterSpec(3, "bfloat16", 5, 6, 3, 2), RegisterSpec(1, "float16", 3, 1, 0),
              RegisterSpec(3, "bfloat16", 3, 4, 1, 2, 64, 255, backward=True)]
    # The tiles of the ConvNeXt-T stages, one per plane with its size compile-time: the
    # 28 x 28 split (32-pixel tiles of 32 threads), the 56 x 56 inner levels (strips of 7),
    # a 16-bit 14 x 14 split; and a 32-pixel tile of 64 threads with run-time sizes.
    specs += [TileSpec(5, "float32", 2, 32, 32, 4, 128, coarse=True, height=28, width=28),
              TileSpec(5, "float32", 2, 56, 128, 7, 128, inner_levels=3, height=56, width=56),
              TileSpec(5, "bfloat16", 1, 16, 32, 2, 128, coarse=True, height=14, width=13),
              TileSpec(5, "float32", 2, 32, 64, 4, 128, coarse=True)]
    # The stride-1 backward: the weight gradients alone with the plane's level table
    # compiled in (the ConvNeXt-T 56 x 56 and 14 x 14 launch shapes, shared memory and
    # scratch; the 28 x 28 one), and the filters flipped for dx.
    specs += [PlaneSpec(5, storage, 1, 1, True, scratch, threads, strip, 128, group, sync,
                        fused, weights_only=True, plane=plane)
              for storage in STORAGE for scratch in (False, True)
              for (threads, strip, group, sync, fused, plane) in (
                  (128, 4, 1, False, False, (56, 56, 5)), (32, 1, 8, True, True, (14, 14, 3)))
              if not (scratch and storage == "float16")]
    specs += [PlaneSpec(5, "float32", 1, 1, True, False, 64, 2, 128, 2, False, False,
                        weights_only=True, plane=(28, 28, 4))]
    from wtconv_cuda.kernels.flip import FlipSpec
    specs += [FlipSpec(storage, k) for k in (1, 5) for storage in STORAGE]
    # More tap rows than threads per plane: the correlation items as loops (the code
    # both backward kernels share; the one-kernel K 17 variant spills 24 B uncapped).
    specs += [PlaneSpec(17, "float32", 1, 1, True, False, 16, 1, 0, 16, True, False, True)]
""")


def compile_in_subprocess(cache: Path, specs_code: str, usage_file: Path | None = None) -> int:
    """Compile the ``specs`` that ``specs_code`` defines into ``cache``; return their count.

    With ``usage_file``, also write ptxas's report of each (``{repr(spec): [registers,
    local bytes, global scratch]}``, JSON) there, or nothing if nvJitLink is missing.
    """
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["WTCONV_CUDA_CACHE"] = str(cache)
    code = specs_code + textwrap.dedent("""
        from wtconv_cuda.kernels.warmup import compile_all
        compile_all(specs, (9, 0), 2)
    """)
    if usage_file is not None:
        code += textwrap.dedent(f"""
            import json
            try:
                from wtconv_cuda.kernels.ptxas import report
                usage = report(specs)
            except ImportError:
                usage = None
            if usage is not None:
                with open({str(usage_file)!r}, "w") as handle:
                    json.dump({{repr(s): [usage[repr(s)].registers, usage[repr(s)].local_bytes,
                                         bool(getattr(s, "scratch", False))] for s in specs}},
                              handle)
        """)
    code += "print(len(specs))\n"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return int(proc.stdout.split()[-1])


def allowed_local_bytes(spec) -> int:
    """Local memory per thread that ptxas 13.5 (nvJitLink) is known to leave in ``spec``.

    None in the tiled kernels, the finalize kernel and the plane kernel's forward in
    shared memory. The plane kernel's backward at the 128-register cap spills 8-64 B at
    K 5 (the ConvNeXt-T stages' defaults among them; the H200 driver's own compiler
    reported no local memory for them in an earlier session), and the global-scratch
    variants 8-392 B. A variant beyond these bounds fails the test.
    """
    from wtconv_cuda.kernels.codegen import PlaneSpec
    if isinstance(spec, PlaneSpec) and spec.scratch:
        return 512
    if isinstance(spec, PlaneSpec) and spec.backward and spec.max_registers:
        return 64
    return 0


def spec_from_repr(text: str):
    """The kernel spec whose ``repr`` is ``text``."""
    from wtconv_cuda.kernels.codegen import FinalizeSpec, PlaneSpec
    from wtconv_cuda.kernels.coarse import CoarseOutSpec, CoarseSpec
    from wtconv_cuda.kernels.registers import RegisterSpec
    from wtconv_cuda.kernels.tiles import TileSpec
    from wtconv_cuda.kernels.flip import FlipSpec
    return eval(text, {"FinalizeSpec": FinalizeSpec, "PlaneSpec": PlaneSpec,
                       "TileSpec": TileSpec, "CoarseSpec": CoarseSpec, "FlipSpec": FlipSpec,
                       "CoarseOutSpec": CoarseOutSpec, "RegisterSpec": RegisterSpec})


def local_memory_over_bounds(usage: dict) -> dict:
    """``{repr: local bytes}`` of the variants in ``usage`` (as the subprocess writes it)
    that keep more local memory than :func:`allowed_local_bytes`."""
    return {name: local for name, (_, local, _) in usage.items()
            if local > allowed_local_bytes(spec_from_repr(name))}


def test_local_memory_bounds():
    from wtconv_cuda.kernels.codegen import PlaneSpec
    from wtconv_cuda.kernels.tiles import TileSpec
    tile = repr(TileSpec(5, "float32", 1, 64, 128, 4, 128))
    capped = repr(PlaneSpec(5, "float32", 1, 1, True, False, 16, 1, 128, 16, True, True))
    usage = {tile: [95, 0, False], capped: [128, 48, False]}
    assert local_memory_over_bounds(usage) == {}
    usage[tile] = [128, 8, False]
    usage[capped] = [128, 96, False]
    assert local_memory_over_bounds(usage) == {tile: 8, capped: 96}


def test_every_code_path_compiles_without_local_arrays(tmp_path):
    """No local arrays in the PTX, and ptxas (through nvJitLink) leaves no more local
    memory than :func:`allowed_local_bytes` in any variant."""
    usage_file = tmp_path / "usage.json"
    count = compile_in_subprocess(tmp_path / "cache", SPECS, usage_file)
    ptx_files = sorted((tmp_path / "cache").glob("*.ptx"))
    assert len(ptx_files) == count >= 50
    for path in ptx_files:
        text = path.read_text()
        assert ".entry" in text
        assert "__local_depot" not in text, f"{path.name} keeps an array in local memory"
    if not usage_file.exists():
        pytest.skip("nvJitLink is not installed: PTX checked, ptxas not run")
    usage = json.loads(usage_file.read_text())
    assert len(usage) == count
    over = local_memory_over_bounds(usage)
    assert not over, f"variants with more local memory than allowed (bytes per thread): {over}"
    assert all(regs > 0 for regs, _, _ in usage.values())


def test_large_kernel_compiles(tmp_path):
    code = textwrap.dedent("""
        from wtconv_cuda.kernels.codegen import PlaneSpec
        specs = [PlaneSpec(15, "float32", 1, 1, bwd, False, 32, 1, 0, 8) for bwd in (False, True)]
    """)
    assert compile_in_subprocess(tmp_path, code) == len(list(tmp_path.glob("*.ptx"))) == 2


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
