"""Recorded launch sequences replay exactly the planner's launches.

No kernel runs: a direct run of ``run_forward`` / ``run_backward`` against a
backend of plain integer addresses logs every work-buffer request, release and
launch; the recorded program, replayed on the same addresses with an allocator
that hands out the same buffers in order, must log the same events.
"""

import pytest

from wtconv_cuda.kernels.launch import ITEMSIZE, Problem, Tuning, Weights, run_backward, run_forward
from wtconv_cuda.kernels import program as program_module
from wtconv_cuda.kernels.program import BACKWARD_SLOTS, FORWARD_SLOTS, record

LIMIT, SLOTS = 227 * 1024 - 1024, 264
ARRAYS = 0x7F00_0000_0000  # the layer arrays' addresses: ARRAYS + (slot << 32)
BUFFERS = 0x5000_0000_0000  # work buffers, in request order: BUFFERS + (n << 32)
TABLES = 0x3000_0000_0000
STREAM = 0xCAFE


class _Device:
    """Kernel handles and table addresses, the same for both runs."""

    def __init__(self):
        self.functions, self.tables = {}, {}

    def function_of(self, spec):
        return self.functions.setdefault(spec, 0x1000 + len(self.functions))

    def table_address(self, values):
        key = values.tobytes()
        return self.tables.setdefault(key, TABLES + (len(self.tables) << 20))


class _DirectBackend:
    """The planner's backend interface on integer addresses, logging what it is asked."""

    simulate = False
    shared_limit, max_slots = LIMIT, SLOTS

    def __init__(self, device, log):
        self._device, self.log, self._buffers = device, log, 0

    def kernel(self, spec):
        return self._device.function_of(spec)

    def table(self, values):
        return self._device.table_address(values)

    def float32(self, n):
        address = BUFFERS + (self._buffers << 32)
        self._buffers += 1
        self.log.append(("alloc", max(int(n), 1), address))
        return address

    def release(self, buffer):
        self.log.append(("release", int(buffer)))

    def entries(self, array, start, count, storage):
        return int(array) + ITEMSIZE[storage] * int(start)

    def view(self, buffer, start, count):
        return int(buffer) + 4 * int(start)

    def typed_view(self, buffer, start, count, storage):
        return self.view(buffer, start, count)

    def call(self, function, grid, block, args, shared_bytes):
        self.log.append(("launch", function, grid, block, shared_bytes,
                         tuple(int(a) for a in args)))


class _Owner:
    """A replayed work buffer; logs its release when the program drops it."""

    def __init__(self, address, log):
        self.address, self.log = address, log

    def __del__(self):
        self.log.append(("release", self.address))


def _replay(monkeypatch, program, addresses, log):
    """``program.run`` with the driver call and the allocator logging into ``log``."""
    count = [0]

    def allocate(n):
        address = BUFFERS + (count[0] << 32)
        count[0] += 1
        log.append(("alloc", n, address))
        return _Owner(address, log), address

    def launch_packed(function, grid, block, shared_bytes, stream, values):
        assert stream == STREAM
        log.append(("launch", function, grid, block, shared_bytes, tuple(values)))

    monkeypatch.setattr(program_module, "launch_packed", launch_packed)
    program.run(addresses, allocate, STREAM)


def _without_final_releases(log):
    """The events up to the last launch (the buffers a run never releases go with it)."""
    last = max(i for i, event in enumerate(log) if event[0] == "launch")
    return log[:last + 1]


