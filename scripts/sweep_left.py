"""The GPU oracle cases a cut sweep did not reach, as pytest node ids.

A device call's time limit can cut ``tests/gpu/test_gpu_kernels.py`` short.
The sweep's ``pytest -v`` logs name every case that finished; this script
collects the sweep's cases for the given kernel sizes (on any machine: where
CuPy or ml_dtypes is missing, collection runs with empty stand-in packages) and
prints, one per line, the ids that no log reports as PASSED or SKIPPED (failed
and errored cases are listed again, so a rerun repeats them).

    python scripts/sweep_left.py --ks 9 gpu_k9.log > left_k9.txt
    TEST_KS=9 TEST_IDS=left_k9.txt bash scripts/device_check.sh kernels

The ids are relative to ``tests/gpu/test_gpu_kernels.py`` (``test_x[...]``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_FILE = "tests/gpu/test_gpu_kernels.py"
_DONE = re.compile(r"test_gpu_kernels\.py::(\S+) (?:PASSED|SKIPPED)|"
                   r"(?:PASSED|SKIPPED) \S*test_gpu_kernels\.py::(\S+)")


def finished(log_text: str) -> set:
    """Node ids (after ``::``) that a ``pytest -v`` log reports as PASSED or SKIPPED.

    Handles both orders pytest-xdist writes (``[gw3] [ 12%] PASSED path::id``
    and ``path::id PASSED``).
    """
    return {a or b for a, b in _DONE.findall(log_text)}


def left(collected: list, logs: list) -> list:
    """``collected`` ids, in order, that none of the ``logs`` (texts) finished."""
    done = set().union(*(finished(text) for text in logs)) if logs else set()
    return [node for node in collected if node not in done]


#: Empty stand-ins for the GPU test module's imports where they are missing: collection
#: only needs the names (the module reads ``ml_dtypes.bfloat16`` at import).
_STAND_INS = {"cupy": "", "ml_dtypes": "bfloat16 = None\n"}


def collect(ks: str) -> list:
    """The sweep's node ids (after ``::``) for the kernel sizes ``ks`` (e.g. ``"7,9"``)."""
    env = dict(os.environ, WTCONV_TEST_GPU="1", WTCONV_TEST_KS=ks)
    with tempfile.TemporaryDirectory() as stand_in:
        missing = {name: body for name, body in _STAND_INS.items()
                   if importlib.util.find_spec(name) is None}
        for name, body in missing.items():
            (Path(stand_in) / name).mkdir()
            (Path(stand_in) / name / "__init__.py").write_text(body)
        if missing:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (stand_in,
                                                              env.get("PYTHONPATH"))))
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
             TEST_FILE], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    ids = [line.split("::", 1)[1] for line in out.stdout.splitlines()
           if line.startswith(TEST_FILE + "::")]
    if not ids:
        raise SystemExit(f"collected no cases:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return ids


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", required=True, help="kernel sizes of the sweep, e.g. 9 or 7,9")
    parser.add_argument("logs", nargs="*", help="pytest -v logs of the cut runs")
    args = parser.parse_args(argv)
    texts = [Path(path).read_text(errors="replace") for path in args.logs]
    for node in left(collect(args.ks), texts):
        print(node)


if __name__ == "__main__":
    main()
