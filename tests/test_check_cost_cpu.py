"""CPU smoke test of ``benchmarks/check_cost_cpu.py``: its CuPy-like stand-ins pass the
per-call checks in every dtype, with ``device`` as a property and as an attribute."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_check_cost_runs_every_row():
    command = [sys.executable, str(ROOT / "benchmarks" / "check_cost_cpu.py"), "--tree",
               str(ROOT), "--calls", "20", "--rounds", "1"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r"^\s+device (property|attribute)\s+(\w+)\s+[\d.]+$", proc.stdout, re.M)
    dtypes = ("float32", "float16") + (("bfloat16",) if importlib.util.find_spec("ml_dtypes")
                                       else ())
    assert rows == [(kind, dtype) for kind in ("property", "attribute") for dtype in dtypes]
