"""Register-blocked weight-gradient correlations of the ``weights_only`` plane kernel.

A weight gradient is a correlation, ``sum_p x[p + d] g[p]`` for every tap
offset ``d`` (``g`` is ``dy``, or a subband of its pyramid). The plane
kernel's default phase (:func:`wtconv_cuda.kernels.codegen._emit_weight_gradients`)
gives a thread one tap row and a chunk of rows, so every loaded ``g`` feeds
``K`` taps and every loaded ``x`` at most ``K``: about 2.5 fused multiply-adds
per shared load at K 5, and the level taps form each Haar butterfly again for
every tap row (16 adds per 20 multiply-adds). Here a thread instead owns a
*block* of ``R x N`` values of ``g`` and all ``K * K`` taps:

* it loads the block into registers (in pieces of `SUB_VALUES` values), then
  walks the ``R + K - 1`` rows of ``x`` the piece meets, each value once,
  adding every product that value takes part in as soon as it is loaded
  (``K * K * R * N`` multiply-adds for about ``R N + (R + K - 1)(N + K - 1)``
  loads: 700 for 160 at 2 x 14, K 5);
* the levels' subbands are formed once, in place (the Haar butterfly of each
  2 x 2 block of a polyphase grid lands on the same index of its four phase
  planes, and subband ``k`` is then phase plane ``k``), so a level block
  reads plain ``Hj x Wj`` planes and does no adds;
* every offset is a constant of the variant (``PlaneSpec.plane`` compiles the
  plane's geometry in), so a block's code is straight-line loads and
  multiply-adds from two base addresses.

Phases (each one barrier, then its reduction): the base taps and the bias on
blocks of 2 pixel rows by ``N`` columns of the polyphase grid 0 (their
offsets stay constant when a block starts on an even pixel), while the other
threads form the subbands of grids ``1..L-1``; then grid 0's subbands; then
the levels, in the phases :func:`blocked_plan` chose by a cost model of the
slowest warp that counts bank conflicts (consecutive lanes take consecutive
blocks down a column, an odd pitch apart). A phase's blocks write
their ``K * K`` sums (and the bias) into the partial-sum region, one slot per
block (two blocks' sums added into one slot first where the region is too
small: ``fold``), and ``(group, tap)`` reducers add each group's slots in a
fixed order into the unit sums (deterministic). A thread's products for one
tap are added in a fixed order too (pieces, then rows, then columns), so the result
differs from the default phase's only by float32 summation order.

The in-place subbands overwrite the padding of odd-sized grids (the zero
value past an odd edge), which the loads and the raw-LL chain of the next
plane never write; the last phase therefore zeroes those positions again.
"""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext
from functools import lru_cache
from itertools import product
from typing import NamedTuple

from .layout import (
    HEADER, LEVEL_BASE, LEVEL_FIELDS, LEVEL_STRIDE, level_shapes, plane_layout,
)

#: Most values a thread's block keeps live: ``K * K`` sums, the block of ``g``,
#: one row of ``x`` and the bias (ptxas adds addresses and temporaries).
BLOCK_VALUES = 72
#: Values of a block's ``g`` live at once: it runs in pieces of ``SUB_VALUES // rows``
#: columns (:func:`_emit_products`).
SUB_VALUES = 14
#: Instructions of a block beyond its loads and multiply-adds (decode, stores), and of
#: a phase beyond its slowest warp (barriers, fold, reduction), for the cost model.
BLOCK_OVERHEAD = 40
PHASE_OVERHEAD = 200
#: Shared-memory wavefronts per cycle of an SM against instructions issued per cycle.
ISSUE_PER_WAVEFRONT = 4


