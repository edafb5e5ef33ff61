"""Recorded launch sequences replay exactly the planner's launches.

No kernel runs: a direct run of ``run_forward`` / ``run_backward`` against a
backend of plain integer addresses logs every work-buffer request, release and
launch; the recorded program, replayed on the same addresses with an allocator
that hands out the same buffers in order, must log the same events. With two
streams (``launch.TWO_STREAMS``) a backward's fork region moves the main
part's requests ahead: there the launches must match with their buffers
compared by size and offset, and the region must keep the two parts apart.
"""

import pytest

from wtconv_cuda.kernels import launch as launch_module
from wtconv_cuda.kernels.codegen import FinalizeSpec
from wtconv_cuda.kernels.flip import FlipSpec
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


class _SideStream:
    """Stands in for ``driver.SideStream``: logs its fork and join."""

    handle = 0xBEEF

    def __init__(self, log):
        self.log = log

    def fork(self, main):
        self.log.append(("fork", main))

    def join(self, main):
        self.log.append(("join", main))


def _replay(monkeypatch, program, addresses, log, side=None):
    """``program.run`` with the driver call and the allocator logging into ``log``
    (launches on the side stream as ``"side launch"``)."""
    count = [0]

    def allocate(n):
        address = BUFFERS + (count[0] << 32)
        count[0] += 1
        log.append(("alloc", n, address))
        return _Owner(address, log), address

    def launch_packed(function, grid, block, shared_bytes, stream, values):
        assert stream in (STREAM, _SideStream.handle)
        kind = "launch" if stream == STREAM else "side launch"
        log.append((kind, function, grid, block, shared_bytes, tuple(values)))

    monkeypatch.setattr(program_module, "launch_packed", launch_packed)
    program.run(addresses, allocate, STREAM, side)


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
    ((8, 32, 512, 512), 5, 1, "float32", Tuning()),  # split tiles; backward in 2 chunks
    ((8, 16, 256, 256), 5, 1, "bfloat16", Tuning()),  # split backward in chunks 3, 3, 2
    ((5, 3, 33, 31), 2, 1, "float32", Tuning(dx_forward=True, dx_batch=2)),
    # the lane kernels: weight gradients (dx on the default forward), both forwards
    ((64, 384, 14, 14), 3, 1, "bfloat16", Tuning(lanes=2)),
    ((32, 6, 13, 11), 4, 1, "float32", Tuning(lanes=1, lanes_forward=1, dx_forward=True)),
]


class _ForkingBackend(_DirectBackend):
    """A direct backend that may fork (and so plans as a recorded program does), but
    issues everything in order."""

    def fork(self):
        pass

    resume = join = fork


def _direct_run(problem, backward, tuning, device, forking=False):
    """The planner's launches on ``device``'s handles, logged; and the array addresses."""
    slots = BACKWARD_SLOTS if backward else FORWARD_SLOTS
    addresses = [ARRAYS + (s << 32) for s in range(slots)]
    direct = []
    backend = (_ForkingBackend if forking else _DirectBackend)(device, direct)
    if backward:
        run_backward(backend, problem, *addresses[:3], Weights(*addresses[3:8]),
                     Weights(*addresses[8:13]), tuning)
    else:
        run_forward(backend, problem, *addresses[:2], Weights(*addresses[2:7]), tuning)
    return direct, addresses


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("shape,levels,stride,storage,tuning", CASES)
def test_replay_issues_the_planners_launches(monkeypatch, shape, levels, stride, storage, tuning,
                                             backward):
    monkeypatch.setattr(launch_module, "TWO_STREAMS", False)
    problem = Problem(*shape, 5, levels, stride, storage, True)
    device = _Device()
    direct, addresses = _direct_run(problem, backward, tuning, device)

    program = record(problem, backward, LIMIT, SLOTS, device.function_of,
                     device.table_address, tuning)
    assert not program.forks
    replayed = []
    _replay(monkeypatch, program, addresses, replayed)
    assert _without_final_releases(replayed) == _without_final_releases(direct)
    assert sum(event[0] == "launch" for event in replayed) >= 1
    # every buffer the program asked for was dropped by the time it finished
    assert sorted(e[2] for e in replayed if e[0] == "alloc") == sorted(
        e[1] for e in replayed if e[0] == "release")


