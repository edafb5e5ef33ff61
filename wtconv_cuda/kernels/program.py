"""Recorded launch sequences: a call's launches planned once, replayed with new addresses.

:func:`~wtconv_cuda.kernels.launch.run_forward` and
:func:`~wtconv_cuda.kernels.launch.run_backward` plan every call in Python:
plan lookups, work-buffer views, argument tuples, then one launch per kernel.
On an H200 host a split forward spent 76 us per call on that (three
launches), more than its kernels take at the 14 x 14 ConvNeXt-T stage. Yet
for one problem the launches never change except in the addresses of the
layer's arrays and of the work buffers.

:func:`record` runs the planner once against a backend whose arrays and work
buffers are symbolic addresses (slot ``s`` is ``(s + 1) << 56``, far above
any device address or size), so every launch argument is either a constant
(a size, a cached table's address) or a slot's address plus an offset. A
:class:`Program` keeps each launch as a packed parameter block with the
slot arguments marked, and the work-buffer requests and releases in their
order. :meth:`Program.run` allocates the buffers in that order, patches the
addresses in and calls ``cuLaunchKernel``: the same launches, with the same
arguments, as the planner's path (a CPU test checks this problem by problem).

Where the planner marks two independent parts of a call (``fork``, ``resume``
and ``join`` on the backend, see ``launch.TWO_STREAMS``), the program keeps a
fork region: the main part's work-buffer requests first, then ``fork``, the
side part's steps (its launches on a side stream), the main part's launches
and releases, and ``join``. All buffers come from the caller's allocator on
the main stream. Within the region a request that follows a release comes
from the side part, after its own release (batch chunks of the ``dx``
forward, ordered on the side stream), so memory still in use on one stream
is never handed to the other; what is released there is next handed to a
request after the join, for work that the main stream queues after it.

Nothing here imports CuPy at module level.
"""

from __future__ import annotations

from array import array
from typing import Callable, NamedTuple

from .driver import SideStream, launch_packed
from .launch import ITEMSIZE, Problem, Tuning, Weights, run_backward, run_forward

__all__ = ["Launch", "Program", "record", "run_direct", "FORWARD_SLOTS", "BACKWARD_SLOTS"]

#: Bits below a slot's symbolic address: offsets into an array stay below it.
SLOT_SHIFT = 56
_OFFSET_MASK = (1 << SLOT_SHIFT) - 1
#: Array slots of a forward: ``x``, ``y``, then the five weights (:class:`Weights` order).
FORWARD_SLOTS = 7
#: Array slots of a backward: ``x``, ``dy``, ``dx``, the five weights, the five gradients.
BACKWARD_SLOTS = 13


def _slot_address(slot: int) -> int:
    return (slot + 1) << SLOT_SHIFT


class Launch(NamedTuple):
    """One recorded ``cuLaunchKernel`` call.

    Attributes
    ----------
    function : int
        ``CUfunction`` handle.
    grid, block, shared_bytes : int
        One-dimensional grid and block sizes, dynamic shared memory per block.
    template : array.array of 'Q'
        The 8-byte parameters, with 0 where a slot's address goes.
    patches : tuple of (int, int, int)
        ``(parameter index, slot, byte offset)`` of every address argument.
    """

    function: int
    grid: int
    block: int
    shared_bytes: int
    template: array
    patches: tuple


class Program:
    """The launches of one layer call, replayable on any arrays of the same problem.

    Parameters
    ----------
    slots : int
        Array slots (`FORWARD_SLOTS` or `BACKWARD_SLOTS`).
    steps : tuple of (str, object, int)
        In order: ``("alloc", slot, floats)``, ``("release", slot, 0)``,
        ``("launch", Launch, stream)`` (``stream`` 1 on the side stream, else
        0), ``("fork", 0, 0)`` and ``("join", 0, 0)``.

    Attributes
    ----------
    forks : bool
        Whether some launches may go on a side stream (pass ``side`` to
        :meth:`run`).
    """

    __slots__ = ("slots", "steps", "buffers", "forks")

    def __init__(self, slots: int, steps: tuple):
        self.slots = slots
        self.steps = steps
        self.buffers = sum(1 for step in steps if step[0] == "alloc")
        self.forks = any(step[0] == "fork" for step in steps)

    def __repr__(self):
        launches = sum(1 for step in self.steps if step[0] == "launch")
        return f"Program({launches} launches, {self.buffers} work buffers)"

    def run(self, addresses, allocate: Callable, stream: int,
            side: SideStream | None = None) -> None:
        """Queue the program's launches on ``stream`` (asynchronous).

        Parameters
        ----------
        addresses : sequence of int
            Device addresses of the array slots, in slot order.
        allocate : callable
            ``allocate(n) -> (owner, address)``: ``n`` float32 elements of
            device memory usable on ``stream``. An owner is dropped at its
            recorded release, or on return (after the last launch is queued).
        stream : int
            ``CUstream`` handle. The caller makes the device's context current.
        side : SideStream, optional
            Where the side part of a fork region runs (forked from ``stream``
            and joined to it, see :func:`~wtconv_cuda.kernels.driver.side_stream`);
            without it every launch goes on ``stream``, in the same order.

        Raises
        ------
        ValueError
            Not one address per array slot.
        """
        if len(addresses) != self.slots:
            raise ValueError(f"expected {self.slots} array addresses, got {len(addresses)}")
        base = list(addresses)
        if self.buffers:
            base += [0] * self.buffers
            owners = {}
        streams = (stream, stream if side is None else side.handle)
        for kind, step, value in self.steps:
            if kind == "launch":
                values = array("Q", step.template)
                for index, slot, offset in step.patches:
                    values[index] = base[slot] + offset
                launch_packed(step.function, step.grid, step.block, step.shared_bytes,
                              streams[value], values)
            elif kind == "alloc":
                owners[step], address = allocate(value)
                base[step] = int(address)
            elif kind == "release":
                del owners[step]
            elif side is not None:
                if kind == "fork":
                    side.fork(stream)
                else:
                    side.join(stream)


