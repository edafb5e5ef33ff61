"""The demo module runs end to end and labels the path it took."""

import re

from wtconv_cuda import demo


def test_demo_runs_and_reports_small_errors(capsys):
    assert demo.main() == 0
    out = capsys.readouterr().out
    label = "CPU path" if demo._gpu_available() else "CPU path (no GPU found)"
    assert f"{label}: forward + backward in" in out
    errors = [float(e) for e in re.findall(r"\d\.\d\de[-+]\d\d", out)]
    assert len(errors) == 7  # y, dx and five parameter gradients of the CPU path
    assert max(errors) < 1e-6  # float32 rounding of the float64 oracle