def _canonical_launches(log):
    """The log's launches, each argument inside a work buffer written as (its buffer's
    size, the offset), with the launch's stream; and the buffers each launch touches."""
    sizes = {event[2]: event[1] for event in log if event[0] == "alloc"}
    launches = []
    for event in log:
        if event[0].endswith("launch"):
            args, touched = [], set()
            for value in event[5]:
                base = next((b for b, n in sizes.items() if 0 <= value - b < 4 * n), None)
                if base is None:
                    args.append(value)
                else:
                    args.append(("buffer", sizes[base], value - base))
                    touched.add(base)
            launches.append((event[0], event[1:5] + (tuple(args),), touched))
    return launches


@pytest.mark.parametrize("shape,levels,stride,storage,tuning", CASES)
def test_two_streams_keep_the_parts_apart(monkeypatch, shape, levels, stride, storage, tuning):
    """With two streams the replay issues the planner's launches in its order, the
    ``dx`` part (flip first) on the side stream between fork and join, the weight
    gradients (finalize last) on the main stream; no buffer is touched by both parts,
    and none is requested in the region after a release of the other part."""
    monkeypatch.setattr(launch_module, "TWO_STREAMS", True)
    problem = Problem(*shape, 5, levels, stride, storage, True)
    device = _Device()
    direct, addresses = _direct_run(problem, True, tuning, device, forking=True)
    program = record(problem, True, LIMIT, SLOTS, device.function_of, device.table_address,
                     tuning)
    forking = launch_module.runs_side_by_side(problem, LIMIT, SLOTS, tuning)
    assert program.forks == forking
    replayed = []
    _replay(monkeypatch, program, addresses, replayed, _SideStream(replayed))

    ours, theirs = _canonical_launches(replayed), _canonical_launches(direct)
    assert [launch[1] for launch in ours] == [launch[1] for launch in theirs]
    assert sorted(e[1] for e in replayed if e[0] == "alloc") == sorted(
        e[1] for e in direct if e[0] == "alloc")
    kinds = [event[0] for event in replayed]
    if not forking:
        assert "side launch" not in kinds and "fork" not in kinds and "join" not in kinds
        return
    assert kinds.count("fork") == 1 and kinds.count("join") == 1
    assert ("fork", STREAM) in replayed and ("join", STREAM) in replayed
    fork, join = kinds.index("fork"), kinds.index("join")
    region = replayed[fork + 1:join]
    side = [i for i, event in enumerate(region) if event[0] == "side launch"]
    main = [i for i, event in enumerate(region) if event[0] == "launch"]
    assert side and main and max(side) < min(main)  # the side part is issued first
    assert all(event[0] != "side launch" for event in replayed[:fork] + replayed[join:])
    spec_of = {handle: spec for spec, handle in device.functions.items()}
    assert isinstance(spec_of[region[side[0]][1]], FlipSpec)
    assert isinstance(spec_of[region[main[-1]][1]], FinalizeSpec)
    # the parts share no buffer, and the main part's are all requested before the fork
    side_buffers = set().union(*(t for kind, _, t in ours if kind == "side launch"))
    main_buffers = set().union(*(t for kind, _, t in ours[len(ours) - len(main):]))
    assert main_buffers and not side_buffers & main_buffers
    assert {event[2] for event in region if event[0] == "alloc"} <= side_buffers


#: ConvNeXt-T stages, K 5: which storages run the backward's parts side by side.
STAGES = [((64, 96, 56, 56), 5, {"float32", "float16", "bfloat16"}),
          ((64, 192, 28, 28), 4, {"float32"}),  # dx in halves; 16 bits: even halves too large
          ((64, 384, 14, 14), 3, {"float32", "float16", "bfloat16"}),
          ((64, 768, 7, 7), 2, set())]  # the register kernel: one launch


@pytest.mark.parametrize("shape,levels,forking", STAGES)
@pytest.mark.parametrize("storage", ["float32", "float16", "bfloat16"])
def test_side_by_side_keeps_the_work_buffers_bound(monkeypatch, shape, levels, forking,
                                                   storage):
    """The stages fork where the rule says, and the work buffers a backward's
    program holds at once stay within ``DX_FORWARD_BUFFER_FRACTION`` of x's bytes,
    within ``SIDE_BY_SIDE_BUFFER_FRACTION`` where it forks."""
    monkeypatch.setattr(launch_module, "TWO_STREAMS", True)
    problem = Problem(*shape, 5, levels, 1, storage, True)
    device = _Device()
    program = record(problem, True, LIMIT, SLOTS, device.function_of, device.table_address)
    assert program.forks == (storage in forking)
    b, c, h, w = shape
    fraction = (launch_module.SIDE_BY_SIDE_BUFFER_FRACTION if program.forks
                else launch_module.DX_FORWARD_BUFFER_FRACTION)
    assert 4 * _peak_floats(program) <= fraction * b * c * h * w * ITEMSIZE[storage]


