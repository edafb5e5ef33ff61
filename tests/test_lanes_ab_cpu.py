"""benchmarks/lanes_ab.py on a CPU: the variants it plans under each setting."""

import sys
from pathlib import Path

from wtconv_cuda.kernels import launch
from wtconv_cuda.kernels.lanes import LaneSpec
from wtconv_cuda.kernels.launch import Problem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import lanes_ab  # noqa: E402


def test_settings_switch_the_weight_gradients(monkeypatch):
    for name in ("LANES_MAX_PIXELS", "LANES_DEFAULT"):  # restored after the test
        monkeypatch.setattr(launch, name, getattr(launch, name))
    stage = Problem(64, 384, 14, 14, 5, 3, 1, "float32", True)
    lines = []
    try:
        specs = lanes_ab.variants(stage, ["plane", "lanes1", "lanes2"], lanes_ab.H200_LIMITS,
                                  lines.append)
        lane_specs = [s for s in specs if isinstance(s, LaneSpec)]
        assert sorted(s.lanes for s in lane_specs) == [1, 2]
        assert [line.split(":")[0] for line in lines] == [
            "plane backward", "lanes1 backward", "lanes2 backward"]
        assert "LaneSpec" not in lines[0] and "LaneSpec" in lines[1] and "LaneSpec" in lines[2]
        lanes_ab.use("plane")
        assert launch.plan_lanes(stage, *lanes_ab.H200_LIMITS) is None
    finally:
        monkeypatch.undo()
        launch.clear_plan_caches()


def test_parse_shape():
    assert lanes_ab.parse_shape("64x384x14x14:3") == ((64, 384, 14, 14), 3)
