"""CPU smoke test of ``benchmarks/host_proxy_cpu.py``: both proxies run a few steps of the
PyTorch module, and the launch-path one replays a recorded program whose launches it
counts (it broke unnoticed once when the binding moved to recorded programs)."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="needs PyTorch")


@pytest.mark.parametrize("launch_path", [False, True])
def test_host_proxy_runs(launch_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, str(ROOT / "benchmarks" / "host_proxy_cpu.py"), "--levels", "1",
               "--calls", "2", "--rounds", "1"] + (["--launch-path"] if launch_path else [])
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r"^\s+1\s+(off|bf16)\s+[\d.]+\s+[\d.]+$", proc.stdout, re.M)
    assert rows == ["off", "bf16"]
    launches = [int(n) for n in re.findall(r"launches per step: (\d+)", proc.stdout)]
    if launch_path:  # at least a forward and a backward launch per step, in both configurations
        assert len(launches) == 2 and min(launches) >= 2
    else:
        assert launches == []