def _peak_floats(program):
    """float32 elements of the work buffers ``program`` holds at once, at most."""
    live = peak = 0
    sizes = {}
    for kind, slot, floats in program.steps:
        if kind == "alloc":
            sizes[slot] = floats
            live += floats
            peak = max(peak, live)
        elif kind == "release":
            live -= sizes[slot]
    return peak


@pytest.mark.parametrize("shape,levels", [((8, 32, 128, 128), 5), ((8, 64, 256, 256), 5),
                                          ((8, 32, 512, 512), 5), ((8, 64, 256, 256), 3),
                                          ((7, 16, 512, 300), 5)])
@pytest.mark.parametrize("storage", ["float32", "bfloat16"])
def test_split_backward_program_holds_what_the_planner_counts(shape, levels, storage):
    """A split backward's recorded program, in batch chunks, holds at most
    split_live_floats() at once (exactly that where the coarse problem's buffers are
    all requested at once), within SPLIT_BACKWARD_BUFFER_FRACTION of x's bytes."""
    problem = Problem(*shape, 5, levels, 1, storage, True)
    split = launch_module.plan_split(problem, LIMIT, backward=True)
    chunks = launch_module.split_batch_chunks(problem, LIMIT, SLOTS)
    assert split is not None and chunks
    device = _Device()
    program = record(problem, True, LIMIT, SLOTS, device.function_of, device.table_address)
    counted = launch_module.split_live_floats(split, chunks, LIMIT, SLOTS)
    assert _peak_floats(program) <= counted
    if shape[-1] == 512:  # the coarse problem on tiles: its partials alone
        assert _peak_floats(program) == counted
    b, c, h, w = shape
    budget = launch_module.SPLIT_BACKWARD_BUFFER_FRACTION * b * c * h * w * ITEMSIZE[storage]
    assert 4 * counted <= budget


def test_one_stream_without_a_side_stream(monkeypatch):
    """A forking program run without a side stream queues every launch on the main
    stream, in the planner's order, and neither forks nor joins."""
    monkeypatch.setattr(launch_module, "TWO_STREAMS", True)
    problem = Problem(64, 192, 28, 28, 5, 4, 1, "float32", True)
    device = _Device()
    direct, addresses = _direct_run(problem, True, Tuning(), device, forking=True)
    program = record(problem, True, LIMIT, SLOTS, device.function_of, device.table_address)
    assert program.forks
    replayed = []
    _replay(monkeypatch, program, addresses, replayed)
    assert {event[0] for event in replayed} == {"alloc", "launch", "release"}
    assert [launch[1] for launch in _canonical_launches(replayed)] == [
        launch[1] for launch in _canonical_launches(direct)]


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


def test_halved_dx_default_is_the_measured_program(monkeypatch):
    """At 28 x 28 fp32 the default backward program is, launch for launch, the one
    ``benchmarks/streams_bench.py`` timed as ``halves``: ``dx_batch`` of half the batch."""
    monkeypatch.setattr(launch_module, "TWO_STREAMS", True)
    problem = Problem(64, 192, 28, 28, 5, 4, 1, "float32", True)
    device = _Device()

    def steps(tuning):
        program = record(problem, True, LIMIT, SLOTS, device.function_of,
                         device.table_address, tuning)
        return [(kind, tuple(step.template) + (step.function, step.grid, step.block,
                                               step.shared_bytes, step.patches)
                 if kind == "launch" else step, value)
                for kind, step, value in program.steps]

    default = steps(Tuning())
    assert default == steps(Tuning(dx_forward=True, dx_batch=32))
    assert sum(kind == "fork" for kind, _, _ in default) == 1


def test_the_direct_path_keeps_the_planners_dx_plan(monkeypatch):
    """A backend that cannot fork runs dx in the planner's own chunks (one at 28 x 28
    fp32: two chunks on one stream were slower), a forking one in two."""
    monkeypatch.setattr(launch_module, "TWO_STREAMS", True)
    problem = Problem(64, 192, 28, 28, 5, 4, 1, "float32", True)
    device = _Device()
    tile = launch_module.plan_split(
        launch_module._dx_problem(problem)._replace(batch=64), LIMIT).tiles.spec
    launches = {}
    for forking in (False, True):
        log, _ = _direct_run(problem, True, Tuning(), device, forking)
        launches[forking] = [e[1] for e in log if e[0] == "launch"]
    tiles = device.functions[tile]
    assert launches[False].count(tiles) == 1
    assert len(launches[True]) == len(launches[False]) + 3  # the split forward again
