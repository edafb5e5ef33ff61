"""The PTX tier's background compile, and a planner without the lane kernels' default rule.

Tests marked ``ptx_background`` read the output of one long PTX compile
(:data:`test_ptx.SPECS`). It starts in a subprocess as soon as collection ends and
runs beside the simulator tests, which use one core, and the marked tests run last and
wait for it: on a two-core CI machine the compile's quarter of an hour overlaps the
rest of the suite instead of following it.

``nan_shared`` starts every simulated block's dynamic shared memory as NaN (a
GPU does not zero it; the simulator does), so a value a kernel reads before it
writes it shows in its outputs.

``without_lane_rule`` plans as if the lane kernels' default rule were off: tests of
the tiles, splits and plane kernel at 14 x 14 (which the rule now takes) use it.
"""

import shutil
import tempfile
from pathlib import Path

import pytest

from wtconv_cuda.kernels import launch

from ._ptx import CompileJob

MARKER = "ptx_background"
JOB_KEY = pytest.StashKey[CompileJob]()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"{MARKER}: reads the PTX compile started when collection ends (runs last)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    waiting = [item for item in items if item.get_closest_marker(MARKER)]
    items[:] = [item for item in items if not item.get_closest_marker(MARKER)] + waiting


def _start(config) -> CompileJob:
    from .test_ptx import SPECS

    folder = Path(tempfile.mkdtemp(prefix="wtconv-ptx-"))
    job = config.stash[JOB_KEY] = CompileJob(folder / "cache", SPECS, folder / "usage.json")
    return job


def pytest_collection_finish(session):
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return  # (a pytest-xdist worker collects every test: the test starts it there)
    if any(item.get_closest_marker(MARKER) for item in session.items):
        _start(session.config)


def pytest_sessionfinish(session):
    job = session.config.stash.get(JOB_KEY, None)
    if job is not None:
        job.kill()
        shutil.rmtree(job.cache.parent, ignore_errors=True)


@pytest.fixture
def ptx_background(request) -> CompileJob:
    """The compile of :data:`test_ptx.SPECS`: the one started when collection ended, or
    (under pytest-xdist) one started now."""
    job = request.config.stash.get(JOB_KEY, None)
    return _start(request.config) if job is None else job


@pytest.fixture
def without_lane_rule(monkeypatch):
    """Plan with `launch.LANES_MAX_PIXELS` and `LANES_FORWARD_MAX_PIXELS` at 0 (forced
    lanes through `Tuning` still apply), plan caches cleared before and after."""
    monkeypatch.setattr(launch, "LANES_MAX_PIXELS", 0)
    monkeypatch.setattr(launch, "LANES_FORWARD_MAX_PIXELS", 0)
    launch.clear_plan_caches()
    yield
    monkeypatch.undo()
    launch.clear_plan_caches()


@pytest.fixture
def nan_shared(monkeypatch):
    """Blocks of numba's simulator start with all-ones bytes (float32 NaN) in their
    dynamic shared memory."""
    from numba.cuda.simulator import kernelapi
    zeroed = kernelapi.FakeCUDAShared.__init__

    def poisoned(self, dynshared_size):
        zeroed(self, dynshared_size)
        self._dynshared[:] = -1

    monkeypatch.setattr(kernelapi.FakeCUDAShared, "__init__", poisoned)
