"""Every kernel variant the planner can pick compiles to PTX for Hopper.

The simulator does not type-check; compiling with ``numba.cuda.compile_ptx``
does. This runs in a subprocess because the rest of the CPU suite imports
numba in simulator mode, which cannot compile.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba.cuda")


def compile_variants(cache: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["WTCONV_CUDA_CACHE"] = str(cache)
    proc = subprocess.run(
        [sys.executable, "-m", "wtconv_cuda.kernels.warmup", "--cc", "9.0", "--jobs", "2", *args],
        env=env, capture_output=True, text=True, timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_every_variant_compiles_without_local_arrays(tmp_path):
    out = compile_variants(tmp_path, "--kernel-sizes", "1", "3", "5", "7",
                           "--storage", "float32", "float16", "bfloat16",
                           "--strides", "1", "2", "--planes", "9x7", "255x257")
    ptx_files = sorted(tmp_path.glob("*.ptx"))
    assert len(ptx_files) >= 100, out
    for path in ptx_files:
        text = path.read_text()
        assert ".entry" in text
        assert "__local_depot" not in text, f"{path.name} keeps an array in local memory"


def test_large_kernel_compiles(tmp_path):
    from wtconv_cuda.kernels.warmup import variants
    compile_variants(tmp_path, "--kernel-sizes", "15", "--storage", "float32",
                     "--strides", "1", "--planes", "9x7")
    expected = len(variants([15], ["float32"], [1], [(9, 7)]))
    assert expected >= 3  # forward, backward, finalize at least
    assert len(list(tmp_path.glob("*.ptx"))) == expected