class _NoDriverHandle(Exception):
    """A kernel without a ``CUfunction`` handle: it cannot be replayed."""


class _Recorder:
    """The backend interface of :func:`~wtconv_cuda.kernels.launch.run_forward`, recording."""

    simulate = False

    def __init__(self, shared_limit: int, max_slots: int, function_of: Callable,
                 table_address: Callable, slots: int):
        self.shared_limit = shared_limit
        self.max_slots = max_slots
        self._function_of = function_of
        self._table_address = table_address
        self._next_slot = slots
        self.steps: list = []
        self._region = None  # (main allocations, side steps, main steps) within a fork
        self._to = self.steps  # where the next step goes
        self._stream = 0

    def fork(self) -> None:
        """Start a fork region; its steps, up to :meth:`resume`, go on the side stream."""
        self._region = ([], [], [])
        self._to, self._stream = self._region[1], 1

    def resume(self) -> None:
        """The region's following steps go on the main stream."""
        self._to, self._stream = self._region[2], 0

    def join(self) -> None:
        """End the region: lay it out as the module's docstring says."""
        main_allocations, side, main = self._region
        self.steps += main_allocations + [("fork", 0, 0)] + side + main + [("join", 0, 0)]
        self._region, self._to, self._stream = None, self.steps, 0

    def kernel(self, spec):
        function = self._function_of(spec)
        if function is None:
            raise _NoDriverHandle(spec)
        return function

    def table(self, values):
        return int(self._table_address(values))

    def float32(self, n: int) -> int:
        slot = self._next_slot
        self._next_slot += 1
        to = self._region[0] if self._region is not None and self._stream == 0 else self._to
        to.append(("alloc", slot, max(int(n), 1)))
        return _slot_address(slot)

    def release(self, buffer) -> None:
        self._to.append(("release", (int(buffer) >> SLOT_SHIFT) - 1, 0))

    def entries(self, array_, start: int, count: int, storage: str) -> int:
        return int(array_) + ITEMSIZE[storage] * int(start)

    def view(self, buffer, start: int, count: int) -> int:
        return int(buffer) + 4 * int(start)

    def typed_view(self, buffer, start: int, count: int, storage: str) -> int:
        return self.view(buffer, start, count)

    def call(self, function, grid, block, args, shared_bytes) -> None:
        values = [int(a) for a in args]
        patches = tuple((i, (v >> SLOT_SHIFT) - 1, v & _OFFSET_MASK)
                        for i, v in enumerate(values) if v >> SLOT_SHIFT)
        for i, _, _ in patches:
            values[i] = 0
        self._to.append(("launch", Launch(int(function), int(grid), int(block),
                                          int(shared_bytes), array("Q", values), patches),
                         self._stream))


def run_direct(backend, problem: Problem, backward: bool, arrays,
               tuning: Tuning = Tuning()) -> None:
    """Plan and launch one call through the planner, its arrays given in slot order.

    Parameters
    ----------
    backend : object
        A launch backend (see :func:`~wtconv_cuda.kernels.launch.run_forward`).
    problem : Problem
        The layer call.
    backward : bool
        Run :func:`~wtconv_cuda.kernels.launch.run_backward` (arrays ``x, dy,
        dx``, the five weights, the five gradients) instead of
        :func:`~wtconv_cuda.kernels.launch.run_forward` (``x, y``, the five
        weights).
    arrays : sequence
        The backend's arrays (or addresses), `BACKWARD_SLOTS` or
        `FORWARD_SLOTS` of them.
    tuning : Tuning, optional
        Launch-shape overrides.
    """
    a = arrays
    if backward:
        run_backward(backend, problem, a[0], a[1], a[2], Weights(*a[3:8]), Weights(*a[8:13]),
                     tuning)
    else:
        run_forward(backend, problem, a[0], a[1], Weights(*a[2:7]), tuning)


def record(problem: Problem, backward: bool, shared_limit: int, max_slots: int,
           function_of: Callable, table_address: Callable,
           tuning: Tuning = Tuning()) -> Program | None:
    """Record the launches of one forward or backward call of ``problem``.

    Parameters
    ----------
    problem : Problem
        The layer call (``B >= 1``).
    backward : bool
        Record :func:`~wtconv_cuda.kernels.launch.run_backward` instead of
        :func:`~wtconv_cuda.kernels.launch.run_forward`.
    shared_limit, max_slots : int
        The device's limits, as the backend reports them.
    function_of : callable
        ``function_of(spec) -> int or None``: the loaded kernel's ``CUfunction``
        handle (None where there is none).
    table_address : callable
        ``table_address(values) -> int``: the device address of a cached,
        uploaded copy of an int64 table that outlives the program.
    tuning : Tuning, optional
        Launch-shape overrides.

    Returns
    -------
    Program or None
        None when a kernel has no driver handle (launch through the planner).
    """
    slots = BACKWARD_SLOTS if backward else FORWARD_SLOTS
    recorder = _Recorder(shared_limit, max_slots, function_of, table_address, slots)
    try:
        run_direct(recorder, problem, backward, [_slot_address(s) for s in range(slots)],
                   tuning)
    except _NoDriverHandle:
        return None
    return Program(slots, tuple(recorder.steps))
