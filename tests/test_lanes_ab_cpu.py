"""benchmarks/lanes_ab.py on a CPU: the variants it plans under each setting."""

import sys
from pathlib import Path

import pytest

from wtconv_cuda.kernels import launch
from wtconv_cuda.kernels.lanes import LaneForwardSpec, LaneSpec
from wtconv_cuda.kernels.launch import Problem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import lanes_ab  # noqa: E402


@pytest.fixture
def planner_rules(monkeypatch):
    """The planner rules lanes_ab.py switches, restored (and the plan caches cleared)
    after the test."""
    for name in lanes_ab._RULES:
        monkeypatch.setattr(launch, name, getattr(launch, name))
    yield
    monkeypatch.undo()
    launch.clear_plan_caches()


def test_settings_switch_the_weight_gradients(planner_rules):
    stage = Problem(64, 384, 14, 14, 5, 3, 1, "float32", True)
    lines = []
    specs = lanes_ab.variants(stage, ["plane", "lanes1", "lanes2", "all2"],
                              lanes_ab.H200_LIMITS, lines.append)
    assert sorted(s.lanes for s in specs if isinstance(s, LaneSpec)) == [1, 2]
    assert [s.lanes for s in specs if isinstance(s, LaneForwardSpec)] == [2]
    assert [line.split(":")[0] for line in lines] == [
        "plane backward", "lanes1 backward", "lanes2 backward", "all2 backward"]
    assert "LaneSpec" not in lines[0] and "LaneSpec" in lines[1] and "LaneSpec" in lines[2]
    # all2: the dx forward on the lane kernel's forward too
    assert "LaneForwardSpec" in lines[3] and "LaneForwardSpec" not in lines[2]
    lanes_ab.use("plane")
    assert launch.plan_lanes(stage, *lanes_ab.H200_LIMITS) is None
    assert launch.plan_lanes_forward(stage, lanes_ab.H200_LIMITS[0]) is None


def test_noreg_settings_move_tiny_planes_to_the_lane_kernels(planner_rules):
    stage = Problem(64, 768, 7, 7, 5, 2, 1, "float32", True)
    lines = []
    specs = lanes_ab.variants(stage, ["plane", "all2", "noreg2", "noreg4"],
                              lanes_ab.H200_LIMITS, lines.append)
    kinds = {type(s).__name__ for s in specs}
    assert "RegisterSpec" in kinds  # plane and all2: the register kernel takes 7 x 7
    assert "LaneForwardSpec" not in lines[1] and "LaneForwardSpec" in lines[2]
    assert sorted(s.lanes for s in specs if isinstance(s, LaneForwardSpec)) == [2, 4]
    # the weight gradients stay off the lane kernel: one partial per block of 16
    # (or 32) planes of 49 pixels exceeds PARTIAL_FRACTION of x
    assert not any(isinstance(s, LaneSpec) for s in specs)
    lanes_ab.use("noreg2")
    assert launch.plan_registers(stage, lanes_ab.H200_LIMITS[0]) is None
    lanes_ab.use("plane")
    assert launch.plan_registers(stage, lanes_ab.H200_LIMITS[0]) is not None
    # 28 x 28: only the split forward's 7 x 7 coarse problem moves to the lanes
    stage28 = Problem(64, 192, 28, 28, 5, 4, 1, "float32", True)
    lines.clear()
    specs = lanes_ab.variants(stage28, ["plane", "noreg2"], lanes_ab.H200_LIMITS,
                              lines.append)
    lanes28 = [s for s in specs if isinstance(s, (LaneSpec, LaneForwardSpec))]
    assert [(type(s).__name__, s.height, s.storage) for s in lanes28] == [
        ("LaneForwardSpec", 7, "float32")]
    # reg32: the register kernel's coarse problem in blocks of 32 threads
    specs = lanes_ab.variants(stage28, ["plane", "reg32"], lanes_ab.H200_LIMITS)
    assert sorted({s.threads for s in specs if type(s).__name__ == "RegisterSpec"
                   and not s.backward}) == [32, 128]


def test_parse_shape():
    assert lanes_ab.parse_shape("64x384x14x14:3") == ((64, 384, 14, 14), 3)


def test_group_settings_in_16_bit_storage(planner_rules):
    stage = Problem(64, 384, 14, 14, 5, 3, 1, "bfloat16", True)
    lines = []
    specs = lanes_ab.variants(stage, ["groups1", "groups2"], lanes_ab.H200_LIMITS,
                              lines.append)
    assert sorted((s.lanes, s.groups) for s in specs if isinstance(s, LaneSpec)) == [
        (1, 1), (2, 2)]
    lanes_ab.use("default")  # the rules as they stand: two threads a plane, two groups
    assert launch.LANE_GROUPS_MAX == 2
    spec = launch.plan_lanes(stage, *lanes_ab.H200_LIMITS).spec
    assert (spec.lanes, spec.groups) == (2, 2)
