"""CPU tests of ``benchmarks/sass_static.py``: opcode counting on hand-written SASS, and
the whole path (PTX, nvJitLink, nvdisasm) where the tools are installed."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import sass_static  # noqa: E402

SASS = """
        .text.wtconv_tile:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
.L_x_1:
        /*0020*/              @!P0 LDS R4, [R0+0x10] ;
        /*0030*/                   FFMA R2, R4, R4, R2 ;
        /*0040*/                   IMAD.MOV.U32 R3, RZ, RZ, R0 ;
        /*0050*/                   IMAD.SHL.U32 R5, R3, 0x4, RZ ;
        /*0060*/               @P1 BRA `(.L_x_1) ;
        /*0070*/                   EXIT ;
"""


def test_opcode_counts_drop_predicates_and_modifiers():
    counts = sass_static.opcode_counts(SASS)
    assert counts == {"LDC": 1, "S2R": 1, "LDS": 1, "FFMA": 1, "IMAD": 2, "BRA": 1, "EXIT": 1}


def test_row_sums_the_other_opcodes():
    row = sass_static._row("v", sass_static.opcode_counts(SASS))
    fields = row.split()
    assert fields[0] == "8" and fields[-1] == "v"
    assert int(fields[-2]) == 4  # LDC, S2R, BRA, EXIT


LOADS = """
        /*0000*/              @P0 LDG.E.U16 R4, desc[UR4][R2.64] ;
        /*0010*/              @P1 LDG.E.U16 R5, desc[UR4][R2.64+0x40] ;
        /*0020*/                   HADD2.F32 R6, -RZ, R4.H0_H0 ;
        /*0030*/                   LDG.E R7, desc[UR4][R8.64] ;
        /*0040*/                   STS [R0], R6 ;
        /*0050*/                   STS [R0+0x4], R5 ;
        /*0060*/                   FADD R9, R7, R7 ;
        /*0070*/                   LDG.E R10, desc[UR4][R8.64+0x4] ;
        /*0080*/                   EXIT ;
"""


def test_loads_in_flight_counts_the_loads_issued_before_each_first_use():
    # R4: R5 issues before HADD2 reads it; R5: R7 before its STS; R7: none; R10: never read
    assert sass_static.loads_in_flight(LOADS) == [1, 1, 0]
    # a store reads its address register as well as its value
    assert sass_static.loads_in_flight(LOADS.replace("STS [R0+0x4], R5", "STS [R7], R1")) \
        == [1, 0]


@pytest.mark.skipif(importlib.util.find_spec("cuda.bindings") is None,
                    reason="needs nvJitLink (numba-cuda[cu13])")
def test_the_script_counts_a_flip_kernel(tmp_path):
    """The whole path in a process of its own (numba compiles PTX only outside the
    simulator this suite runs in)."""
    try:
        sass_static.nvdisasm_path()
    except SystemExit:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["WTCONV_CUDA_CACHE"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = tmp_path / "counts.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass_static.py"),
                           "--spec", 'FlipSpec("float32", 3)', "--json", str(out),
                           "--dump", str(tmp_path / "dump")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (name, opcodes), = json.loads(out.read_text()).items()
    assert name.startswith("FlipSpec(") and opcodes.get("EXIT", 0) >= 1
    assert name in proc.stdout and len(list((tmp_path / "dump").glob("*.sass"))) == 1