CASES = [
    ((1, 8, 16, 16), 3, 1, "float32", Tuning()),  # the plane kernel
    ((2, 3, 130, 67), 3, 2, "float16", Tuning()),  # stride 2
    ((1, 2, 255, 257), 2, 1, "float32", Tuning(tiles=False)),  # global scratch
    ((64, 768, 7, 7), 2, 1, "bfloat16", Tuning()),  # the register kernel
    ((64, 96, 56, 56), 5, 1, "float32", Tuning()),  # inner tiles; dx from the forward
    ((64, 192, 28, 28), 4, 1, "bfloat16", Tuning()),  # split in place; dx split
    ((64, 384, 14, 14), 3, 1, "float32", Tuning()),  # split; dx without a split
    ((128, 384, 14, 14), 3, 1, "float32", Tuning()),  # dx in two split chunks
    ((8, 32, 512, 512), 5, 1, "float32", Tuning()),  # split tiles, coarse backward
    ((5, 3, 33, 31), 2, 1, "float32", Tuning(dx_forward=True, dx_batch=2)),
    # the lane kernels: weight gradients (dx on the default forward), both forwards
    ((64, 384, 14, 14), 3, 1, "bfloat16", Tuning(lanes=2)),
    ((32, 6, 13, 11), 4, 1, "float32", Tuning(lanes=1, lanes_forward=1, dx_forward=True)),
]


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("shape,levels,stride,storage,tuning", CASES)
def test_replay_issues_the_planners_launches(monkeypatch, shape, levels, stride, storage, tuning,
                                             backward):
    problem = Problem(*shape, 5, levels, stride, storage, True)
    device = _Device()
    slots = BACKWARD_SLOTS if backward else FORWARD_SLOTS
    addresses = [ARRAYS + (s << 32) for s in range(slots)]
    direct = []
    backend = _DirectBackend(device, direct)
    if backward:
        run_backward(backend, problem, *addresses[:3], Weights(*addresses[3:8]),
                     Weights(*addresses[8:13]), tuning)
    else:
        run_forward(backend, problem, *addresses[:2], Weights(*addresses[2:7]), tuning)

    program = record(problem, backward, LIMIT, SLOTS, device.function_of,
                     device.table_address, tuning)
    replayed = []
    _replay(monkeypatch, program, addresses, replayed)
    assert _without_final_releases(replayed) == _without_final_releases(direct)
    assert sum(event[0] == "launch" for event in replayed) >= 1
    # every buffer the program asked for was dropped by the time it finished
    assert sorted(e[2] for e in replayed if e[0] == "alloc") == sorted(
        e[1] for e in replayed if e[0] == "release")


def test_replay_moves_with_the_arrays(monkeypatch, without_lane_rule):
    """A second call on other arrays patches their addresses, and only theirs: the pool
    and the tiles read the layer's arrays, the coarse levels only the work buffer."""
    problem = Problem(64, 384, 14, 14, 5, 3, 1, "float32", True)
    device = _Device()
    program = record(problem, False, LIMIT, SLOTS, device.function_of, device.table_address)
    first, second = [], []
    _replay(monkeypatch, program, [ARRAYS + (s << 32) for s in range(FORWARD_SLOTS)], first)
    _replay(monkeypatch, program, [ARRAYS + (s << 32) + 256 for s in range(FORWARD_SLOTS)],
            second)
    launches = [(a, b) for a, b in zip(first, second) if a[0] == "launch"]
    assert len(launches) == 3  # pool, coarse levels (register kernel), tiles
    moved = [[(u, v) for u, v in zip(a[5], b[5]) if u != v] for a, b in launches]
    assert [bool(m) for m in moved] == [True, False, True]
    assert all(v - u == 256 and u >= ARRAYS for m in moved for u, v in m)


def test_no_program_without_driver_handles():
    problem = Problem(1, 8, 16, 16, 5, 3, 1, "float32", True)
    assert record(problem, False, LIMIT, SLOTS, lambda spec: None, lambda values: 0) is None


def test_replay_wants_every_array():
    problem = Problem(1, 8, 16, 16, 5, 3, 1, "float32", True)
    device = _Device()
    program = record(problem, True, LIMIT, SLOTS, device.function_of, device.table_address)
    with pytest.raises(ValueError, match="13 array addresses"):
        program.run([ARRAYS] * FORWARD_SLOTS, lambda n: (None, BUFFERS), STREAM)