class BlockRun(NamedTuple):
    """The blocks of one level in one phase.

    Attributes
    ----------
    level : int
        0: the base taps (blocks of pixels of grid 0, polyphase); ``j >= 1``:
        level ``j``'s four subbands (blocks of coefficients).
    rows, cols : int
        Block shape ``R x N`` (the last row and column of blocks may be
        smaller).
    height, width : int
        Extent of the blocked plane (pixels, or level ``j``'s coefficients).
    """

    level: int
    rows: int
    cols: int
    height: int
    width: int

    @property
    def groups(self) -> int:
        """Independent correlations: 1 (base) or the 4 subbands."""
        return 1 if self.level == 0 else 4

    @property
    def block_rows(self) -> int:
        """Blocks down a column (``nbi``)."""
        return -(-self.height // self.rows)

    @property
    def block_cols(self) -> int:
        """Blocks along a row (``nbj``)."""
        return -(-self.width // self.cols)

    @property
    def blocks(self) -> int:
        """Blocks of one group (one work item each)."""
        return self.block_rows * self.block_cols

    @property
    def items(self) -> int:
        """Work items of the run: ``groups * blocks``, numbered group by group, then
        column of blocks by column, down each column (consecutive lanes step down a
        column: an odd pitch apart, so they read different banks)."""
        return self.groups * self.blocks

    def decode(self, u: int) -> tuple:
        """``(k, bi, bj)`` of item ``u`` of the run."""
        k, rem = divmod(u, self.blocks)
        bj, bi = divmod(rem, self.block_rows)
        return k, bi, bj

    def shape(self, bi: int, bj: int) -> tuple:
        """Rows and columns of block ``(bi, bj)`` (the last ones may be cut)."""
        return (min(self.rows, self.height - bi * self.rows),
                min(self.cols, self.width - bj * self.cols))


class BlockPhase(NamedTuple):
    """One phase of the blocked correlations.

    Attributes
    ----------
    runs : tuple of BlockRun
        Its levels (items numbered run by run).
    lanes : int
        Lanes of each warp that take an item (item ``32 w + l`` of a phase is
        thread ``32 w + l`` where ``lanes`` is 32; otherwise warp ``w``'s lane
        ``l < lanes`` takes item ``lanes w + l``), so that a column of blocks
        can fill a warp alone.
    fold : bool
        Odd blocks add their sums into their even neighbour's slot first.
    slices : int
        Reducers per ``(group, tap)``; above 1 a second pass adds the slices.
    width : int
        float32 words a slot holds (odd: ``K * K`` taps, plus bias and a pad
        word in the base phase).
    """

    runs: tuple
    lanes: int
    fold: bool
    slices: int
    width: int

    @property
    def items(self) -> int:
        """Work items of the phase."""
        return sum(run.items for run in self.runs)

    @property
    def threads(self) -> int:
        """Threads the phase's items need (one each)."""
        if self.lanes == 32:
            return self.items
        warps, last = divmod(self.items, self.lanes)
        return 32 * warps + last

    def slots(self, run: BlockRun) -> int:
        """Slots of one group of ``run``."""
        return -(-run.blocks // 2) if self.fold else run.blocks

    def taps(self, run: BlockRun, kernel_size: int) -> int:
        """Sums a group of ``run`` reduces: ``K * K``, and the bias in the base phase."""
        return kernel_size ** 2 + (run.level == 0)

    def pairs(self, kernel_size: int) -> int:
        """``(group, tap)`` reductions of the phase."""
        return sum(run.groups * self.taps(run, kernel_size) for run in self.runs)

    @property
    def slot_floats(self) -> int:
        """float32 words of the phase's slots (the slices' sums follow them)."""
        return sum(run.groups * self.slots(run) for run in self.runs) * self.width

    def floats(self, kernel_size: int) -> int:
        """float32 words of the partial-sum region the phase uses."""
        second = self.pairs(kernel_size) * self.slices if self.slices > 1 else 0
        return self.slot_floats + second


class BlockedPlan(NamedTuple):
    """The phases of the blocked correlations of one plane (:func:`blocked_plan`).

    Attributes
    ----------
    phases : tuple of BlockPhase
        The base phase first, then the level phases in level order.
    partial_floats : int
        float32 words of partial-sum region the phases need.
    """

    phases: tuple
    partial_floats: int


class Grids(NamedTuple):
    """Constant offsets of the grids the correlations read (from the level table).

    Attributes
    ----------
    xsrc, gsrc : tuple of tuple of int
        ``(offset, pitch, phase stride)`` of grid ``j`` of the ``x`` pyramid
        (``xshift`` included) and of the ``dy`` pyramid, ``j = 0..max(L, 1) - 1``.
    shapes : tuple of tuple of int
        ``(H_j, W_j)``, ``j = 0..L``.
    radius : int
        ``(K - 1) // 2``: the ``x`` grids' halo, in coefficients.
    """

    xsrc: tuple
    gsrc: tuple
    shapes: tuple
    radius: int


def grids_of(geo, kernel_size: int) -> Grids:
    """The :class:`Grids` of a ``weights_only`` level table.

    Parameters
    ----------
    geo : numpy.ndarray, int64
        The table of :func:`~wtconv_cuda.kernels.layout.plane_layout` (header
        and level entries; the problem fields are not read).
    kernel_size : int
        Odd ``K``.

    Returns
    -------
    Grids
    """
    L = int(geo[HEADER["L"]])

    def at(j, name):
        return int(geo[LEVEL_BASE + LEVEL_STRIDE * j + LEVEL_FIELDS.index(name)])

    xshift = int(geo[HEADER["xb_off"]]) - int(geo[HEADER["a_off"]])
    xs = tuple((at(j, "src") + xshift, at(j, "pitch"), at(j, "phase")) for j in range(max(L, 1)))
    gs = tuple((at(j, "gsrc"), at(j, "gpitch"), at(j, "gphase")) for j in range(max(L, 1)))
    shapes = tuple((at(j, "Hj"), at(j, "Wj")) for j in range(L + 1))
    return Grids(xs, gs, shapes, (kernel_size - 1) // 2)


def block_bases(run: BlockRun, grids: Grids, k: int, bi: int, bj: int) -> tuple:
    """Offsets of a block's first ``x`` and ``g`` values; every load of the block adds a
    constant to one of them.

    Parameters
    ----------
    run : BlockRun
        The block's level and shape.
    grids : Grids
        The variant's grids.
    k, bi, bj : int
        Subband (0 for the base taps), block row and block column.

    Returns
    -------
    tuple of int
        ``(x offset, g offset)`` in float32 words from the slot's start.
    """
    if run.level == 0:  # a block starts on an even pixel row and column of grid 0
        (xo, xp, _), (go, gp, _) = grids.xsrc[0], grids.gsrc[0]
        half = run.cols // 2
        return xo + bi * xp + bj * half, go + bi * gp + bj * half
    (xo, xp, xph), (go, gp, gph) = grids.xsrc[run.level - 1], grids.gsrc[run.level - 1]
    return (xo + k * xph + bi * run.rows * xp + bj * run.cols,
            go + k * gph + bi * run.rows * gp + bj * run.cols)


def _piece_cols(rows: int) -> int:
    """Columns of a piece of a block of ``rows`` rows (:func:`_emit_products`)."""
    return max(1, SUB_VALUES // rows)


def _block_counts(K: int, rows: int, cols: int, bias: bool) -> tuple:
    """``(g loads, x loads, other instructions)`` of one block (:func:`_emit_products`)."""
    piece = _piece_cols(rows)
    x = sum((rows + K - 1) * (min(cols, c0 + piece) - c0 + K - 1)
            for c0 in range(0, cols, piece))
    return rows * cols, x, K * K * rows * cols + (rows * cols if bias else 0) + BLOCK_OVERHEAD


def _ways(addresses) -> int:
    """Wavefronts of one warp-wide 32-bit shared load from these addresses."""
    return max(Counter(a % 32 for a in set(addresses)).values())


def phase_cost(runs: tuple, lanes: int, kernel_size: int, grids: Grids) -> int:
    """The cost model: the slowest warp of a phase, in instructions.

    A warp costs its blocks' loads, multiply-adds and overhead, or
    `ISSUE_PER_WAVEFRONT` times their shared-memory wavefronts where those
    take longer. Lanes on blocks of one shape run one instruction stream
    (their bank conflicts counted: the most distinct words one bank serves);
    blocks of different shapes run one after the other.

    Parameters
    ----------
    runs : tuple of BlockRun
        The phase's levels, items numbered run by run.
    lanes : int
        Lanes of a warp that take an item (see :class:`BlockPhase`).
    kernel_size : int
        Odd ``K``.
    grids : Grids
        The variant's grids (their pitches and phase strides set the banks).

    Returns
    -------
    int
    """
    K = kernel_size
    items = [(run, *run.decode(u)) for run in runs for u in range(run.items)]
    worst = 0
    for w0 in range(0, len(items), lanes):
        streams = {}
        for run, k, bi, bj in items[w0:w0 + lanes]:
            streams.setdefault((run, run.shape(bi, bj)), []).append(
                block_bases(run, grids, k, bi, bj))
        issue = wavefronts = 0
        for (run, (rows, cols)), bases in streams.items():
            gloads, xloads, other = _block_counts(K, rows, cols, run.level == 0)
            issue += gloads + xloads + other
            wavefronts += (gloads * _ways(b[1] for b in bases)
                           + xloads * _ways(b[0] for b in bases))
        worst = max(worst, issue, ISSUE_PER_WAVEFRONT * wavefronts)
    return worst


def _fits(kernel_size: int, rows: int, cols: int) -> bool:
    piece = min(cols, _piece_cols(rows))
    return kernel_size ** 2 + rows * piece + piece + kernel_size - 1 + 1 <= BLOCK_VALUES


def _lane_choices(runs: tuple) -> list:
    """Lanes per warp worth trying: 32, and whole columns of blocks of a run per warp."""
    out = {32}
    for run in runs:
        if run.block_rows < 32:
            out.update(m * run.block_rows for m in range(1, 32 // run.block_rows + 1))
    return sorted(out)


def _best_lanes(runs: tuple, kernel_size: int, threads: int, grids: Grids):
    """The cheapest ``(cost, lanes)`` of ``runs`` in one phase, or None where no choice
    of lanes leaves one item per thread."""
    best = None
    for lanes in _lane_choices(runs):
        if BlockPhase(runs, lanes, False, 1, 1).threads > threads:
            continue
        cost = phase_cost(runs, lanes, kernel_size, grids)
        if best is None or (cost, -lanes) < (best[0], -best[1]):
            best = (cost, lanes)
    return best


def _level_runs(level: int, shape: tuple, kernel_size: int, cap: int) -> list:
    """Candidate runs of level ``level`` with blocks of at most ``cap`` values: for each
    block height the widest blocks."""
    out = []
    for rows in (1, 2):
        cols = min(shape[1], cap // rows)
        if cols >= 1 and rows <= shape[0] and _fits(kernel_size, rows, cols):
            out.append(BlockRun(level, rows, cols, *shape))
    return out


def _level_phase(levels: list, shapes: list, kernel_size: int, threads: int, grids: Grids):
    """The cheapest ``(cost, runs, lanes)`` that runs ``levels`` side by side in one phase:
    over block-size caps, each level's candidates (:func:`_level_runs`) in turn."""
    best = None
    for cap in range(1, 2 * max(shapes[j][1] for j in levels) + 1):
        options = [_level_runs(j, shapes[j], kernel_size, cap) for j in levels]
        if not all(options):
            continue
        for runs in product(*options):
            if sum(run.items for run in runs) > threads:
                continue
            found = _best_lanes(tuple(runs), kernel_size, threads, grids)
            if found and (best is None or found[0] < best[0]):
                best = (found[0], tuple(runs), found[1])
    return best


def _phase(runs: tuple, lanes: int, kernel_size: int, threads: int,
           capacity: int) -> BlockPhase:
    width = kernel_size ** 2 + (2 if runs[0].level == 0 else 0)
    phase = BlockPhase(runs, lanes, False, 1, width)
    if phase.floats(kernel_size) > capacity:
        phase = phase._replace(fold=True)
    pairs = phase.pairs(kernel_size)
    fewest = min(phase.slots(run) for run in runs)
    slices = max(1, min(threads // pairs, fewest // 4))
    if slices > 1 and phase._replace(slices=slices).floats(kernel_size) <= capacity:
        phase = phase._replace(slices=slices)
    return phase


@lru_cache(maxsize=256)
def blocked_plan(height: int, width: int, levels: int, kernel_size: int, strip: int,
                 threads: int) -> BlockedPlan | None:
    """Phases, block shapes and lane use of the blocked correlations of one plane.

    Every choice minimises :func:`phase_cost`, a model of the slowest warp
    (instructions, or shared-memory wavefronts with their bank conflicts). The
    base phase takes blocks of 2 pixel rows by an even number of columns; the
    levels are split into phases of consecutive levels (dynamic programming
    over the splits, as :func:`wtconv_cuda.kernels.layout.level_tap_plan`),
    each level with blocks of one or two rows under a common size cap. A
    phase has at most one item per thread, and its lanes per warp are 32 or
    whole columns of blocks.

    Parameters
    ----------
    height, width : int
        The plane.
    levels : int
        ``L >= 0``.
    kernel_size : int
        Odd ``K``.
    strip, threads : int
        The ``weights_only`` variant's (they set its default layout, whose
        grids the blocks read and whose partial-sum region the phases fold
        into where they can).

    Returns
    -------
    BlockedPlan or None
        None where a block of ``K * K`` sums does not fit `BLOCK_VALUES`, or
        a phase needs more items than threads.
    """
    K, T = kernel_size, threads
    layout = plane_layout(height, width, levels, K, strip, T, 1, 1, True, True)
    capacity = int(layout.geo[HEADER["w_off"]] - layout.geo[HEADER["p_off"]])
    grids = grids_of(layout.geo, K)
    shapes = level_shapes(height, width, levels)
    base = None
    for cols in range(2, width + 2, 2):
        if not _fits(K, 2, cols):
            break
        run = BlockRun(0, 2, cols, height, width)
        if run.items > T:
            continue
        found = _best_lanes((run,), K, T, grids)
        if found and (base is None or found[0] < base[0]):
            base = (found[0], (run,), found[1])
    if base is None:
        return None
    # best[i]: (cost, phases) of levels i + 1.. as (runs, lanes)
    best = [None] * levels + [(0, [])]
    for i in range(levels - 1, -1, -1):
        for last in range(i, levels):
            found = _level_phase(list(range(i + 1, last + 2)), shapes, K, T, grids)
            if found is None or best[last + 1] is None:
                continue
            cost = found[0] + PHASE_OVERHEAD + best[last + 1][0]
            if best[i] is None or cost < best[i][0]:
                best[i] = (cost, [found[1:]] + best[last + 1][1])
    if levels and best[0] is None:
        return None
    chosen = [base[1:]] + (best[0][1] if levels else [])
    phases = tuple(_phase(runs, lanes, K, T, capacity) for runs, lanes in chosen)
    return BlockedPlan(phases, max(phase.floats(K) for phase in phases))


def spec_plan(spec) -> BlockedPlan | None:
    """:func:`blocked_plan` of a ``weights_only`` spec with its plane compiled in.

    Parameters
    ----------
    spec : wtconv_cuda.kernels.codegen.PlaneSpec
        With ``plane = (H, W, L)``.

    Returns
    -------
    BlockedPlan or None
    """
    H, W, L = spec.plane
    return blocked_plan(H, W, L, spec.kernel_size, spec.strip, spec.threads)


def emit_blocked_weight_gradients(e, spec) -> None:
    """Emit the blocked correlations of one plane (after its raw-LL chains).

    Parameters
    ----------
    e : wtconv_cuda.kernels.codegen._Emitter
        With the level table compiled in (``spec.plane``).
    spec : wtconv_cuda.kernels.codegen.PlaneSpec
        A ``weights_only`` variant with ``blocked`` set.

    Raises
    ------
    ValueError
        :func:`blocked_plan` finds no plan for the plane.
    """
    plan = spec_plan(spec)
    if plan is None:
        raise ValueError(f"no register-blocked plan for {spec!r}")
    g = grids_of(e.geo, spec.kernel_size)
    L = spec.plane[2]
    red = int(e.geo[HEADER["p_off"]])
    e("# ---- weight gradients: register blocks (see weight_blocks.py) ----")
    for n, phase in enumerate(plan.phases):
        # Grid 0 keeps its pixels for the base taps; the other grids take their subbands
        # meanwhile, grid 0 after them. The last phase zeroes the grids' padding again.
        _emit_phase(e, spec, g, phase, n, red,
                    grids_during=range(1, L) if n == 0 else (),
                    grids_after=(0,) if n == 0 and L else (),
                    zero_padding=n == len(plan.phases) - 1)


def _emit_phase(e, spec, g: Grids, phase: BlockPhase, number: int, red: int,
                grids_during, grids_after, zero_padding: bool) -> None:
    """Phase ``number``: its blocks; the subbands of ``grids_during``; a barrier; the fold;
    the reduction, the subbands of ``grids_after`` and (``zero_padding``) the padding's
    zeros; a barrier; the slices' sums."""
    K2, w = spec.kernel_size ** 2, phase.width
    base = phase.runs[0].level == 0
    names = [f"ac{t}" for t in range(K2 + base)]
    lanes = phase.lanes
    e("# tv is tid, derived anew from the plane in each phase so that LLVM can neither",
      "# hoist a phase's indices and addresses out of the plane loop nor share them",
      "# between phases (they would stay live across phases: ptxas spilled 168-276 B at",
      "# 56 x 56 when they did).",
      f"tv = tid if plane > {-1 - number} else tid + 1",
      f"# phase: levels {', '.join(str(r.level) for r in phase.runs)}; "
      f"{phase.items} blocks, {lanes} lanes a warp" + (", folded in pairs" if phase.fold else ""),
      "vi = tv" if lanes == 32 else f"vi = (tv >> 5) * {lanes} + (tv & 31)",
      f"ok = vi < {phase.items}" if lanes == 32 else
      f"ok = (tv & 31) < {lanes} and vi < {phase.items}",
      " = ".join([", ".join(names), ", ".join("fz" for _ in names)]),
      "sl = int64(0)", "role = int64(0)")
    first, slot0 = 0, 0
    for n, run in enumerate(phase.runs):
        last = n == len(phase.runs) - 1
        e(("if ok and " if n == 0 else "elif ok and ") + f"vi < {first + run.items}:"
          if not last else ("if ok:" if n == 0 else "elif ok:"))
        with e.indent():
            _emit_run_item(e, spec, g, run, first, slot0, phase.slots(run), phase.fold)
        first += run.items
        slot0 += run.groups * phase.slots(run)
    stores = [f"S[sb + {red} + sl * {w} + {t}] = {name}" for t, name in enumerate(names)]
    if phase.fold:
        e("if ok and role == 1:")
        with e.indent():
            e(*stores)
        for j in grids_during:
            _emit_subbands(e, spec, g, j)
        e("cuda.syncthreads()", "if ok and role != 1:")
        with e.indent():
            e("if role == 2:")
            with e.indent():
                e(*(f"{name} += S[sb + {red} + sl * {w} + {t}]" for t, name in enumerate(names)))
            e(*stores)
    else:
        e("if ok:")
        with e.indent():
            e(*stores)
        for j in grids_during:
            _emit_subbands(e, spec, g, j)
    e("cuda.syncthreads()")
    _emit_reduction(e, spec, phase, red)
    for j in grids_after:
        _emit_subbands(e, spec, g, j)
    if zero_padding:
        _emit_padding_zeros(e, spec, g)
    e("cuda.syncthreads()")
    if phase.slices > 1:
        _emit_slice_sums(e, spec, phase, red)


def _emit_run_item(e, spec, g: Grids, run: BlockRun, first: int, slot0: int, slots: int,
                   fold: bool) -> None:
    """Item ``vi`` of ``run``: its block, its products and its slot (``sl``, ``role``)."""
    K, P = spec.kernel_size, g.radius
    nbi, nbj = run.block_rows, run.block_cols
    e(f"u = vi - {first}" if first else "u = vi")
    if run.groups > 1:
        e(f"k = u // {run.blocks}", f"u -= k * {run.blocks}")
    e(f"bj = u // {nbi}", f"bi = u - bj * {nbi}")
    j = run.level
    x0, g0 = block_bases(run, g, 0, 0, 0)
    xk, gk = (block_bases(run, g, 1, 0, 0)[0] - x0, block_bases(run, g, 1, 0, 0)[1] - g0)
    xi, gi = (block_bases(run, g, 0, 1, 0)[0] - x0, block_bases(run, g, 0, 1, 0)[1] - g0)
    xj, gj = (block_bases(run, g, 0, 0, 1)[0] - x0, block_bases(run, g, 0, 0, 1)[1] - g0)
    ks = (lambda step: f"k * {step} + ") if run.groups > 1 else (lambda step: "")
    e(f"xb = sb + {x0} + {ks(xk)}bi * {xi} + bj * {xj}",
      f"gb = sb + {g0} + {ks(gk)}bi * {gi} + bj * {gj}")
    group = f"k * {slots} + " if run.groups > 1 else ""
    b = f"bj * {nbi} + bi"
    if fold:
        e(f"b = {b}", f"sl = {slot0} + {group}(b >> 1)",
          f"role = int64(1) if (b & 1) == 1 else (int64(2) if b + 1 < {run.blocks} "
          "else int64(0))")
    else:
        e(f"sl = {slot0} + {group}{b}")
    if j == 0:  # pixels of the polyphase grid 0
        (_, xp, xph), (_, _, gph) = g.xsrc[0], g.gsrc[0]

        def goff(r, c):
            return (r & 1) * 2 * gph + (c & 1) * gph + (c >> 1)

        def xoff(i, c):
            oi, oc = i - P, c - P
            return ((oi & 1) * 2 * xph + (oc & 1) * xph + ((oi >> 1) + P) * xp
                    + (oc >> 1) + P)
    else:  # subband k of level j: phase plane k of grid j - 1, after the butterflies
        (_, xp, _), (_, gp, _) = g.xsrc[j - 1], g.gsrc[j - 1]

        def goff(r, c):
            return r * gp + c

        def xoff(i, c):
            return i * xp + c
    # the block's shape: cut at the last row or column of blocks (the corner first), else full
    R, N = run.rows, run.cols
    ri, rj = run.height - (nbi - 1) * R, run.width - (nbj - 1) * N
    cuts = []
    if ri < R and rj < N:
        cuts.append(((ri, rj), f"bi == {nbi - 1} and bj == {nbj - 1}"))
    if rj < N:
        cuts.append(((R, rj), f"bj == {nbj - 1}"))
    if ri < R:
        cuts.append(((ri, N), f"bi == {nbi - 1}"))
    for n, ((rows, cols), test) in enumerate(cuts):
        e(f"{'elif' if n else 'if'} {test}:")
        with e.indent():
            _emit_products(e, K, rows, cols, goff, xoff, bias=j == 0)
    if cuts:
        e("else:")
    with e.indent() if cuts else nullcontext():
        _emit_products(e, K, R, N, goff, xoff, bias=j == 0)


def _emit_products(e, K: int, rows: int, cols: int, goff, xoff, bias: bool) -> None:
    """``ac{dy*K+dx} += x[r + dy][c + dx] * g[r][c]`` over a ``rows x cols`` block, every
    offset a constant from ``gb`` (``g``) or ``xb`` (``x``); ``ac{K*K}`` sums ``g``.

    The block runs in pieces of `SUB_VALUES` ``g`` values (their columns loaded in turn),
    and each ``x`` value is used as soon as it is loaded, so few values stay live.
    """
    piece = _piece_cols(rows)
    for c0 in range(0, cols, piece):
        c1 = min(cols, c0 + piece)
        e(*(f"g{r}_{c} = S[gb + {goff(r, c)}]" for r in range(rows) for c in range(c0, c1)))
        if bias:
            e(*(f"ac{K * K} += g{r}_{c}" for r in range(rows) for c in range(c0, c1)))
        for i in range(rows + K - 1):
            for cx in range(c0, c1 + K - 1):
                e(f"xv = S[xb + {xoff(i, cx)}]")
                e(*(f"ac{(i - r) * K + cx - c} += xv * g{r}_{c}"
                    for r in range(rows) if 0 <= i - r < K
                    for c in range(max(c0, cx - K + 1), min(c1, cx + 1))))


def _pair_runs(phase: BlockPhase, K: int):
    """``(run, first pair, first slot of the run)`` in reduction order."""
    out, pair, slot = [], 0, 0
    for run in phase.runs:
        out.append((run, pair, slot))
        pair += run.groups * phase.taps(run, K)
        slot += run.groups * phase.slots(run)
    return out


def _branch(n: int, last: bool, test: str) -> str:
    """Header of branch ``n`` of a chain over a phase's runs (a lone run: ``if True``)."""
    if last:
        return "else:" if n else "if True:"
    return f"{'elif' if n else 'if'} {test}:"


def _emit_pair_decode(e, run: BlockRun, pair0: int, taps: int) -> None:
    """``k`` (group) and ``t`` (tap) of reduction pair ``pr`` of ``run``."""
    e(f"v = pr - {pair0}" if pair0 else "v = pr")
    if run.groups > 1:
        e(f"k = v // {taps}", f"t = v - k * {taps}")
    else:
        e("k = int64(0)", "t = v")


def _tap_index(run: BlockRun, K: int) -> str:
    """Unit-sum index of tap ``t`` of group ``k`` of ``run`` (``t == K*K``: the bias)."""
    K2 = K * K
    if run.level == 0:
        return "t"
    return f"{K2 + 1 + (run.level - 1) * 4 * K2} + k * {K2} + t"


def _emit_reduction(e, spec, phase: BlockPhase, red: int) -> None:
    """Each ``(group, tap, slice)`` adds its slots in order: into the unit sums, or into the
    second area where the phase has slices."""
    from .codegen import _emit_ordered_sum, CHUNK_SUM_GROUP
    K, T, s, w = spec.kernel_size, spec.threads, phase.slices, phase.width
    npairs = phase.pairs(K)
    second = red + phase.slot_floats
    e(f"for pu in range(tv, {npairs * s}, {T}):")
    with e.indent():
        if s > 1:
            e(f"pr = pu // {s}", f"ss = pu - pr * {s}")
        else:
            e("pr = pu")
        runs = _pair_runs(phase, K)
        for n, (run, pair0, slot0) in enumerate(runs):
            taps, slots = phase.taps(run, K), phase.slots(run)
            last = n == len(runs) - 1
            e(_branch(n, last, f"pr < {pair0 + run.groups * taps}"))
            with e.indent():
                _emit_pair_decode(e, run, pair0, taps)
                chunk = -(-slots // s)
                if s > 1:
                    e(f"fst = sb + {red} + ({slot0} + k * {slots} + ss * {chunk}) * {w} + t",
                      f"cnt = min(int64({chunk}), {slots} - ss * {chunk})")
                else:
                    e(f"fst = sb + {red} + ({slot0} + k * {slots}) * {w} + t",
                      f"cnt = int64({slots})")
                e(f"ti = {_tap_index(run, K)}")
        e("tot = fz")
        _emit_ordered_sum(e, "tot", "S", "fst", w, "cnt", CHUNK_SUM_GROUP)
        if s > 1:
            e(f"S[sb + {second} + pu] = tot")
        else:
            e("if valid:", "    S[sb + w_off + ti] += tot")


def _emit_slice_sums(e, spec, phase: BlockPhase, red: int) -> None:
    """Second pass of a sliced reduction: each ``(group, tap)`` adds its slices in order."""
    K, T, s = spec.kernel_size, spec.threads, phase.slices
    second = red + phase.slot_floats
    e(f"for pr in range(tv, {phase.pairs(K)}, {T}):")
    with e.indent():
        runs = _pair_runs(phase, K)
        for n, (run, pair0, _) in enumerate(runs):
            taps = phase.taps(run, K)
            last = n == len(runs) - 1
            e(_branch(n, last, f"pr < {pair0 + run.groups * taps}"))
            with e.indent():
                _emit_pair_decode(e, run, pair0, taps)
                e(f"ti = {_tap_index(run, K)}")
        e("tot = fz", f"at = sb + {second} + pr * {s}")
        e(*(f"tot += S[at + {i}]" for i in range(s)))
        e("if valid:", "    S[sb + w_off + ti] += tot")
    e("cuda.syncthreads()")


def _emit_subbands(e, spec, g: Grids, j: int) -> None:
    """Grid ``j`` of both pyramids into level ``j + 1``'s four subbands, in place."""
    from .codegen import _DivmodLoop, _butterfly
    T, P = spec.threads, g.radius
    hn, wn = g.shapes[j + 1]
    (xo, xp, xph), (go, gp, gph) = g.xsrc[j], g.gsrc[j]
    e(f"# grid {j} -> level {j + 1}'s subbands (raw butterflies), in place")
    with _DivmodLoop(e, "it", "tv", str(hn * wn), T, str(wn), "qu", "qv"):
        for name, at, ph in (("xq", f"sb + {xo} + (qu + {P}) * {xp} + qv + {P}", xph),
                             ("gq", f"sb + {go} + qu * {gp} + qv", gph)):
            e(f"{name} = {at}")
            _butterfly(e, "hb", "", name, str(ph))
            e(*(f"S[{name} + {n * ph}] = hb{n}_" for n in range(4)))


def _emit_padding_zeros(e, spec, g: Grids) -> None:
    """Zero the positions past each odd-sized grid's edge again (the butterflies wrote them):
    phases 2 and 3 (odd rows) along the last row of positions of an odd height, phases 1
    and 3 (odd columns) down the last column of an odd width."""
    T, P = spec.threads, g.radius
    for j in range(spec.plane[2]):
        hv, wv = g.shapes[j]
        hn, wn = g.shapes[j + 1]
        edges = [(hv, "height", "row", wn, (2, 3), lambda pitch, halo: (
                     f"{(hn - 1 + halo) * pitch + halo} + it")),
                 (wv, "width", "column", hn, (1, 3), lambda pitch, halo: (
                     f"(it + {halo}) * {pitch} + {wn - 1 + halo}"))]
        for size, side, line, count, phases, position in edges:
            if size % 2 == 0:
                continue
            e(f"# grid {j}: odd {side}, {line} {size} is padding",
              f"for it in range(tv, {count}, {T}):")
            with e.indent():
                for (base, pitch, ph), halo in ((g.xsrc[j], P), (g.gsrc[j], 0)):
                    at = f"sb + {base} + {position(pitch, halo)}"
                    e(*(f"S[{at} + {k * ph}] = fz" for k in phases))
