"""Lane kernels: small planes dealt to one or two threads each.

Two kernels share this module's layout and code: ``wtconv_lanes``, a
backward's weight gradients (below), and ``wtconv_lanes_forward``, the stride-1
forward (:func:`lane_forward_source`), which also serves a backward's ``dx``
(the forward on ``dy`` with flipped filters).

The ``weights_only`` plane kernel (:mod:`.codegen`) gives a 14 x 14 plane a
warp: its work items are tap rows times row chunks, so most of its
instructions go to index arithmetic, barriers, idle lanes on the coarse
levels and the reductions of the chunks. ``wtconv_lanes`` deals the planes
to the lanes instead. A block is one warp; it holds ``32 / lanes``
consecutive batch entries of one channel, and each plane belongs to
``lanes`` (1 or 2) of its threads. Everything about the plane is known when
the kernel is generated (``H``, ``W``, ``L``, ``K``), so every shared-memory
address is the thread's slot plus a constant (one instruction), and every
zero term of a padded border is dropped by the generator. What is left is
the arithmetic of the correlations, their loads, and the Haar butterflies.

A thread's work, with ``lanes`` 2 (``h`` = 0 or 1 is its half):

1. The warp copies its planes of ``x`` and ``dy`` into the slots (coalesced:
   a load instruction reads 32 consecutive elements of one plane), as
   float32.
2. Base taps and bias: ``dy`` correlated with ``x``, rows ``py = h, h + 2,
   ...``; a row's ``W`` values of ``dy`` are loaded once and feed every tap.
3. Per level ``j``: the thread turns its pyramid (``h`` 0: ``x``, 1: ``dy``)
   into level ``j``'s four subbands *in place* (raw butterflies, no ``1/2``:
   the four results of a 2 x 2 block go where its four values were, the LL
   value on the top-left one, which is where level ``j + 1`` reads it).
   Then it correlates the subbands ``k`` with ``k & 1 == h`` of both
   pyramids. Warp barriers separate the phases.
4. After each group of taps the thread's sums go through the warp's
   transpose tile: lane ``i`` adds tap ``i`` of the batch over the 32 lanes
   in lane order (a level tap over the 16 lanes of its subband) and writes it
   to the block's partial (deterministic). The
   raw butterflies make level ``j``'s products ``4**j`` times the
   operator's; the partial carries ``4**-(j-1)`` of that (exact powers of
   two), the convention of the plane kernel's partials, so
   ``wtconv_finalize`` unfolds them unchanged.

With ``lanes`` 1 a thread does both halves' work. Odd grids need the
butterfly results of their missing row or column somewhere: the slot's rows
and columns are padded so that those land just outside the plane, where no
other level's values live (:func:`lane_layout`).

Bank conflicts: with ``lanes`` 2 the slots lie 2 mod 32 words apart and the
two halves of a plane read addresses an odd distance apart (rows of an odd
pitch, the two pyramids, level 1's subband columns), so a warp's 32 reads
hit 32 banks; level ``j >= 2``'s subband columns are an even distance apart
(two-way conflicts on a quarter of level 1's work). With ``lanes`` 1 the
slots lie an odd number of words apart. The forward also takes four threads a
plane (eight planes a warp, twice the warps for the same shared memory): the
slots lie 4 mod 32 words apart and a plane's four threads read rows an odd
pitch apart, so its base convolution reads 32 banks too.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import NamedTuple

from .codegen import STORAGE, _Emitter, _guarded_load, _load, _store
from .registers import grids

#: Threads per block: one warp.
THREADS = 32
#: Taps per reduction batch by default (at most 32: lane ``i`` adds tap ``i``); the
#: warp's transpose tile holds that many rows of 32 lanes' sums.
TAP_BATCH = 32
#: Global loads a thread issues before the shared stores that take them, when the
#: block copies its planes: with one warp per block, its own loads in flight are what
#: covers the memory latency.
STAGE_AHEAD = 28


class LaneSpec(NamedTuple):
    """Compile-time parameters of one ``wtconv_lanes`` variant.

    Attributes
    ----------
    kernel_size : int
        Odd ``K``.
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (raw ``uint16`` bits).
    height, width : int
        Plane size ``H, W`` (the code is generated for it).
    levels : int
        Wavelet levels ``L >= 0``.
    lanes : int
        Threads per plane, 1 or 2; a block (one warp) holds ``32 / lanes``
        planes, consecutive batch entries of one channel.
    max_registers : int
        Register cap handed to ptxas (``.maxnreg``); 0 leaves it free.
    tap_batch : int
        Taps per reduction batch, 1 to 32: the transpose tile's rows. A
        smaller tile can let one more block share a multiprocessor.
    groups : int
        Groups of ``32 / lanes`` planes a block takes one after the other
        (consecutive batch entries), adding each group's sums to its
        partial: ``groups`` times fewer partials (and blocks) for the same
        threads a plane.
    """

    kernel_size: int
    storage: str
    height: int
    width: int
    levels: int
    lanes: int = 2
    max_registers: int = 0
    tap_batch: int = TAP_BATCH
    groups: int = 1
    #: Threads per block (the compiler's ``.maxntid``); not a field.
    threads = THREADS


class LaneForwardSpec(NamedTuple):
    """Compile-time parameters of one ``wtconv_lanes_forward`` variant (stride 1).

    Attributes
    ----------
    kernel_size, storage, height, width, max_registers
        As in :class:`LaneSpec`.
    lanes : int
        Threads per plane, 1, 2 or 4; a block (one warp) holds ``32 / lanes``
        planes. With more than one, thread ``h`` of a plane takes the rows
        ``h, h + lanes, ...`` of each convolution and butterfly pass.
    """

    kernel_size: int
    storage: str
    height: int
    width: int
    levels: int
    lanes: int = 2
    max_registers: int = 0
    #: Threads per block (the compiler's ``.maxntid``); not a field.
    threads = THREADS


class LaneLayout(NamedTuple):
    """Offsets (float32 words) in a lane kernel block's shared buffer.

    Attributes
    ----------
    rows, pitch : int
        Rows of a pyramid's area and the words between two of its rows: the
        plane's, padded where an odd grid's butterflies need a row or column
        past it.
    dy : int
        Offset of a slot's second area (the ``dy`` pyramid; the forward's
        ``y``) from its first (``x``); odd with ``lanes`` 2.
    slot : int
        Words between two planes' slots.
    tile : int
        The warp's transpose tile: ``tap_batch`` rows of 33 words (tap ``i``
        of lane ``m`` at ``tile + i * 33 + m``); none in the forward.
    floats : int
        Size of the buffer.
    ntaps : int
        ``K**2 (1 + 4 L) + 1``: base taps, bias, level taps.
    """

    rows: int
    pitch: int
    dy: int
    slot: int
    tile: int
    floats: int
    ntaps: int


def planes_per_block(spec) -> int:
    """Planes a lane kernel's block holds: ``32 / lanes`` (a `LaneSpec` or
    `LaneForwardSpec`)."""
    return THREADS // spec.lanes


def planes_per_partial(spec) -> int:
    """Planes whose sums a lane kernel's block writes to one partial: its
    :func:`planes_per_block` times ``groups`` (a `LaneSpec`, or a `LaneForwardSpec`,
    which takes one group and has no partials)."""
    return planes_per_block(spec) * getattr(spec, "groups", 1)


def lane_layout(spec) -> LaneLayout:
    """The shared-memory layout of a lane kernel's block.

    Level ``j``'s butterflies write their four results over the four values
    of grid ``j - 1`` they read; where that grid has an odd number of rows
    (columns), the last block's missing row (column) lies ``2**(j-1)`` plane
    rows (columns) past its last one, so the area is padded to reach it.

    Parameters
    ----------
    spec : LaneSpec or LaneForwardSpec

    Returns
    -------
    LaneLayout
    """
    _check(spec)
    H, W, L, K = spec.height, spec.width, spec.levels, spec.kernel_size
    sizes = grids(H, W, L)
    rows, cols = H, W
    for j in range(1, L + 1):
        hp, wp = sizes[j - 1]
        step = 1 << (j - 1)
        if hp % 2:
            rows = max(rows, hp * step + 1)
        if wp % 2:
            cols = max(cols, wp * step + 1)
    if spec.lanes > 1:
        pitch = cols | 1  # rows py .. py + lanes - 1 (a plane's threads) on other banks
        area = rows * pitch
        dy = area | 1  # the two pyramids (the halves' butterflies) likewise
        slot = dy + area
        # lanes mod 32: the 32 / lanes planes on the banks that are multiples of lanes,
        # and a plane's threads, an odd pitch apart, on the other residues mod lanes
        slot += (spec.lanes - slot) % 32
    else:
        pitch = cols
        dy = rows * pitch
        slot = (2 * dy) | 1  # odd: 32 planes on 32 banks
    planes = planes_per_block(spec)
    tile = planes * slot
    floats = tile + getattr(spec, "tap_batch", 0) * (THREADS + 1)
    ntaps = K * K * (1 + 4 * L) + 1
    return LaneLayout(rows, pitch, dy, slot, tile, floats, ntaps)


def shared_bytes(spec) -> int:
    """Dynamic shared memory of a lane kernel's block, in bytes (a `LaneSpec` or
    `LaneForwardSpec`)."""
    return 4 * lane_layout(spec).floats


def _check(spec: LaneSpec) -> None:
    K, L, H, W = spec.kernel_size, spec.levels, spec.height, spec.width
    if K < 1 or K % 2 == 0:
        raise ValueError(f"kernel_size must be odd and >= 1, got {K}")
    if spec.storage not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, got {spec.storage!r}")
    if L < 0 or H < 1 or W < 1:
        raise ValueError(f"need levels >= 0 and height, width >= 1, got {spec}")
    allowed = (1, 2, 4) if isinstance(spec, LaneForwardSpec) else (1, 2)
    if spec.lanes not in allowed:
        raise ValueError(f"lanes must be one of {allowed}, got {spec.lanes}")
    if isinstance(spec, LaneSpec) and not 1 <= spec.tap_batch <= THREADS:
        raise ValueError(f"tap_batch must be 1 to {THREADS}, got {spec.tap_batch}")
    if isinstance(spec, LaneSpec) and spec.groups < 1:
        raise ValueError(f"groups must be >= 1, got {spec.groups}")


class _Band(NamedTuple):
    """A grid of values in a slot: element ``(qy, qx)`` at ``base + qy * rstep + qx * cstep``
    (``base`` an expression: the pyramid's or the subband's offset)."""

    rows: int
    cols: int
    rstep: int
    cstep: int


def lane_kernel_source(spec: LaneSpec) -> str:
    """Python source of ``wtconv_lanes`` for ``spec``.

    The kernel takes ``(dy, x, part, B, C)`` (see
    :func:`wtconv_cuda.kernels.compiler.lane_signature`) and runs one warp
    per block over ``B * C / planes`` blocks, ``planes =``
    :func:`planes_per_partial` (the block's planes times ``groups``); ``B``
    must be a multiple of ``planes``. Block ``u`` takes channel ``c = u //
    nchunks`` and batch entries ``(u % nchunks) * planes ..`` (``nchunks = B
    / planes``) and writes their summed weight-gradient taps to ``part[u *
    ntaps:]`` in the partial format of ``wtconv_finalize`` (base taps, bias,
    level taps carrying two factors 1/2): with several groups, the first
    group's sums, then each later group's added in turn.

    Parameters
    ----------
    spec : LaneSpec
        The variant to generate.

    Returns
    -------
    str
        Source of a function ``wtconv_lanes``.

    Raises
    ------
    ValueError
        An even kernel size, an unknown storage, ``lanes`` other than 1 or 2,
        a ``tap_batch`` outside 1 to 32, or an empty plane.
    """
    lay = lane_layout(spec)
    K, L, H, W = spec.kernel_size, spec.levels, spec.height, spec.width
    lanes, K2 = spec.lanes, K * K
    sizes = grids(H, W, L)
    e = _Emitter()
    e("def wtconv_lanes(dy, x, part, B, C):")
    with e.indent(), _block_planes(e, spec, lay, ("x", "dy")):
        if lanes == 2:
            e("h = t & 1", f"xs = (t >> 1) * {lay.slot}")
        else:
            e("h = int64(0)", f"xs = t * {lay.slot}")
        e(f"gs = xs + {lay.dy}",
          f"tile_in = {lay.tile} + t",
          f"tile_out = {lay.tile} + t * {THREADS + 1}",
          "pbase = blk * " + str(lay.ntaps))
        batch = _Batches(e, spec.tap_batch, spec.groups)

        # base taps and bias: dy correlated with x over the plane
        plane = _Band(H, W, lay.pitch, 1)
        _emit_correlation(e, K, plane, "gs", "xs", "h" if lanes == 2 else "0", lanes, bias=True)
        for t in range(K2):
            batch.add(f"acc_{t // K}_{t % K}", 1.0, (t,))
        batch.add("bsum", 1.0, (K2,))

        for j in range(1, L + 1):
            e("cuda.syncwarp()", f"# ---- level {j} ----")
            _emit_transform(e, spec, lay, sizes, j)
            e("cuda.syncwarp()")
            step = 1 << (j - 1)
            hj, wj = sizes[j]
            band = _Band(hj, wj, 2 * step * lay.pitch, 2 * step)
            scale = 4.0 ** -(j - 1)
            taps = K2 + 1 + (j - 1) * 4 * K2  # level j's first tap
            if lanes == 2:
                # subbands k = h + 2 e (column bit h, row bit e): the even lanes hold
                # subband 2 e, the odd ones 2 e + 1, in paired slots
                for e_bit in (0, 1):
                    off = f"h * {step} + {e_bit * step * lay.pitch}"
                    _emit_correlation(e, K, band, f"gs + {off}", f"xs + {off}", "0", 1)
                    for t in range(K2):
                        batch.add(f"acc_{t // K}_{t % K}", scale,
                                  (taps + 2 * e_bit * K2 + t, taps + (2 * e_bit + 1) * K2 + t))
            else:
                for k in range(4):
                    off = (k >> 1) * step * lay.pitch + (k & 1) * step
                    _emit_correlation(e, K, band, f"gs + {off}", f"xs + {off}", "0", 1)
                    for t in range(K2):
                        batch.add(f"acc_{t // K}_{t % K}", scale, (taps + k * K2 + t,))
        batch.flush()
    return e.text()


def lane_forward_source(spec: LaneForwardSpec) -> str:
    """Python source of ``wtconv_lanes_forward`` for ``spec``: the layer's forward.

    The kernel takes ``(x, y, w0, bias, s0, ww, ws, B, C, has_bias)`` (see
    :func:`wtconv_cuda.kernels.compiler.lane_signature`) and runs one warp per
    block over ``B * C / planes`` blocks, as ``wtconv_lanes`` does. Each
    slot holds the plane of ``x`` and, in its second area, the plane of ``y``
    being formed. Thread ``h`` of a plane's ``lanes`` (``h = 0`` with one):

    1. the base convolution with the folded taps ``s0 * w0`` and the bias
       term ``s0 * b`` into the ``y`` area (rows ``h, h + lanes, ...``);
    2. per level ``j``: the raw butterflies in place over grid ``j - 1``
       (rows of blocks ``h, h + lanes, ...``), then, for its rows of level
       ``j``'s coefficients, the four subbands convolved with the taps ``s_j
       * w_j / 4**j`` (raw butterflies make the subbands ``2**j`` times the
       operator's; the synthesis's factors ``2**-j`` are folded in the same
       way, see SPEC.md's closed form) and added to the ``2**j x 2**j``
       output pixels each coefficient covers, with the signs of the
       synthesis;
    3. the warp stores its planes of ``y`` (coalesced, rounded once).

    Parameters
    ----------
    spec : LaneForwardSpec

    Returns
    -------
    str
        Source of a function ``wtconv_lanes_forward``.

    Raises
    ------
    ValueError
        As :func:`lane_kernel_source`.
    """
    lay = lane_layout(spec)
    K, L, H, W = spec.kernel_size, spec.levels, spec.height, spec.width
    lanes, K2 = spec.lanes, K * K
    sizes = grids(H, W, L)
    ld = lambda expr: _load(spec.storage, expr)  # noqa: E731
    e = _Emitter()
    e("def wtconv_lanes_forward(x, y, w0, bias, s0, ww, ws, B, C, has_bias):")
    with e.indent(), _block_planes(e, spec, lay, ("x",)):
        if lanes > 1:
            e(f"h = t & {lanes - 1}", f"xs = (t >> {lanes.bit_length() - 1}) * {lay.slot}")
        else:
            e("h = int64(0)", f"xs = t * {lay.slot}")
        e(f"ys = xs + {lay.dy}")

        # base convolution and bias into the y area
        e("s0c = " + ld("s0[c]"),
          "bterm = s0c * " + ld("bias[c]") + " if has_bias != 0 else fz")
        for t in range(K2):
            e(f"w_0_{t // K}_{t % K} = s0c * " + ld(f"w0[c * {K2} + {t}]"))
        plane = _Band(H, W, lay.pitch, 1)
        _emit_convolution(e, K, plane, "xs", [(0, "w_0")], "h" if lanes > 1 else "0", lanes,
                          start_value="bterm")
        for j in range(1, L + 1):
            e("cuda.syncwarp()", f"# ---- level {j} ----")
            _emit_transform(e, spec, lay, sizes, j, ["xs"], lanes)
            e("cuda.syncwarp()")
            step = 1 << (j - 1)
            hj, wj = sizes[j]
            for k in range(4):
                e(f"sw = float32({4.0 ** -j!r}) * " + ld(f"ws[({j - 1} * C + c) * 4 + {k}]"))
                for t in range(K2):
                    e(f"w_{k + 1}_{t // K}_{t % K} = sw * "
                      + ld(f"ww[(({j - 1} * C + c) * 4 + {k}) * {K2} + {t}]"))
            band = _Band(hj, wj, 2 * step * lay.pitch, 2 * step)
            groups = [((k >> 1) * step * lay.pitch + (k & 1) * step, f"w_{k + 1}")
                      for k in range(4)]
            _emit_convolution(e, K, band, "xs", groups, "h" if lanes > 1 else "0", lanes,
                              synthesis=(j, H, W, lay.pitch))
        e("cuda.syncwarp()")
        _emit_store(e, spec, lay)
    return e.text()


def _emit_convolution(e: _Emitter, K: int, band: _Band, ubase: str, groups: list, start: str,
                      step: int, start_value: str = "fz", synthesis=None) -> None:
    """The forward's convolutions on ``band``, a row of outputs at a time.

    ``groups`` holds ``(offset, taps)`` per convolved grid: its offset from
    ``ubase`` (an int) and the prefix of its tap names (``taps_a_b``); one
    for the base convolution, four for a level's subbands. Rows ``qy = start,
    start + step, ...`` run in a loop; ``acc{g}_{qx}`` starts at
    ``start_value`` and adds ``taps_a_b * u[qy + a - P, qx + b - P]`` tap row
    by tap row, each sum in the order of the taps (a warp-uniform test skips
    a source row outside the band). Without ``synthesis`` the row is stored
    into the ``y`` area (from ``ys``, the band's row step); with ``synthesis
    = (j, H, W, pitch)`` the four subbands' values of each coefficient are
    combined with the signs of the synthesis and added to the plane's output
    pixels it covers (``2**j x 2**j`` of them, fewer on the last row or
    column).
    """
    rows, cols = band.rows, band.cols
    e(f"qy = int64({start})", f"while qy < {rows}:")
    with e.indent():
        e(f"ur = {ubase} + qy * {band.rstep}")
        for g in range(len(groups)):
            e(", ".join(f"acc{g}_{qx}" for qx in range(cols)) + " = "
              + ", ".join(start_value for _ in range(cols)))
        for a, d, columns, products in _tap_rows(e, K, rows, cols):
            for g, (offset, taps) in enumerate(groups):
                for col in columns:
                    at = offset + d * band.rstep + col * band.cstep
                    e(f"u_{col} = S[{_plus('ur', at)}]")
                for qx, b, col in products:
                    e(f"acc{g}_{qx} += {taps}_{a}_{b} * u_{col}")
        if synthesis is None:
            e(f"yr = ys + qy * {band.rstep}")
            e(*(f"S[yr + {qx * band.cstep}] = acc0_{qx}" for qx in range(cols)))
        else:
            _emit_synthesis_adds(e, rows, cols, *synthesis)
        e(f"qy += {step}")


def _emit_synthesis_adds(e: _Emitter, rows: int, cols: int, j: int, H: int, W: int,
                         pitch: int) -> None:
    """Add level ``j``'s row ``qy`` of convolved subbands (``acc0..3_qx``: LL, LH, HL,
    HH) to the ``y`` area: output pixel ``(py, px)`` under coefficient ``(qy, qx)``
    takes ``LL + sy LH + sx HL + sy sx HH``, ``sy`` (``sx``) negative in the lower
    (right) half of the coefficient's block."""
    s = 1 << (j - 1)
    e(f"yr = ys + qy * {2 * s * pitch}")
    for qx in range(cols):
        e(f"sp = acc0_{qx} + acc1_{qx}", f"sm = acc0_{qx} - acc1_{qx}",
          f"tp = acc2_{qx} + acc3_{qx}", f"tm = acc2_{qx} - acc3_{qx}",
          "z00 = sp + tp", "z01 = sp - tp", "z10 = sm + tm", "z11 = sm - tm")
        for by in (0, 1):
            for i in range(s):
                o = by * s + i  # the pixel row's offset in the block
                limit = -(-(H - o) // (2 * s))  # rows of coefficients where it exists
                pixels = [(bx, qx * 2 * s + bx * s + i2) for bx in (0, 1) for i2 in range(s)
                          if qx * 2 * s + bx * s + i2 < W]
                if limit <= 0 or not pixels:
                    continue
                if limit < rows:
                    e(f"if qy < {limit}:")
                with e.indent() if limit < rows else nullcontext():
                    e(*(f"S[yr + {o * pitch + px}] += z{by}{bx}" for bx, px in pixels))


def _emit_store(e: _Emitter, spec, lay: LaneLayout) -> None:
    """Store the block's planes of ``y`` from the slots' second areas, coalesced and
    rounded once to the storage type (the element order of :func:`_emit_stage`,
    whose offsets ``g0``, ``gstep`` and ``so{m}`` it reuses)."""
    H, W, N = spec.height, spec.width, planes_per_block(spec)
    HW = H * W
    chunks = -(-HW // THREADS)
    last_full = HW // THREADS
    for n in range(N):
        e(f"gn = g0 + {n} * gstep")
        for m in range(chunks):
            value = f"S[{n * lay.slot + lay.dy} + so{m}]"
            if m < last_full:
                _store(e, spec.storage, f"y[gn + {m * THREADS}]", value)
            else:
                e(f"if px{m} < {HW}:")
                with e.indent():
                    _store(e, spec.storage, f"y[gn + {m * THREADS}]", value)


@contextmanager
def _block_planes(e: _Emitter, spec, lay: LaneLayout, arrays):
    """The block's channel ``c`` and first batch entry ``b0``, its planes of ``arrays``
    staged (:func:`_emit_stage`), then a warp barrier; the body follows.

    With ``groups`` above 1 (a `LaneSpec`) the block takes that many groups of
    planes, consecutive batch entries: the staging and the body are emitted in a
    loop over ``grp``, a warp barrier first (the previous group's reads of the
    slots are done). With one group the text has no loop.
    """
    N, G = planes_per_block(spec), getattr(spec, "groups", 1)
    e("S = cuda.shared.array(0, dtype=float32)",
      "t = int64(cuda.threadIdx.x)",
      "fz = float32(0.0)",
      f"nchunks = B // {N * G}",
      "blk = int64(cuda.blockIdx.x)",
      "c = blk // nchunks")
    if G == 1:
        e(f"b0 = (blk - c * nchunks) * {N}")
        _emit_stage(e, spec, lay, arrays)
        e("cuda.syncwarp()")
        yield
        return
    e(f"chunk0 = (blk - c * nchunks) * {G}", f"for grp in range({G}):")
    with e.indent():
        e(f"b0 = (chunk0 + grp) * {N}", "cuda.syncwarp()")
        _emit_stage(e, spec, lay, arrays)
        e("cuda.syncwarp()")
        yield


def _emit_stage(e: _Emitter, spec, lay: LaneLayout, arrays=("x", "dy")) -> None:
    """Copy the block's planes of ``arrays`` (``x`` into the slot's first area, ``dy``
    into its second) into the slots as float32.

    Plane ``n`` (batch entry ``b0 + n``) is ``H * W`` consecutive elements;
    thread ``t`` copies elements ``t + 32 m`` of each, so a warp's load reads
    32 consecutive elements. Their slot offsets (the plane's row pitch is
    ``lay.pitch``) are formed once and serve every plane; `STAGE_AHEAD`
    loads go out before their stores.
    """
    H, W, N = spec.height, spec.width, planes_per_block(spec)
    HW = H * W
    chunks = -(-HW // THREADS)
    e(f"g0 = ((b0 * C + c) * {HW}) + t", f"gstep = C * {HW}")
    for m in range(chunks):
        e(f"px{m} = t + {m * THREADS}")
        e(f"so{m} = px{m} + (px{m} // {W}) * {lay.pitch - W}" if lay.pitch != W else
          f"so{m} = px{m}")
    last_full = HW // THREADS  # chunks m < last_full are whole for every thread
    items = [(n, m, arr) for n in range(N) for m in range(chunks) for arr in arrays]
    for first in range(0, len(items), STAGE_AHEAD):
        group = items[first:first + STAGE_AHEAD]
        planes = sorted({n for n, _, _ in group})
        for n in planes:
            e(f"gn{n} = g0 + {n} * gstep")
        for n, m, arr in group:
            value = f"{arr}[gn{n} + {m * THREADS}]"  # converted at its store
            if m < last_full:
                e(f"v_{arr}{n}_{m} = {value}")
            else:
                e(f"v_{arr}{n}_{m} = " + _guarded_load(spec.storage, value, f"px{m} < {HW}"))
        for n, m, arr in group:
            off = n * lay.slot + (lay.dy if arr == "dy" else 0)
            store = f"S[{off} + so{m}] = {_load(spec.storage, f'v_{arr}{n}_{m}')}"
            if m < last_full:
                e(store)
            else:
                e(f"if px{m} < {HW}:")
                with e.indent():
                    e(store)


def _emit_correlation(e: _Emitter, K: int, band: _Band, gbase: str, ubase: str, start: str,
                      step: int, bias: bool = False) -> None:
    """``acc_a_b = sum over (qy, qx) of g[qy, qx] * u[qy + a - P, qx + b - P]`` on ``band``.

    ``g`` is the band at ``gbase`` (``dy``'s), ``u`` at ``ubase`` (``x``'s);
    rows ``qy = start, start + step, ...`` (a loop), columns unrolled. A
    row's ``g`` values are loaded once; for each tap row ``a`` whose source
    row exists (a warp-uniform test, dropped where it always holds or never
    does) the source row is loaded and multiplied into the ``K`` tap
    columns. Each sum adds its terms in row-major order of ``(qy, qx)``.
    ``bias`` also sums ``g`` into ``bsum``.
    """
    rows, cols = band.rows, band.cols
    names = [f"acc_{a}_{b}" for a in range(K) for b in range(K)]
    e(", ".join(names) + " = " + ", ".join("fz" for _ in names))
    if bias:
        e("bsum = fz")
    e(f"qy = int64({start})", f"while qy < {rows}:")
    with e.indent():
        e(f"gr = {gbase} + qy * {band.rstep}", f"ur = {ubase} + qy * {band.rstep}")
        for qx in range(cols):
            e(f"g_{qx} = S[gr + {qx * band.cstep}]")
        if bias:
            e(*(f"bsum += g_{qx}" for qx in range(cols)))
        for a, d, columns, products in _tap_rows(e, K, rows, cols):
            for col in columns:
                e(f"u_{col} = S[{_plus('ur', d * band.rstep + col * band.cstep)}]")
            for qx, b, col in products:
                e(f"acc_{a}_{b} += g_{qx} * u_{col}")
        e(f"qy += {step}")


def _plus(base: str, offset: int) -> str:
    """``base`` plus a constant, written with its sign."""
    return f"{base} - {-offset}" if offset < 0 else f"{base} + {offset}"


def _tap_rows(e: _Emitter, K: int, rows: int, cols: int):
    """The tap rows of a row loop over a band of ``rows x cols`` values (row ``qy``).

    For each tap row ``a`` whose source row ``qy + d`` (``d = a - P``) lies
    in the band for some ``qy``, emits its warp-uniform test (none where it
    always holds) and yields ``(a, d, columns, products)`` with the emitter
    inside it: the source columns the row's products read, and its products
    ``(qx, b, col)`` (output or gradient column ``qx``, tap column ``b``,
    source column ``col = qx + b - P``), terms outside the band dropped, in
    the order the sums add them.
    """
    P = (K - 1) // 2
    products = [(qx, b, qx + b - P) for qx in range(cols) for b in range(K)
                if 0 <= qx + b - P < cols]
    columns = sorted({col for _, _, col in products})
    for a in range(K):
        d = a - P
        if d >= rows or -d >= rows:
            continue  # no row of the band has this source row
        tests = ([f"qy >= {-d}"] if d < 0 else []) + ([f"qy < {rows - d}"] if d > 0 else [])
        if tests:
            e(f"if {' and '.join(tests)}:")
        with e.indent() if tests else nullcontext():
            yield a, d, columns, products


def _emit_transform(e: _Emitter, spec, lay: LaneLayout, sizes: list, j: int,
                    bases=None, step: int = 1) -> None:
    """Level ``j``'s raw butterflies, in place over grid ``j - 1`` of the pyramids.

    Grid ``j - 1``'s element ``(r, c)`` lies at ``r * s * pitch + c * s``
    (``s = 2**(j-1)``). The butterfly of block ``(qy, qx)`` reads its four
    elements ``(2 qy + dr, 2 qx + dc)`` (a missing one, past an odd grid, is
    an exact zero and drops out) and writes subband ``k = 2 dr + dc`` (LL,
    LH, HL, HH) where element ``(dr, dc)`` was. With ``lanes`` 2 thread half
    ``h`` transforms pyramid ``h`` (``x``, then ``dy``); with 1 the thread
    transforms both, block by block. ``bases`` (the pyramids' offsets, one
    per transformed pyramid) and ``step`` override that: with ``step`` 2 or 4
    thread ``h`` of a plane takes the rows of blocks ``h, h + step, ...`` (the
    forward's one pyramid). Rows of blocks run in a loop; a last row with a missing lower
    half is emitted after it.
    """
    hp, wp = sizes[j - 1]
    hj, wj = sizes[j]
    s = 1 << (j - 1)
    rstep = 2 * s * lay.pitch
    if bases is None:
        bases = ["xs + h * " + str(lay.dy)] if spec.lanes == 2 else ["xs", "gs"]
    full = hp // 2  # rows of blocks with both halves

    def row(r: str, lower: bool) -> None:
        for n, base in enumerate(bases):
            e(f"tr{n} = {base} + {r} * {rstep}")
        for qx in range(wj):
            right = 2 * qx + 1 < wp
            for n in range(len(bases)):
                at = {(dr, dc): f"tr{n} + {dr * s * lay.pitch + (2 * qx + dc) * s}"
                      for dr in (0, 1) for dc in (0, 1)}
                have = {(0, 0): True, (0, 1): right, (1, 0): lower, (1, 1): lower and right}
                v = {}
                for key, ok in have.items():
                    if ok:
                        v[key] = f"w{n}_{key[0]}{key[1]}"
                        e(f"{v[key]} = S[{at[key]}]")
                top_s = _combine(v.get((0, 0)), v.get((0, 1)), "+")
                top_m = _combine(v.get((0, 0)), v.get((0, 1)), "-")
                bot_s = _combine(v.get((1, 0)), v.get((1, 1)), "+")
                bot_m = _combine(v.get((1, 0)), v.get((1, 1)), "-")
                e(f"ts{n} = {top_s}", f"tm{n} = {top_m}")
                outs = [("ts", bot_s, "+"), ("ts", bot_s, "-"), ("tm", bot_m, "+"),
                        ("tm", bot_m, "-")]
                if bot_s is not None:
                    e(f"bs{n} = {bot_s}", f"bm{n} = {bot_m}")
                for k, (top, bot, op) in enumerate(outs):
                    b_name = None if bot is None else f"b{'s' if top == 'ts' else 'm'}{n}"
                    value = _combine(f"{top}{n}", b_name, op)
                    e(f"S[{at[(k >> 1, k & 1)]}] = {value}")

    if full:
        e("qb = int64(0)" if step == 1 else "qb = h", f"while qb < {full}:")
        with e.indent():
            row("qb", True)
            e(f"qb += {step}")
    if hp % 2:
        if step == 1:
            row(str(full), False)
        else:  # the half whose rows it continues
            e(f"if h == {full % step}:")
            with e.indent():
                row(str(full), False)


def _combine(a, b, op: str):
    """``a op b`` where ``None`` is an exact zero (``None`` if both are)."""
    if a is None and b is None:
        return None
    if b is None:
        return a
    if a is None:
        return f"-{b}" if op == "-" else b
    return f"{a} {op} {b}"


class _Batches:
    """Per-thread tap sums into the warp's transpose tile, reduced every ``size`` slots.

    A slot holds one value per lane. A *plain* slot is one tap: lane ``i`` of
    the flush adds slot ``i`` over the 32 lanes in lane order. A *paired* slot
    (two threads a plane, level taps) holds subband ``2 e`` in the even lanes
    and ``2 e + 1`` in the odd ones: lane ``i`` adds the even lanes into the
    first tap and the odd lanes into the second, each in lane order. A batch
    holds one kind, its taps consecutive (a slot that is not the next one
    flushes the batch first); sums are scaled (exact powers of two) and
    written to the block's partial (with ``groups`` above 1, added to it after
    the first group).
    """

    def __init__(self, e: _Emitter, size: int, groups: int = 1) -> None:
        self.e, self.size, self.groups = e, size, groups
        self.slots: list = []  # (taps, scale) per slot; taps: (tap,) or (even, odd)

    def add(self, value: str, scale: float, taps: tuple) -> None:
        """Store this thread's ``value`` in the next slot, for ``taps``."""
        if self.slots and tuple(taps) != tuple(f + len(self.slots)
                                               for f in self.slots[0][0]):
            self.flush()  # another kind, or not the batch's next taps
        self.e(f"S[tile_in + {len(self.slots) * (THREADS + 1)}] = {value}")
        self.slots.append((tuple(taps), scale))
        if len(self.slots) == self.size:
            self.flush()

    def flush(self) -> None:
        if not self.slots:
            return
        e, count, first = self.e, len(self.slots), self.slots[0][0]
        assert all(taps == tuple(f + i for f in first) for i, (taps, _) in enumerate(self.slots))
        e("cuda.syncwarp()", f"if t < {count}:")
        with e.indent():
            e(f"sc = float32({self.slots[0][1]!r})")
            for i in range(1, count):
                if self.slots[i][1] != self.slots[i - 1][1]:
                    e(f"if t >= {i}:", f"    sc = float32({self.slots[i][1]!r})")
            groups = [range(THREADS)] if len(first) == 1 else [range(0, THREADS, 2),
                                                                 range(1, THREADS, 2)]
            for tap, lanes in zip(first, groups):
                e("wsum = " + " + ".join(f"S[tile_out + {m}]" for m in lanes))
                if self.groups == 1:
                    e(f"part[pbase + {tap} + t] = wsum * sc")
                else:  # groups after the first add to the partial, in order
                    e(f"pi = pbase + {tap} + t", "ps = wsum * sc",
                      "if grp != 0:", "    ps = part[pi] + ps", "part[pi] = ps")
        e("cuda.syncwarp()")
        self.slots = []
