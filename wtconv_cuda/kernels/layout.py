"""Geometry of one plane's on-chip working set.

The fused kernels keep a whole ``(H, W)`` plane and its wavelet pyramid in one
float32 buffer (shared memory when it fits, otherwise a slot of global
scratch); a block that runs several planes side by side holds one such buffer
per plane. This module is the single place where that buffer is laid
out; the kernels read the result from a small int64 table (``geo``), so host
and device can never disagree about an offset.

Buffer layout, in float32 elements::

    [ folded weights | region A: source grids 0..L-1 | region B | unit sums ]

and, for the backward that computes the weight gradients alone
(``weights_only``: ``dx`` comes from the forward kernels)::

    [ region A: the x pyramid | gradient grids 0..L-1 | partial sums | unit sums ]

* *Folded weights*: ``K*K`` base taps, then ``4*K*K`` taps per level (scale and
  the Haar factor 1/2 folded in), then the folded bias.
* *Source grid j* holds level j's raw LL coefficients (grid 0 is the input
  plane) in *polyphase* form: four planes, one per (row parity, column
  parity), each ``ceil(H_j/2) x ceil(W_j/2)`` with a zero halo of
  ``R = (K-1)//2`` on every side (``2R`` at full resolution). The 2x2 Haar
  block of coefficient ``q`` is then the same index ``q`` in the four planes,
  so neighbouring threads read neighbouring words (no bank conflicts), and the
  halo makes every tap an unconditional load. Plane pitches are odd, so
  threads that walk different rows do not collide either.
* *Region B* holds the convolved subbands ``z_j`` (four ``H_j x W_j`` planes per
  level). The backward kernel later reuses region B for a second copy of
  region A's geometry (the ``x`` pyramid) plus the weight-gradient partial
  sums of one plane.
* *Unit sums* (backward only, at ``w_off``): the ``ntaps`` weight-gradient
  sums of the work unit, added up over its ``rb`` planes (one channel,
  consecutive batch entries) and written out once per unit.
* *Gradient grids* (``weights_only`` only): the ``dy`` pyramid, polyphase
  like region A but without halos (``dy`` is only read at the coefficient it
  multiplies, never shifted) and without the strip's row rounding; their
  offsets, pitches and phase strides are the level fields ``gsrc``,
  ``gpitch`` and ``gphase``. Elsewhere those fields repeat ``src``,
  ``pitch`` and ``phase`` (the ``dy`` pyramid is region A itself). Without
  the folded weights, the subbands and the halos, the working set of a 56 x
  56 plane at L 5, K 5 drops from 68.5 KB to 55.5 KB: four blocks per SM
  instead of three.
* *Level-tap work items* (backward): level ``j``'s tap gradients split its
  rows into ``chunks`` chunks; its ``K * chunks`` work items (tap row, chunk)
  start at item ``item0`` of the list of its phase, the levels up to
  ``phase_last`` that run side by side (:func:`level_tap_plan`). Level 0's
  three fields are 0 (the base taps plan their own chunks).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

#: Names of the header entries of the ``geo`` table, in order.
HEADER_FIELDS = (
    "H", "W", "Hin", "Win", "Hout", "Wout", "L", "C", "nplanes", "slot",
    "a_off", "a_len", "xb_off", "p_off", "has_bias", "bchunk", "w_off",
)
HEADER = {name: i for i, name in enumerate(HEADER_FIELDS)}
#: Per-level fields, ``LEVEL_FIELDS`` entries for each level 0..L.
LEVEL_FIELDS = ("Hj", "Wj", "src", "pitch", "phase", "z", "gsrc", "gpitch", "gphase",
                "chunks", "item0", "phase_last")
LEVEL_BASE = len(HEADER_FIELDS)
LEVEL_STRIDE = len(LEVEL_FIELDS)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


def _odd_pitch(a: int) -> int:
    """``a`` rounded up to odd: row-strided accesses then spread over all banks."""
    return a + 1 - a % 2


def level_shapes(h: int, w: int, levels: int) -> list[tuple[int, int]]:
    """Grid sizes ``(H_j, W_j)`` for ``j = 0..levels`` (sizes halve with ceil).

    Parameters
    ----------
    h, w : int
        Size of grid 0 (the full-resolution plane).
    levels : int
        Wavelet levels ``L >= 0``.

    Returns
    -------
    list of tuple of int
        ``levels + 1`` pairs; entry ``j`` is ``(ceil(h / 2**j), ceil(w / 2**j))``.
    """
    shapes = [(h, w)]
    for _ in range(levels):
        h, w = _ceil_div(h, 2), _ceil_div(w, 2)
        shapes.append((h, w))
    return shapes


def row_chunks(rows: int, kernel_size: int, threads: int) -> int:
    """Number of row chunks the weight-gradient correlation splits a grid into.

    Each ``(tap row, chunk)`` pair is one thread's work item, so at most
    ``threads // K`` chunks keep every item on its own thread.

    Parameters
    ----------
    rows : int
        Rows of the grid being correlated.
    kernel_size : int
        Odd ``K``.
    threads : int
        Threads per plane.

    Returns
    -------
    int
        ``max(1, min(rows, threads // kernel_size))``.
    """
    return max(1, min(rows, threads // kernel_size))


#: Per-row cost of a level-tap work item beyond its coefficients, in
#: coefficient steps (the window's first ``K - 1`` blocks and the row's setup).
ROW_OVERHEAD = 2
#: Cost of one phase of level-tap work items beyond its longest item, in
#: coefficient steps: two barriers and the reduction of its partial sums.
PHASE_OVERHEAD = 8


class LevelTapPlan(NamedTuple):
    """How the tap gradients of levels 1..L are shared out among a plane's threads.

    The levels run in phases of consecutive levels; within a phase every
    level's work items (tap row, chunk of rows) form one list, one item per
    thread (where ``K`` exceeds the threads per plane, one chunk per level and
    threads take items in turn), followed by a barrier and the reduction of
    the phase's partial sums.

    Attributes
    ----------
    chunks : tuple of int
        Row chunks of levels 1..L.
    phase_last : tuple of int
        For each level 1..L, the last level of its phase.
    items : int
        Work items of the longest phase (the partial sums it needs: ``4 K``
        floats each).
    """

    chunks: tuple
    phase_last: tuple
    items: int


def _phase_chunks(levels, kernel_size: int, budget: int):
    """``(cost, chunks)`` of one phase over ``levels`` (``(H_j, W_j)`` pairs): the fewest
    chunks that keep its longest item shortest within ``budget`` items, or None."""
    costs = sorted({rows * (wj + ROW_OVERHEAD) for hj, wj in levels
                    for rows in range(1, hj + 1)})
    for cost in costs:
        rows = [min(hj, cost // (wj + ROW_OVERHEAD)) for hj, wj in levels]
        if min(rows) < 1:
            continue
        chunks = [_ceil_div(hj, r) for (hj, _), r in zip(levels, rows)]
        if kernel_size * sum(chunks) <= budget:
            return cost, chunks
    return None


@lru_cache(maxsize=256)
def level_tap_plan(shapes: tuple, kernel_size: int, threads: int) -> LevelTapPlan:
    """Phases and row chunks of the level taps' gradients (backward kernels).

    A phase's list holds at most ``K * row_chunks(H_1)`` items, what level 1
    alone takes with one item per thread (so its partial sums fit in that
    space). Within a phase the chunks are the fewest that keep the longest
    item shortest, an item of ``r`` rows of ``W_j`` coefficients costing ``r *
    (W_j + ROW_OVERHEAD)``; the phases are the split of levels 1..L that
    minimises the sum of their longest items plus ``PHASE_OVERHEAD`` each. One
    level per phase with one item per thread is always a candidate, so the
    plan is never longer, by this count, than running the levels one by one.

    Parameters
    ----------
    shapes : tuple of tuple of int
        ``(H_j, W_j)`` for ``j = 0..L`` (:func:`level_shapes`).
    kernel_size : int
        Odd ``K``.
    threads : int
        Threads per plane.

    Returns
    -------
    LevelTapPlan
        Empty tuples and 0 items for ``L = 0``.
    """
    levels = list(shapes[1:])
    if not levels:
        return LevelTapPlan((), (), 0)
    budget = kernel_size * row_chunks(levels[0][0], kernel_size, threads)
    # best[i]: (cost, phases) of levels i.. (0-based), phases as (last, chunks)
    best = [None] * len(levels) + [(0, [])]
    for i in range(len(levels) - 1, -1, -1):
        for last in range(i, len(levels)):
            phase = _phase_chunks(levels[i:last + 1], kernel_size, budget)
            if phase is None or best[last + 1] is None:
                continue
            cost = phase[0] + PHASE_OVERHEAD + best[last + 1][0]
            if best[i] is None or cost < best[i][0]:
                best[i] = (cost, [(last, phase[1])] + best[last + 1][1])
    chunks, phase_last, items = [], [], 0
    for last, phase in best[0][1]:
        chunks += phase
        phase_last += [last + 1] * len(phase)
        items = max(items, kernel_size * sum(phase))
    return LevelTapPlan(tuple(chunks), tuple(phase_last), items)


class PlaneLayout(NamedTuple):
    """Host view of a plane kernel's buffer layout.

    Attributes
    ----------
    geo : numpy.ndarray
        int64 table passed to the kernel (header, then one entry per level).
    slot_floats : int
        float32 elements of one plane's working buffer (one slot; a block
        holds one slot per plane it runs).
    ntaps : int
        Weight-gradient entries per plane: ``K*K`` base taps, one bias entry,
        ``4*K*K`` taps per level.
    """

    geo: np.ndarray
    slot_floats: int
    ntaps: int


def weight_region(kernel_size: int, levels: int) -> int:
    """float32 elements of the folded-weight region (rounded up to 4).

    Parameters
    ----------
    kernel_size : int
        Odd ``K``.
    levels : int
        Wavelet levels ``L``.

    Returns
    -------
    int
        ``(1 + 4L) K^2`` folded taps and the bias, rounded up to a multiple
        of 4.
    """
    return _round_up(bias_index(kernel_size, levels) + 1, 4)


def bias_index(kernel_size: int, levels: int) -> int:
    """Index of the folded bias inside the folded-weight region.

    Parameters
    ----------
    kernel_size : int
        Odd ``K``.
    levels : int
        Wavelet levels ``L``.

    Returns
    -------
    int
        ``(1 + 4L) K^2``: the bias follows the base taps and every level's taps.
    """
    return (1 + 4 * levels) * kernel_size * kernel_size


@lru_cache(maxsize=256)
def plane_layout(h: int, w: int, levels: int, kernel_size: int, strip: int,
                 threads: int, in_stride: int, out_stride: int,
                 backward: bool, weights_only: bool = False,
                 blocked: bool = False) -> PlaneLayout:
    """Lay out one plane's working buffer.

    Parameters
    ----------
    h, w : int
        Working grid of the plane (the full-resolution ``x`` grid).
    levels : int
        Wavelet levels ``L >= 0``.
    kernel_size : int
        Odd ``K``.
    strip : int
        Coefficient rows per thread (``Q``), a compile-time constant of the
        kernel.
    threads : int
        Threads per plane (one thread group of a block); bounds the number of
        row chunks of the weight-gradient phase (:func:`row_chunks`,
        :func:`level_tap_plan`).
    in_stride, out_stride : int
        Upsampling factor of the input plane (backward: ``stride``) and
        subsampling factor of the output (forward: ``stride``).
    backward : bool
        Reserve the backward kernel's extra space (``x`` pyramid, partials).
    weights_only : bool, default False
        Lay out the backward that computes the weight gradients alone: no
        folded weights, no subbands; region A holds the ``x`` pyramid and the
        ``dy`` pyramid follows it in halo-less gradient grids.
    blocked : bool, default False
        ``weights_only`` with the register-blocked correlations
        (:mod:`wtconv_cuda.kernels.weight_blocks`): the partial-sum region
        grows where their phases need more than the default phase.

    Returns
    -------
    PlaneLayout
        The table, the buffer size and the number of gradient taps.

    Raises
    ------
    ValueError
        ``weights_only`` without ``backward``, ``blocked`` without
        ``weights_only``, or ``blocked`` for a plane without a blocked plan.
    """
    if weights_only and not backward:
        raise ValueError("weights_only is a backward layout")
    if blocked and not weights_only:
        raise ValueError("blocked is a weights_only layout")
    radius = (kernel_size - 1) // 2
    shapes = level_shapes(h, w, levels)
    hin, win = _ceil_div(h, in_stride), _ceil_div(w, in_stride)
    hout, wout = _ceil_div(h, out_stride), _ceil_div(w, out_stride)

    wreg = 0 if weights_only else weight_region(kernel_size, levels)
    # Region A: source grids 0..max(L-1, 0), four phase planes each.
    srcs, pitches, phases = [], [], []
    offset = wreg
    for j in range(max(levels, 1)):
        hj, wj = shapes[j]
        rows = _round_up(_ceil_div(hj, 2), strip) + 2 * radius
        pitch = _odd_pitch(_ceil_div(wj, 2) + 2 * radius)
        srcs.append(offset)
        pitches.append(pitch)
        phases.append(rows * pitch)
        offset += 4 * rows * pitch
    a_off, a_len = wreg, offset - wreg

    if weights_only:  # x is region A; the dy pyramid follows, without halos
        xb_off = a_off
        gsrcs, gpitches, gphases = [], [], []
        for j in range(max(levels, 1)):
            hj, wj = shapes[j]
            pitch = _odd_pitch(_ceil_div(wj, 2))
            gsrcs.append(offset)
            gpitches.append(pitch)
            gphases.append(_ceil_div(hj, 2) * pitch)
            offset += 4 * gphases[-1]
        p_off = offset
        z_offs = [0] * (levels + 1)
    else:
        gsrcs, gpitches, gphases = srcs, pitches, phases
        # Region B: the convolved subbands z_1..z_L.
        z_offs = [0]
        for j in range(1, levels + 1):
            hj, wj = shapes[j]
            z_offs.append(offset)
            offset += 4 * hj * wj
        xb_off = p_off = 0
        if backward:
            xb_off = a_off + a_len  # x pyramid: region A's geometry, shifted
            p_off = xb_off + a_len
    slot = offset
    chunks, phase_last, item0 = [0] * (levels + 1), [0] * (levels + 1), [0] * (levels + 1)
    if backward:
        taps = level_tap_plan(tuple(shapes), kernel_size, threads)
        chunks[1:], phase_last[1:] = taps.chunks, taps.phase_last
        for j in range(2, levels + 1):  # a phase's items follow on from its previous level's
            if phase_last[j - 1] == phase_last[j]:
                item0[j] = item0[j - 1] + kernel_size * chunks[j - 1]
        chunks0 = row_chunks(h, kernel_size, threads)
        partial = max(kernel_size * chunks0 * kernel_size + chunks0,
                      taps.items * 4 * kernel_size)
        if blocked:
            from .weight_blocks import blocked_plan
            plan = blocked_plan(h, w, levels, kernel_size, strip, threads)
            if plan is None:
                raise ValueError(f"no register-blocked plan for a {h} x {w} plane, L {levels}, "
                                 f"K {kernel_size}, {threads} threads")
            partial = max(partial, plan.partial_floats)
        slot = max(slot, p_off + partial)

    ntaps = kernel_size * kernel_size + 1 + 4 * levels * kernel_size * kernel_size
    w_off = 0
    if backward:  # the unit's weight-gradient sums, kept across its planes
        w_off = slot
        slot = w_off + _round_up(ntaps, 4)

    header = dict(H=h, W=w, Hin=hin, Win=win, Hout=hout, Wout=wout, L=levels, C=0,
                  nplanes=0, slot=slot, a_off=a_off, a_len=a_len, xb_off=xb_off, p_off=p_off,
                  has_bias=0, bchunk=1, w_off=w_off)
    geo = np.zeros(LEVEL_BASE + LEVEL_STRIDE * (levels + 1), dtype=np.int64)
    for name, value in header.items():
        geo[HEADER[name]] = value
    for j in range(levels + 1):
        base = LEVEL_BASE + LEVEL_STRIDE * j
        geo[base + 0], geo[base + 1] = shapes[j]
        geo[base + 2] = srcs[j] if j < len(srcs) else 0
        geo[base + 3] = pitches[j] if j < len(pitches) else 0
        geo[base + 4] = phases[j] if j < len(phases) else 0
        geo[base + 5] = z_offs[j]
        geo[base + 6] = gsrcs[j] if j < len(gsrcs) else 0
        geo[base + 7] = gpitches[j] if j < len(gpitches) else 0
        geo[base + 8] = gphases[j] if j < len(gphases) else 0
        geo[base + 9] = chunks[j]
        geo[base + 10] = item0[j]
        geo[base + 11] = phase_last[j]
    geo.setflags(write=False)
    return PlaneLayout(geo, slot, ntaps)


def with_problem(layout: PlaneLayout, channels: int, planes: int, has_bias: bool,
                 batch_chunk: int = 1) -> np.ndarray:
    """Copy of ``layout.geo`` with the problem-size header entries filled in.

    Parameters
    ----------
    layout : PlaneLayout
        Layout from :func:`plane_layout` (its table is left unchanged).
    channels : int
        Channels ``C`` (header entry ``C``).
    planes : int
        Planes in the launch, ``B * C`` (header entry ``nplanes``).
    has_bias : bool
        Whether the layer has a bias (header entry ``has_bias``, 0 or 1).
    batch_chunk : int, default 1
        Batch entries per work unit of the backward kernel, ``rb`` (header
        entry ``bchunk``): a unit runs planes ``(b, c)`` for ``rb`` consecutive ``b``
        of one channel and writes one weight-gradient partial.

    Returns
    -------
    numpy.ndarray, shape (len(layout.geo),), int64
        A new, writable table.
    """
    geo = layout.geo.copy()
    geo[HEADER["C"]] = channels
    geo[HEADER["nplanes"]] = planes
    geo[HEADER["has_bias"]] = int(has_bias)
    geo[HEADER["bchunk"]] = batch_chunk
    return geo
