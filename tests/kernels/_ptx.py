"""Compiling kernel variants to PTX in a subprocess that runs beside the test session.

The CPU suite imports numba in simulator mode, which cannot compile, so every PTX compile
runs in a fresh interpreter without ``NUMBA_ENABLE_CUDASIM``. numba takes 10-240 s per
variant of the generated kernels on a CI core, so the long compile of
``test_ptx.py`` starts when collection ends and runs beside the simulator tests
(``conftest.py`` in this folder).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


class CompileJob:
    """One subprocess compiling the specs that a code string defines into a cache folder.

    Parameters
    ----------
    cache : Path
        The kernel cache folder (``WTCONV_CUDA_CACHE``) of the subprocess.
    specs_code : str
        Python source that defines ``specs``, a list of kernel specs.
    usage_file : Path, optional
        Where to write ptxas's report of each spec as JSON (``{repr(spec): [registers,
        local bytes, global scratch]}``); nothing is written if nvJitLink is missing.
    """

    def __init__(self, cache: Path, specs_code: str, usage_file: Path | None = None):
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
        env["WTCONV_CUDA_CACHE"] = str(cache)
        code = specs_code + textwrap.dedent("""
            from wtconv_cuda.kernels.warmup import compile_all
            compile_all(specs, (9, 0), 1)
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
                        json.dump({{repr(s): [usage[repr(s)].registers,
                                             usage[repr(s)].local_bytes,
                                             bool(getattr(s, "scratch", False))]
                                   for s in specs}}, handle)
            """)
        code += "print(len(specs))\n"
        self.cache, self.usage_file = cache, usage_file
        self._proc = subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait(self, timeout: float) -> int:
        """Wait for the subprocess; return how many specs it compiled.

        Raises ``AssertionError`` with its output if it failed, and
        ``subprocess.TimeoutExpired`` (after killing it) if it ran past ``timeout`` s.
        """
        try:
            out, err = self._proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        assert self._proc.returncode == 0, out + err
        return int(out.split()[-1])

    def kill(self) -> None:
        """Stop the subprocess if it still runs."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.communicate()
