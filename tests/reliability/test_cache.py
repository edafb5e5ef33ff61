"""Kernel compilation: once per signature per process, an on-disk PTX cache that
survives a restart, and compile failures that raise instead of hanging.

Compiling needs numba without its CUDA simulator, which the rest of the CPU
suite has already imported; each scenario therefore runs in a fresh Python
process (``NUMBA_ENABLE_CUDASIM`` unset, ``WTCONV_CUDA_CACHE`` pointing at a
temporary folder) that prints one JSON line. Compiling to PTX needs no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("numba.cuda")

REPO = Path(__file__).resolve().parents[2]

#: Counts compile_ptx calls, then runs the scenario's body; prints a JSON dict.
PRELUDE = textwrap.dedent("""
    import json, sys, time
    from wtconv_cuda.kernels import codegen, compiler
    from wtconv_cuda.kernels.codegen import FinalizeSpec, PlaneSpec

    calls = []
    _compile = compiler.compile_ptx

    def counting(spec, cc=(9, 0)):
        calls.append(repr(spec))
        return _compile(spec, cc)

    compiler.compile_ptx = counting
    out = {}
""")


def run_scenario(cache: Path, body: str, timeout: float = 240) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["WTCONV_CUDA_CACHE"] = str(cache)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cache_files(cache: Path) -> dict:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(cache.iterdir())}


SMALL = "FinalizeSpec(1, 'float32')"
SMALL_PLANE = "PlaneSpec(1, 'float32', threads=32, strip=1)"


def test_compiles_once_and_the_disk_cache_survives_a_restart(tmp_path):
    cache = tmp_path / "cache"
    first = run_scenario(cache, f"""
        spec = {SMALL}
        path1, entry1 = compiler.cached_ptx(spec, (9, 0))
        path2, entry2 = compiler.cached_ptx(spec, (9, 0))
        out.update(calls=calls, same_path=path1 == path2, same_entry=entry1 == entry2,
                   path=str(path1), entry=entry1)
    """)
    assert len(first["calls"]) == 1, first["calls"]  # the second call compiled nothing
    assert first["same_path"] and first["same_entry"]
    files = cache_files(cache)
    assert sorted(files) == sorted([Path(first["path"]).name,
                                    Path(first["path"]).with_suffix(".entry").name])
    assert b".entry" in files[Path(first["path"]).name][1]
    assert not list(cache.glob("*.tmp")), "temporary files left behind"

    # A new process (a restart) finds the file and compiles nothing; nothing is rewritten.
    time.sleep(0.01)
    second = run_scenario(cache, f"""
        path, entry = compiler.cached_ptx({SMALL}, (9, 0))
        out.update(calls=calls, path=str(path), entry=entry)
    """)
    assert second["calls"] == []
    assert second["path"] == first["path"] and second["entry"] == first["entry"]
    assert cache_files(cache) == files


def test_cache_key_separates_signatures(tmp_path):
    """Different kernel variants, architectures and storages get their own files; the same
    variant asked for again (in any order) compiles once."""
    cache = tmp_path / "cache"
    out = run_scenario(cache, f"""
        specs = [{SMALL}, FinalizeSpec(1, 'float16'), {SMALL}, {SMALL_PLANE}, {SMALL_PLANE}]
        paths = [str(compiler.cached_ptx(s, (9, 0))[0]) for s in specs]
        paths.append(str(compiler.cached_ptx({SMALL}, (8, 0))[0]))
        out.update(calls=calls, paths=paths)
    """)
    paths = out["paths"]
    assert len(out["calls"]) == 4, out["calls"]  # fp32, fp16, plane at sm_90; fp32 at sm_80
    assert paths[0] == paths[2] and paths[3] == paths[4]
    assert len(set(paths)) == 4
    assert len(list(cache.glob("*.ptx"))) == 4


def test_sim_kernels_are_built_once_per_spec():
    """In this (simulator) process: one dispatcher per spec, reused by every launch."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        pytest.skip("needs numba's CUDA simulator")
    from wtconv_cuda.kernels import compiler
    from wtconv_cuda.kernels.codegen import FinalizeSpec

    spec = FinalizeSpec(3, "float32", threads=64)
    first = compiler.sim_kernel(spec)
    count = len(compiler._loaded)
    assert compiler.sim_kernel(spec) is first
    assert compiler.sim_kernel(FinalizeSpec(3, "float32", threads=64)) is first
    assert len(compiler._loaded) == count


def test_compile_failure_raises_compile_error_quickly(tmp_path):
    """A variant whose generated code does not type-check raises CompileError naming the
    variant and the architecture, instead of hanging, and leaves no cache entry."""
    cache = tmp_path / "cache"
    # a hang fails the test through the scenario's subprocess timeout
    out = run_scenario(cache, """
        def broken(spec):
            return ("def wtconv_finalize(part, w0, b0, s0, ww, ws, gw0, gb0, gs0, gww, gws, "
                    "dims):\\n    gw0[0] = part[0] + undefined_name\\n")

        codegen.finalize_kernel_source = broken
        spec = FinalizeSpec(3, 'float32')
        try:
            compiler.cached_ptx(spec, (9, 0))
        except compiler.CompileError as exc:
            out.update(error=type(exc).__name__, message=str(exc),
                       is_runtime_error=isinstance(exc, RuntimeError))
        import os
        out["files"] = os.listdir(compiler.cache_dir())
    """, timeout=120)
    assert out.get("error") == "CompileError", out
    assert out["is_runtime_error"]
    assert "FinalizeSpec(kernel_size=3, storage='float32'" in out["message"]
    assert "sm_90" in out["message"] and "undefined_name" in out["message"]
    assert out["files"] == []


def test_bad_specs_are_rejected_before_compiling(tmp_path):
    out = run_scenario(tmp_path / "cache", """
        results = {}
        for label, spec in [("unknown", ("not", "a", "spec")), ("none", None),
                            ("even-K", PlaneSpec(4, 'float32')),
                            ("storage", PlaneSpec(3, 'float64')),
                            ("finalize-storage", FinalizeSpec(3, 'int8'))]:
            try:
                compiler.compile_ptx(spec)
                results[label] = None
            except Exception as exc:
                results[label] = [type(exc).__name__, str(exc)]
        out.update(results=results, calls=len(calls))
    """, timeout=120)
    results = out["results"]
    assert results["unknown"][0] == "TypeError" and "unknown kernel spec" in results["unknown"][1]
    assert results["none"][0] == "TypeError"
    assert results["even-K"] == ["ValueError", "kernel_size must be odd and >= 1, got 4"]
    assert results["storage"][0] == "ValueError" and "float64" in results["storage"][1]
    assert results["finalize-storage"] is not None, "an unsupported finalize storage compiled"
