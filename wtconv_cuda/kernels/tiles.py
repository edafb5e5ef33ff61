"""Tiled kernel for large planes: ``wtconv_tile`` (forward, and a backward variant).

The plane kernel (:mod:`.codegen`) keeps a whole plane on chip. A plane too
large for shared memory falls back to global scratch with one thread group per
plane, which leaves most of a GPU idle and moves the plane through memory
several times. This kernel instead gives every block one ``TS x TS`` output
tile of one plane and everything the tile's outputs depend on, read once from
global memory with a halo, so the forward moves little more than the
compulsory bytes (``x`` once, ``y`` once; the halos come mostly from L2).

What a tile needs (``P = K // 2``, levels ``j = 1..L``): level ``j``'s
convolved subbands at the tile's ``TS / 2**j`` coefficients read the subbands
``P`` coefficients around them, that is the raw LL band of level ``j - 1``
``2P`` values around the tile's part of it. Going down the chain, LL band
``i`` is needed ``H_i = 2P * 2**(L-1-i)`` values around the tile (``H_0 = P *
2**L`` pixels of ``x``). Every block therefore

1. loads the ``(TS + 2 H_0)**2`` pixels of ``x`` around its tile (zeros outside
   the image: the zero extension is exactly the operator's padding, at every
   level) and folds the channel's taps;
2. for ``j = 1..L``: forms LL band ``j`` over its halo region (for ``j < L``)
   and convolves level ``j``'s four subbands at the tile's coefficients, the
   Haar analysis fused into the convolution as in the plane kernel;
3. adds the levels' syntheses from the coarsest up into level 1's LL band;
4. runs the base convolution on its output pixels, adds the level-1
   synthesis and the bias and writes the pixels that lie in the image.

Every size and offset is a compile-time constant of the variant (``L`` too), so
the generated code carries no geometry table. The halo grows as ``2**L``:
:func:`tile_geometry` reports the read amplification and the planner uses the
tiles only where it stays small (:func:`wtconv_cuda.kernels.launch.plan_tiles`).

Where one tile covers its plane, the forward may also run the levels above
its own inside the block (``TileSpec.inner_levels``): the tile's LL band of
its top level is then the whole plane's, and the block convolves and
synthesises the coarser levels on it before step 3 (:class:`InnerGeometry`).

The backward variant (stride 1) runs the same steps on ``dy`` with flipped
taps and no bias, which writes ``dx``, then loads the tile of ``x`` and its LL
chain into a second set of grids and sums every tap's correlation over the
tile into one weight-gradient partial per tile (see
:func:`_emit_tile_weight_gradients`).

Buffer layout (float32 elements of dynamic shared memory)::

    [ folded taps and bias | grid 0 (x) | LL grids 1..L-1 | z_1 | z_2 | ... | z_L ]

and for the backward (grids 0..L-1 hold ``dy`` and its chain)::

    [ ... as above ... | x grid 0 | x LL grids 1..L-1 | reduction area ]

Grids are stored polyphase (four planes, one per row and column parity, as in
the plane kernel), so the four values of a Haar block share one index and
neighbouring threads read neighbouring words. ``z_j`` is four ``TS_j x TS_j``
planes (``TS_j = TS / 2**j``), subband-major.
"""

from __future__ import annotations

import re
from contextlib import contextmanager, nullcontext
from functools import lru_cache
from typing import NamedTuple

from .codegen import (
    STORAGE, _butterfly, _DivmodLoop, _Emitter, _emit_block_window, _emit_fold_weights,
    _emit_level_accumulators, _emit_level_item_sums, _emit_pair_window, _floor_div, _floor_mod,
    _guarded_load, _load, _single_item_cost, _store, _strip_item_cost,
)

class TileSpec(NamedTuple):
    """Compile-time parameters of one ``wtconv_tile`` variant.

    Attributes
    ----------
    kernel_size : int
        Odd ``K``.
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (raw ``uint16`` bits).
    levels : int
        Wavelet levels ``L >= 0`` (compile-time: the geometry is unrolled).
    tile : int
        Output tile edge ``TS``: a multiple of ``2**max(L, 1)`` (every level's
        coefficients then tile exactly). The planner picks powers of two; other
        edges (a tile fitted to its plane) come from ``Tuning(tile=...)``.
    threads : int
        Threads per block.
    strip : int
        Level-1 coefficient rows per thread in the output phase (``Q``).
    max_registers : int
        Register cap handed to ptxas (``.maxnreg``); 0 leaves it free.
    analysis_strip : int
        Most coefficient rows of a strip item in the levels' analysis (see
        :func:`analysis_plan`). 8 is 4-5% faster than 4
        at the paper's shapes on an H200 (``benchmarks/tile_bench.py``).
    backward : bool
        The backward variant (stride 1): the same pipeline on ``dy`` with
        flipped taps and no bias writes ``dx``; then the tile of ``x`` and its
        LL chain are loaded and correlated with ``dy``'s, and the tile's
        weight-gradient sums go to a partial (see :func:`tile_kernel_source`).
    coarse : bool
        The levels above ``levels`` ran in a coarse pre-pass
        (:mod:`.coarse`): the kernel takes its float32 output ``r`` of
        ``(B, C, Hc, Wc)`` values and adds it to the top level's convolved
        LL subband before the synthesis.
    inner_levels : int
        Forward only: levels run above ``levels`` inside the block (see
        :class:`InnerGeometry`).
    height, width : int
        Forward only: the plane's ``H x W``, compile-time, for a launch with
        one tile per plane (``ntiles`` 1, the tile no smaller than the plane):
        block ``n`` takes plane ``n``, loads it as one contiguous run
        (:func:`_emit_plane_load`) and stores its pixels with constant sizes,
        checked only on the sides where the tile reaches past the plane. 0
        (the default): sizes from the arguments, any number of tiles.
    planes : int
        Forward tiles over their whole plane (``height`` set), without inner
        levels: planes a block runs side by side, ``threads`` each, all of one
        channel (batch entries ``(n // C) * planes + w`` of channel ``n % C``
        for block ``n``, group ``w``; ``B`` a multiple of it). The groups keep
        one copy of the channel's taps and a data buffer each
        (:func:`shared_floats`), and pass the block's barriers together, so
        the warps of a multiprocessor run the same phase at the same time. 1
        (the default): one plane a block.
    """

    kernel_size: int
    storage: str
    levels: int
    tile: int = 64
    threads: int = 256
    strip: int = 4
    max_registers: int = 0
    analysis_strip: int = 8
    backward: bool = False
    coarse: bool = False
    inner_levels: int = 0
    height: int = 0
    width: int = 0
    planes: int = 1

    def __repr__(self) -> str:
        """As a named tuple's, without ``planes=1``: a variant's name, and the key of its
        compiled PTX (:mod:`.compiler`), stay what they were before the field."""
        fields = (f"{name}={value!r}" for name, value in zip(self._fields, self)
                  if not (name == "planes" and value == 1))
        return f"TileSpec({', '.join(fields)})"


class InnerGeometry(NamedTuple):
    """Layout of the levels a forward tile runs above its own (``TileSpec.inner_levels``).

    The tile covers its plane, so its LL band of level ``L`` is the whole
    plane's, zero outside the image. Inner level ``i = 1..Li`` (level ``L + i``)
    has ``sizes[i] = ceil(sizes[i - 1] / 2)`` coefficients per side. Its source
    is kept as Haar blocks already transformed: four planes (twice LL, LH,
    HL, HH of each 2x2 block of the band one level finer), ``blocks[i - 1]``
    blocks per side, block ``(a, b)`` at ``(a + P, b + P)``, with zero blocks
    around it as far as the convolutions reach.

    Attributes
    ----------
    sizes : tuple of int
        ``M_0 = TS / 2**L, M_1, ..., M_Li``.
    blocks : tuple of int
        ``M_i + 2P`` for ``i = 1..Li`` (entry ``i - 1``).
    grids : tuple of int
        Offset of inner level ``i``'s four block planes (entry ``i - 1``),
        plane ``k`` at ``+ k * strides[i - 1]``.
    strides : tuple of int
        Words between inner level ``i``'s block planes (entry ``i - 1``), at
        least ``blocks[i - 1]**2``: :func:`inner_plane_stride`.
    z : tuple of int
        Offset of the four ``M_i x M_i`` convolved subbands of inner level ``i``
        (entry ``i - 1``), subband-major.
    taps : int
        Offset of the inner levels' folded taps, ``4 K**2`` per level.
    """

    sizes: tuple
    blocks: tuple
    grids: tuple
    strides: tuple
    z: tuple
    taps: int


class TileGeometry(NamedTuple):
    """Compile-time layout of one tile's working set (see the module docstring).

    Attributes
    ----------
    halos : tuple of int
        ``H_i`` for the grids ``i = 0..max(L-1, 0)``: values kept around the
        tile's part of LL band ``i`` (grid 0 is ``x``).
    edges : tuple of int
        Grid edge ``N_i = TS / 2**i + 2 H_i`` of each grid (even).
    grids : tuple of int
        Offset of each grid's first phase plane.
    z : tuple of int
        Offset of ``z_j`` for ``j = 1..L`` (entry ``j - 1``).
    ntaps : int
        Folded taps and bias at the start of the buffer.
    floats : int
        float32 elements of the whole buffer.
    xgrids : tuple of int
        Backward only (else empty): offsets of the grids of ``x``, laid out
        as ``grids`` (the grids above then hold ``dy``).
    reduce : int
        Backward only (else 0): offset of the area where the threads'
        weight-gradient sums meet (:func:`reduce_floats` elements).
    inner : InnerGeometry or None
        Forward with inner levels only (else None): their grids, subbands and
        taps (see :func:`inner_geometry`).
    level_taps : int
        Offset of level 1's folded taps: ``K**2`` where the base taps are
        row-major and each level's ``4 K**2`` taps subband-major (``k, dy,
        dx``), or ``K`` times :func:`_base_pitch` in tiles whose levels run top
        down, which order both by tap column (see :func:`_tap_columns`).
    """

    halos: tuple
    edges: tuple
    grids: tuple
    z: tuple
    ntaps: int
    floats: int
    xgrids: tuple = ()
    reduce: int = 0
    inner: InnerGeometry | None = None
    level_taps: int = 0

    @property
    def read_amplification(self) -> float:
        """Pixels of ``x`` a tile loads per output pixel, ``(N_0 / TS)**2``."""
        ts = self.edges[0] - 2 * self.halos[0]
        return (self.edges[0] / ts) ** 2

    def phase(self, i: int) -> int:
        """Offset between the phase planes of grid ``i`` (see :func:`phase_stride`)."""
        return phase_stride(self.edges[i])

    def pitch(self, i: int) -> int:
        """Row pitch of grid ``i``'s phase planes."""
        return self.edges[i] // 2


def phase_stride(edge: int) -> int:
    """Offset between consecutive phase planes of a grid of edge ``edge``.

    A plane holds ``(edge / 2)**2`` values; the stride is the next number
    that is 16 modulo 32, so a warp whose lanes take consecutive columns of
    one row (even columns in plane 0, odd ones in plane 1) touches 32
    different banks.
    """
    size = (edge // 2) ** 2
    return size + (16 - size) % 32


class StripOrder(NamedTuple):
    """Which strip row each row of items of a strip phase takes.

    The phase's items are :func:`item_row`-padded rows of ``n`` coefficient
    columns (``row`` items each), ``per_warp`` of them to a warp. In the
    natural order item row ``s`` takes strip row ``s``. With ``stride`` above
    1, blocks of ``per_warp * stride`` item rows are dealt so that a warp's
    item rows are ``stride`` strip rows apart (:meth:`strip_row`), which moves
    them to other banks when consecutive strip rows share them; item rows
    past the last strip row are idle.

    Attributes
    ----------
    row : int
        Items per row (:func:`item_row`).
    per_warp : int
        Item rows per warp (1 where a row fills a warp).
    stride : int
        Strip rows between a warp's item rows.
    slots : int
        Item rows, idle ones included.
    """

    row: int
    per_warp: int
    stride: int
    slots: int

    def strip_row(self, slot: int) -> int:
        """The strip row item row ``slot`` takes (past the last: idle)."""
        span = self.per_warp * self.stride
        block, rest = divmod(slot, span)
        return block * span + (rest % self.per_warp) * self.stride + rest // self.per_warp


def _strip_order(n: int, rows: int, stride: int) -> StripOrder:
    row = item_row(n)
    per_warp = max(1, 32 // row)
    strips, span = n // rows, per_warp * stride
    return StripOrder(row, per_warp, stride, strips if stride == 1 else -(-strips // span) * span)


def _most_words_per_bank(words) -> int:
    """Wavefronts of one warp-wide shared read of ``words``: the most distinct words any
    one of the 32 banks is asked for (1: no bank conflict)."""
    banks: dict = {}
    for word in words:
        banks.setdefault(word % 32, set()).add(word)
    return max(len(distinct) for distinct in banks.values())


def strip_wavefronts(n: int, rows: int, pitch: int, stride: int = 1) -> float:
    """Shared-memory wavefronts per warp-wide read of a strip phase (1: no bank conflict).

    Every read of item ``(qx, qy0)`` is at word ``qy0 * pitch + qx`` plus an
    offset common to the warp. A warp whose lanes span two or more strip
    rows reads them in one wavefront only where the rows land on different
    banks.

    Parameters
    ----------
    n : int
        Coefficients per row.
    rows : int
        Coefficient rows per item (``Q``, dividing ``n``).
    pitch : int
        Words between consecutive coefficient rows of the grid read.
    stride : int, default 1
        Strip rows between a warp's item rows (:class:`StripOrder`).

    Returns
    -------
    float
        Mean over the phase's busy warps of the most distinct words any one
        bank is asked for.
    """
    order = _strip_order(n, rows, stride)
    counts = []
    for first in range(0, order.slots * order.row, 32):
        words = []
        for it in range(first, first + 32):
            qx, qy0 = it % order.row, order.strip_row(it // order.row) * rows
            if qx < n and qy0 < n:
                words.append(qy0 * pitch + qx)
        if words:
            counts.append(_most_words_per_bank(words))
    return sum(counts) / len(counts)


def strip_order(n: int, rows: int, pitch: int, threads: int) -> StripOrder:
    """The order of a strip phase's item rows that conflicts least, in no more rounds.

    Parameters
    ----------
    n, rows, pitch : int
        As in :func:`strip_wavefronts`.
    threads : int
        Threads per block (a multiple of 32).

    Returns
    -------
    StripOrder
        The stride with the fewest :func:`strip_wavefronts` among those whose
        items take no more rounds of ``threads`` than the natural order's
        (the smallest on a tie).
    """
    natural = _strip_order(n, rows, 1)
    if natural.per_warp == 1:
        return natural
    rounds = -(-natural.slots * natural.row // threads)
    best = min((stride for stride in range(1, n // rows + 1)
                if -(-_strip_order(n, rows, stride).slots * natural.row // threads) <= rounds),
               key=lambda stride: (strip_wavefronts(n, rows, pitch, stride), stride))
    return _strip_order(n, rows, best)


def correlation_chunks(kernel_size: int, lines: int, threads: int) -> int:
    """Chunks per tap column of the backward's correlations over ``lines`` columns.

    Work item ``(tap column, chunk)``: ``K`` tap columns times this many
    chunks, at most ``threads`` items, each chunk taking every so many
    columns (see :func:`_emit_tile_weight_gradients`).
    """
    return max(1, min(lines, threads // kernel_size))


def reduce_floats(kernel_size: int, levels: int, tile: int, threads: int) -> int:
    """float32 elements the backward's weight-gradient reduction needs.

    The largest of: the base taps' ``K`` sums per item plus one bias sum per
    chunk, and any level's ``4K`` sums per item.
    """
    K = kernel_size
    n = correlation_chunks(K, tile, threads)
    need = K * n * K + n
    for j in range(1, levels + 1):
        need = max(need, K * correlation_chunks(K, tile >> j, threads) * 4 * K)
    return need


def inner_geometry(kernel_size: int, levels: int, tile: int, inner_levels: int,
                   free: tuple) -> tuple:
    """Sizes and offsets of a tile's inner levels (see :class:`InnerGeometry`).

    Inner level 1's blocks (formed from grid ``L - 1`` while level ``L``
    reads that grid too) get new space. The other levels' blocks, the
    subbands and the taps are only used after level ``L``'s analysis, when
    grid ``L - 1`` is dead: they go in its place if they fit there, else after
    level 1's blocks. (At ``L = 1`` that grid is ``x``, which the output phase
    still reads: the caller passes an empty region.)

    Parameters
    ----------
    kernel_size : int
        Odd ``K``.
    levels : int
        The tile's levels ``L >= 1``.
    tile : int
        Tile edge ``TS``.
    inner_levels : int
        Levels above ``L`` to run, ``Li >= 1``.
    free : tuple
        ``((start, size), end)``: the dead region (grid ``L - 1``'s; size 0
        for none), and the first float past the tile's buffer.

    Returns
    -------
    tuple
        ``(InnerGeometry, floats)``: the layout and the buffer's new size.
    """
    P = (kernel_size - 1) // 2
    sizes = [tile >> levels]
    for _ in range(inner_levels):
        sizes.append(-(-sizes[-1] // 2))
    blocks = tuple(m + 2 * P for m in sizes[1:])
    strides = tuple(inner_plane_stride(m, n) for m, n in zip(sizes[1:], blocks))
    (dead, dead_size), end = free
    first = end
    end += 4 * strides[0]
    rest = (4 * kernel_size ** 2 * inner_levels + sum(4 * s for s in strides[1:])
            + sum(4 * m * m for m in sizes[1:]))
    offset = dead if rest <= dead_size else end
    if offset == end:
        end += rest
    taps = offset
    offset += 4 * kernel_size ** 2 * inner_levels
    grids = [first]
    for stride in strides[1:]:
        grids.append(offset)
        offset += 4 * stride
    z = []
    for m in sizes[1:]:
        z.append(offset)
        offset += 4 * m * m
    return InnerGeometry(tuple(sizes), blocks, tuple(grids), strides, tuple(z), taps), end


def inner_conv_wavefronts(size: int, blocks: int, stride: int) -> float:
    """Shared-memory wavefronts per warp-wide read of an inner level's convolution.

    The level's ``4 M**2`` items take subband ``k = it // M**2`` and
    coefficient ``q = it % M**2`` (coefficients fastest), and every tap's
    read of item ``it`` is at word ``k * stride + (q // M) * blocks + q % M``
    plus an offset common to the warp. Warps take 32 consecutive items
    whatever the block's size.

    Parameters
    ----------
    size : int
        Coefficients per side, ``M``.
    blocks : int
        Blocks per side of the planes read (``M + 2P``), their row pitch.
    stride : int
        Words between the four planes.

    Returns
    -------
    float
        Mean over the level's warps of the most distinct words any one bank
        is asked for (1: no bank conflict).
    """
    mm, counts = size * size, []
    for first in range(0, 4 * mm, 32):
        items = (divmod(it, mm) for it in range(first, min(first + 32, 4 * mm)))
        counts.append(_most_words_per_bank(k * stride + (q // size) * blocks + q % size
                                           for k, q in items))
    return sum(counts) / len(counts)


@lru_cache(maxsize=None)
def inner_plane_stride(size: int, blocks: int) -> int:
    """Words between an inner level's four block planes: the fewest bank conflicts.

    With planes packed (``blocks**2`` apart) a warp reading two or more of
    them may hit one bank once per plane: at 14 x 14 (``M = 4``, 8 x 8
    blocks) the planes lie 64 words apart, a multiple of the 32 banks. The
    stride is the smallest of ``blocks**2 .. blocks**2 + 31`` with the fewest
    :func:`inner_conv_wavefronts`.
    """
    packed = blocks * blocks
    return min(range(packed, packed + 32),
               key=lambda stride: (inner_conv_wavefronts(size, blocks, stride), stride))


def tile_geometry(kernel_size: int, levels: int, tile: int, backward: bool = False,
                  threads: int = 128, inner_levels: int = 0,
                  whole_plane: bool = False) -> TileGeometry:
    """Halos, grid sizes and buffer offsets of a tile (see :class:`TileGeometry`).

    A tile inside a larger plane keeps ``H_i = 2P * 2**(L-1-i)`` values around
    its part of LL band ``i``: the bands it forms there feed the levels above.
    A forward tile that covers its whole plane (``whole_plane``: every value
    outside the tile is zero) keeps only the ``2P`` its own level's taps reach
    past it on every grid: the bands are formed over the tile alone and the
    halos hold zeros (:func:`_emit_ll_band`). Without inner levels such a tile
    of ``L >= 2`` also convolves its levels top down, so ``z_1`` starts where
    grid 1 does (:func:`_levels_top_down`). The values are the same, in less
    shared memory: at 28 x 28 (``L`` 2, ``K`` 5, tile 32) 12.1 KB a block
    instead of 17.4, 17 one-warp blocks per multiprocessor instead of 12.

    Parameters
    ----------
    kernel_size : int
        Odd ``K``.
    levels : int
        Wavelet levels ``L >= 0``.
    tile : int
        Tile edge ``TS``, a positive multiple of ``2**max(L, 1)``.
    backward : bool, default False
        Add the backward's grids of ``x`` and its reduction area.
    threads : int, default 128
        Threads per block (sizes the backward's reduction area).
    inner_levels : int, default 0
        Forward only: levels run above ``L`` inside the block
        (:attr:`TileSpec.inner_levels`; needs ``L >= 1``).
    whole_plane : bool, default False
        Forward only: the tile covers its plane (:attr:`TileSpec.height`),
        so every grid's halo is ``2P``.

    Returns
    -------
    TileGeometry

    Raises
    ------
    ValueError
        ``tile`` is not a positive multiple of ``2**max(L, 1)``, or inner
        levels or a whole plane with a backward, or inner levels without a
        level of the tile's own.
    """
    K, L, TS = kernel_size, levels, tile
    if TS <= 0 or TS % 2 ** max(L, 1):
        raise ValueError(f"tile must be a positive multiple of 2**max(L, 1) = "
                         f"{2 ** max(L, 1)}, got {TS}")
    P = (K - 1) // 2
    if whole_plane and backward:
        raise ValueError("a tile over its whole plane is a forward tile")
    if L == 0:
        halos = (P + (P & 1),)  # even, so the grid's phases stay aligned with the tile
    elif whole_plane:
        halos = (2 * P,) * L
    else:
        halos = tuple(2 * P * 2 ** (L - 1 - i) for i in range(L))
    edges = tuple((TS >> i) + 2 * h for i, h in enumerate(halos))
    top_down = whole_plane and L >= 2 and not inner_levels
    # top down, the taps are ordered by tap column, each on a 16-byte boundary
    level_taps = K * _base_pitch(K) if top_down else K * K
    ntaps = level_taps + 4 * K * K * L + 1
    offset, grids = ntaps, []
    for n in edges:
        grids.append(offset)
        offset += 4 * phase_stride(n)
    z = []
    if top_down:
        # the levels run top down (see _levels_top_down): level 1 runs last, when the LL
        # grids 1..L-1 are dead, so z_1 starts where grid 1 did
        end = offset
        z.append(grids[1])
        offset = max(end, grids[1] + 4 * (TS >> 1) ** 2)
        for j in range(2, L + 1):
            z.append(offset)
            offset += 4 * (TS >> j) ** 2
        return TileGeometry(halos, edges, tuple(grids), tuple(z), ntaps, offset,
                            level_taps=level_taps)
    else:
        for j in range(1, L + 1):
            z.append(offset)
            offset += 4 * (TS >> j) ** 2
    if inner_levels:
        if backward or L < 1:
            raise ValueError("inner levels need a forward tile with at least one level")
        # grid L - 1 is dead once level L has read it, unless it is grid 0 (x), which the
        # output phase reads last
        dead = (grids[L - 1], 4 * phase_stride(edges[L - 1])) if L >= 2 else (0, 0)
        inner, offset = inner_geometry(K, L, TS, inner_levels, (dead, offset))
        return TileGeometry(halos, edges, tuple(grids), tuple(z), ntaps, offset, inner=inner,
                            level_taps=level_taps)
    if not backward:
        return TileGeometry(halos, edges, tuple(grids), tuple(z), ntaps, offset,
                            level_taps=level_taps)
    xgrids = []
    for n in edges:
        xgrids.append(offset)
        offset += 4 * phase_stride(n)
    reduce = offset
    offset += reduce_floats(K, L, TS, threads)
    return TileGeometry(halos, edges, tuple(grids), tuple(z), ntaps, offset, tuple(xgrids),
                        reduce, level_taps=level_taps)


def spec_geometry(spec: TileSpec) -> TileGeometry:
    """:func:`tile_geometry` of a variant (a whole plane where ``spec.height`` is set)."""
    return tile_geometry(spec.kernel_size, spec.levels, spec.tile, spec.backward, spec.threads,
                         spec.inner_levels, whole_plane=bool(spec.height))


def plane_floats(spec: TileSpec) -> int:
    """float32 words between the data buffers of a block's planes (``spec.planes`` above
    1): a plane's buffer past the taps, rounded up to 16 bytes (the taps' ``LDS.128``
    alignment, and each plane's grids keep their offsets modulo 4)."""
    geo = spec_geometry(spec)
    return -(-(geo.floats - geo.ntaps) // 4) * 4


def shared_floats(spec: TileSpec) -> int:
    """float32 words of a block's shared buffer: the geometry's, or with ``spec.planes``
    above 1 the taps once and :func:`plane_floats` for each plane."""
    geo = spec_geometry(spec)
    if spec.planes == 1:
        return geo.floats
    return geo.ntaps + spec.planes * plane_floats(spec)


#: Most level-1 coefficient rows of an output-phase item (:func:`output_strip`): its
#: ``4 Q`` accumulators then number the 28 of a level-1 strip item.
OUTPUT_STRIP_MOST = 7


def output_strip(tile: int, threads: int, most: int = OUTPUT_STRIP_MOST) -> int:
    """Level-1 coefficient rows per output-phase item.

    Among the divisors ``Q`` of ``tile / 2`` up to ``most``, the one whose
    items (rows padded by :func:`item_row`) take the fewest rounds of
    ``threads``, and of those the one with the most items (threads at work).
    On an H200, fp32, K 5 (``benchmarks/split_stages.py``, whole forward):
    the 56 x 56 stage's fitted 56 tile (128 threads) took 203.3 us with
    ``Q`` 7 (one round of 112 items) against 216.0 with 4 (two rounds, the
    second of 84) and 215.5 with 2; the 14 x 14 stage's 16 tile (32 threads)
    86.5 us with 2 (one round) against 94.5 with 4 (one round, half the
    threads idle).

    Parameters
    ----------
    tile : int
        Tile edge ``TS`` (even).
    threads : int
        Threads per block.
    most : int, default `OUTPUT_STRIP_MOST`
        Most rows per item.

    Returns
    -------
    int
        ``Q``, for :attr:`TileSpec.strip`.
    """
    n1 = tile // 2
    row = item_row(n1)

    def cost(q: int) -> tuple:
        items = row * (n1 // q)
        return -(-items // threads), -items

    return min((q for q in range(1, min(most, n1) + 1) if n1 % q == 0), key=cost)


def item_row(coefficients: int) -> int:
    """Items per row of coefficients, padded so that no warp straddles two rows.

    The strip phases number their items row by row. On an edge that is not
    a power of two, a row of ``n`` items would leave warps with lanes in two
    rows (whose reads meet in the same banks) and idle lanes at a row's end
    anyway; the row is padded to the next power of two below 32 items, or to
    a multiple of 32, and the padding items do nothing. Power-of-two edges
    are their own row.

    Parameters
    ----------
    coefficients : int
        Coefficients per row, ``n``.

    Returns
    -------
    int
        Items per row, at least ``n``.
    """
    n = coefficients
    if n & (n - 1) == 0:
        return n
    return 1 << n.bit_length() if n < 32 else -(-n // 32) * 32


@contextmanager
def _strip_items(e: _Emitter, n: int, Q: int, threads: int, pitch: int):
    """``for it in ...:`` over the items of ``Q``-row strips of an ``n x n`` grid, rows
    padded by :func:`item_row` and dealt in the :func:`strip_order` of a grid of row
    pitch ``pitch``; the body sees ``qx`` and ``qy0`` and skips idle items."""
    order = strip_order(n, Q, pitch, threads)
    row, per_warp, stride = order.row, order.per_warp, order.stride
    e(f"for it in range(tid, {order.slots * row}, {threads}):")
    with e.indent():
        e(f"qx = {_floor_mod('it', row)}")
        if stride == 1:
            e(f"qy0 = ({_floor_div('it', row)}) * {Q}")
        else:
            span = per_warp * stride
            e(f"# item rows {stride} strip rows apart in a warp: other banks",
              f"slot = {_floor_div('it', row)}", f"first = slot - {_floor_mod('slot', span)}",
              f"qy0 = (first + ({_floor_mod('slot', per_warp)}) * {stride} + "
              f"({_floor_div('slot - first', per_warp)})) * {Q}")
        idle = [f"qx >= {n}"] if row != n else []
        if order.slots > n // Q:
            idle.append(f"qy0 >= {n}")
        if idle:
            e(f"if {' or '.join(idle)}:", "    continue")
        yield


def analysis_plan(kernel_size: int, coefficients: int, threads: int, max_strip: int = 4) -> int:
    """Work decomposition of one level's subband convolutions in a tile.

    Parameters
    ----------
    kernel_size : int
        ``K``.
    coefficients : int
        The level's tile edge ``TS_j`` (``TS_j**2`` coefficients).
    threads : int
        Threads per block.
    max_strip : int, default 4
        Most rows per strip item.

    Returns
    -------
    int
        Rows per strip item (a divisor of ``TS_j`` up to ``max_strip``), or 0
        for single items (one subband of one coefficient each): whichever
        takes the fewest serial instructions, rounds of ``threads`` items
        (rows padded by :func:`item_row`) times an item's cost.
    """
    K, n = kernel_size, coefficients
    best, best_cost = 0, -(-(4 * n * n) // threads) * _single_item_cost(K)
    for Q in range(min(max_strip, n), 0, -1):
        if n % Q:
            continue
        cost = -(-((n // Q) * item_row(n)) // threads) * _strip_item_cost(K, Q)
        if cost < best_cost:
            best, best_cost = Q, cost
    return best


def tile_kernel_source(spec: TileSpec) -> str:
    """Python source of ``wtconv_tile`` for ``spec``.

    The forward kernel takes ``(x, y, w0, b0, s0, ww, ws, H, W, C, has_bias,
    tiles_x, ntiles)``: seven pointers to the storage type, then int64 scalars;
    the backward one ``(grad_out, grad_in, x, w0, b0, s0, ww, ws, part, H, W,
    C, has_bias, tiles_x, ntiles, B)`` (``grad_out`` is ``dy``, ``grad_in``
    receives ``dx``), ``part`` a float32 pointer (see
    :func:`wtconv_cuda.kernels.compiler.tile_signature`). Block ``n`` computes
    tile ``n % ntiles`` (row-major, ``tiles_x`` per row) of plane ``n //
    ntiles``; it needs ``4 * tile_geometry(...).floats`` bytes of dynamic
    shared memory and ``spec.threads`` threads. The backward writes ``dx``
    like the forward writes ``y`` (flipped taps, no bias), then the tile's
    weight-gradient sums (:func:`_emit_tile_weight_gradients`). With
    ``spec.coarse`` both take three more arguments at the end, ``coarse`` (a
    float32 pointer to the coarse pass's ``(B, C, Hc, Wc)`` output) and int64
    ``Hc, Wc``.

    Parameters
    ----------
    spec : TileSpec
        The variant to generate.

    Returns
    -------
    str
        Source of a function ``wtconv_tile``, for :func:`wtconv_cuda.kernels.codegen.build`.

    Raises
    ------
    ValueError
        An even or non-positive kernel size, an unknown storage, a bad tile
        edge (see :func:`tile_geometry`), a strip that does not divide the
        level-1 tile edge, fewer than 32 threads, or ``planes`` above 1 in
        anything but a forward tile over its whole plane without inner levels.
    """
    K, L, TS, NT, Q = spec.kernel_size, spec.levels, spec.tile, spec.threads, spec.strip
    if K < 1 or K % 2 == 0:
        raise ValueError(f"kernel_size must be odd and >= 1, got {K}")
    if spec.storage not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, got {spec.storage!r}")
    if L < 0:
        raise ValueError(f"levels must be >= 0, got {L}")
    if spec.inner_levels < 0 or (spec.inner_levels and (spec.backward or spec.coarse or L < 1)):
        raise ValueError("inner_levels needs a forward tile with at least one level and no "
                         f"coarse pre-pass, got {spec}")
    plane = (spec.height, spec.width)
    if plane != (0, 0) and (spec.backward or not (0 < spec.height <= TS and 0 < spec.width <= TS)):
        raise ValueError(f"height and width need a forward tile that covers the plane, got {spec}")
    geo = spec_geometry(spec)
    if Q < 1 or (TS // 2) % Q:
        raise ValueError(f"strip must divide the level-1 tile edge {TS // 2}, got {Q}")
    if NT < 32 or NT % 32:
        raise ValueError(f"threads must be a positive multiple of 32, got {NT}")
    planes = spec.planes
    if planes < 1 or (planes > 1 and not (spec.height and not spec.backward
                                          and not spec.inner_levels)):
        raise ValueError("planes above 1 need a forward tile over its whole plane without "
                         f"inner levels, got {spec}")

    e = _Emitter()
    extra = ", coarse, Hc, Wc" if spec.coarse else ""
    if spec.backward:
        e("def wtconv_tile(grad_out, grad_in, x, w0, b0, s0, ww, ws, part, H, W, C, has_bias, "
          f"tiles_x, ntiles, B{extra}):")
    else:
        e(f"def wtconv_tile(x, y, w0, b0, s0, ww, ws, H, W, C, has_bias, tiles_x, ntiles{extra}):")
    source = "grad_out" if spec.backward else "x"  # dy, or x
    with e.indent():
        e("S = cuda.shared.array(0, dtype=float32)")
        if planes > 1:  # S[so + i]: this plane's word i (i >= the taps); T[i]: tap i
            e("T = S",
              f"wp = {_floor_div('int64(cuda.threadIdx.x)', NT)}",
              f"tid = int64(cuda.threadIdx.x) - wp * {NT}",
              f"so = wp * {plane_floats(spec)}")
        else:
            e("tid = int64(cuda.threadIdx.x)")
        e("fz = float32(0.0)",
          "f05 = float32(0.5)",
          f"L = {L}",
          "sb = int64(0)",
          "bid = int64(cuda.blockIdx.x)")
        if planes > 1:
            e(f"# block -> {planes} planes of channel bid % C, batch entries "
              f"(bid // C) * {planes} + wp",
              "cb = bid // C", f"plane = (cb * {planes} + wp) * C + (bid - cb * C)",
              "oy = int64(0)", "ox = int64(0)")
        elif spec.height:
            e("# block -> plane (one tile per plane)", "plane = bid", "oy = int64(0)",
              "ox = int64(0)")
        else:
            e("# block -> (plane, tile row, tile column); tiles of a plane are consecutive",
              "plane = bid // ntiles",
              "tile = bid - plane * ntiles",
              "trow = tile // tiles_x",
              f"oy = trow * {TS}",
              f"ox = (tile - trow * tiles_x) * {TS}")
        e("c = plane - (plane // C) * C")
        if planes > 1:  # one group folds the channel's taps; the first barrier publishes them
            e("if wp == 0:")
        with e.indent() if planes > 1 else nullcontext():
            columns = _tap_columns(geo)
            _emit_fold_weights(e, spec, tap_columns=geo.level_taps if columns else 0,
                               base_pitch=_base_pitch(K) if columns else 0, array=_taps(spec))
        if spec.coarse:
            _emit_coarse_loads(e, spec)
        if spec.height:
            _emit_plane_load(e, spec, geo, source)
        else:
            _emit_tile_load(e, spec, geo, source, geo.grids)
        if spec.coarse:
            _emit_coarse_stores(e, spec, geo)
        e("cuda.syncthreads()")

        def convolve(j: int) -> None:
            Qj = analysis_plan(K, TS >> j, NT, spec.analysis_strip)
            # the top level's LL subband adds the coarse output parked in its place
            add_coarse = spec.coarse and j == L
            if Qj:
                _emit_tile_strips(e, spec, geo, j, Qj, add_coarse)
            else:
                _emit_tile_singles(e, spec, geo, j, add_coarse)

        if _levels_top_down(geo):  # the LL bands, then the levels from L down to 1
            for j in range(1, L):
                _emit_ll_band(e, spec, geo, geo.grids, j)
                e("cuda.syncthreads()")
            for j in range(L, 1, -1):  # (each reads grid j - 1, writes its own z_j)
                convolve(j)
            e("cuda.syncthreads()")  # z_1 goes over grid 1
            convolve(1)
            e("cuda.syncthreads()")
        else:  # level j with LL band j, which level j + 1 reads after the barrier
            for j in range(1, L + 1):
                if j < L:
                    _emit_ll_band(e, spec, geo, geo.grids, j)
                if geo.inner and j == L:
                    _emit_inner_tap_loads(e, spec, geo)
                    _emit_inner_blocks(e, spec, geo, 1)
                convolve(j)
                e("cuda.syncthreads()")
        if geo.inner:
            _emit_inner_levels(e, spec, geo)
        for j in range(L, 1, -1):
            _emit_tile_synthesis(e, spec, geo, j)
            e("cuda.syncthreads()")
        _emit_tile_output(e, spec, geo, "grad_in" if spec.backward else "y")  # dx, or y
        if spec.backward:
            _emit_tile_weight_gradients(e, spec, geo)
    if planes > 1:  # every access but the taps' is to this plane's buffer
        return re.sub(r"(?<![\w.])S\[", "S[so + ", e.text())
    return e.text()


def _taps(spec: TileSpec) -> str:
    """The name the kernel reads and writes its folded taps through: ``T`` in a block of
    several planes (the block's one copy), else ``S``."""
    return "T" if spec.planes > 1 else "S"


def _grid_index(geo: TileGeometry, grids: tuple, i: int, row: str, col: str) -> str:
    """Shared index of local element ``(row, col)`` of grid ``i`` of the set ``grids``."""
    return (f"{grids[i]} + (({row}) & 1) * {2 * geo.phase(i)} + (({col}) & 1) * "
            f"{geo.phase(i)} + (({row}) >> 1) * {geo.pitch(i)} + (({col}) >> 1)")


#: Most global loads a thread issues before the first of their shared stores in the
#: tile load: row pairs are taken in groups so that one memory latency covers them.
TILE_LOAD_BATCH = 18


def _emit_tile_load(e: _Emitter, spec: TileSpec, geo: TileGeometry, array: str,
                    grids: tuple) -> None:
    """Grid 0 of ``grids``: the ``N_0 x N_0`` pixels of ``array`` around the tile, zeros
    outside the image.

    Warp ``w`` takes the row pairs ``w, w + warps, ...``; its lanes take the
    columns ``lane + 32 m``. Which columns lie in the image, and where a
    column lands in the phase planes, is worked out once per thread. A warp
    takes its row pairs ``U`` at a time and issues their ``2 U ceil(N_0 / 32)``
    loads (at most `TILE_LOAD_BATCH`) before its stores, so one memory latency
    covers them: with one pair at a time, the load phase of the 56 x 56 tile
    (``x`` from DRAM) held 16% of the kernel's warp samples on an H200. ``U``
    splits a warp's pairs into the fewest such groups of near-equal size (a
    last, smaller group still issues ``U`` pairs' guarded instructions).
    Tiles that cover their plane load it with :func:`_emit_plane_load`.
    """
    N0, H0, NT = geo.edges[0], geo.halos[0], spec.threads
    ph, pitch = geo.phase(0), geo.pitch(0)
    chunks = -(-N0 // 32)
    warps, pairs = NT // 32, N0 // 2
    per_warp = -(-pairs // warps)
    most = max(1, min(TILE_LOAD_BATCH // (2 * chunks), per_warp))
    U = -(-per_warp // -(-per_warp // most))  # as many groups, of near-equal size
    e(f"gy0 = oy - {H0}", "xbase = plane * H * W",
      "lane = tid & 31",
      f"gxl = ox - {H0} + lane",
      f"scol = {grids[0]} + (lane & 1) * {ph} + (lane >> 1)")
    for m in range(chunks):
        inside = f" and lane < {N0 - 32 * m}" if 32 * (m + 1) > N0 else ""
        e(f"col{m} = gxl >= {-32 * m} and gxl < W - {32 * m}{inside}")
        if inside:
            e(f"keep{m} = lane < {N0 - 32 * m}")
    full = pairs % (warps * U) == 0  # every group's U pairs lie in the grid
    e(f"for group in range(tid >> 5, {pairs}, {warps * U}):")
    with e.indent():
        for u in range(U):
            guard = "" if u == 0 or full else f" and pr{u} < {pairs}"
            e(f"pr{u} = group + {u * warps}")
            for r in (0, 1):
                e(f"ry{u}{r} = gy0 + 2 * pr{u} + {r}",
                  f"row{u}{r} = ry{u}{r} >= 0 and ry{u}{r} < H{guard}",
                  f"gp{u}{r} = xbase + ry{u}{r} * W + gxl")
            for r in (0, 1):
                for m in range(chunks):
                    e(f"v{u}{r}_{m} = " + _guarded_load(spec.storage,
                                                        f"{array}[gp{u}{r} + {32 * m}]",
                                                        f"row{u}{r} and col{m}"))
        for u in range(U):
            pad = ""
            if u and not full:  # a pair past the grid (in the last group) stores nothing
                e(f"if pr{u} < {pairs}:")
                pad = "    "
            e(f"{pad}sp = scol + pr{u} * {pitch}")
            for r in (0, 1):
                for m in range(chunks):
                    target = (f"S[sp + {r * 2 * ph + 16 * m}] = "
                              f"{_load(spec.storage, f'v{u}{r}_{m}')}")
                    if 32 * (m + 1) > N0:
                        e(f"{pad}if keep{m}:", f"{pad}    {target}")
                    else:
                        e(f"{pad}{target}")


def _emit_plane_load(e: _Emitter, spec: TileSpec, geo: TileGeometry, array: str) -> None:
    """Grid 0 from a whole plane of ``array`` of compile-time ``spec.height x spec.width``.

    With one tile per plane the tile's part of ``x`` is the plane, one
    contiguous run: thread ``tid`` takes its pixels ``tid + r * threads``
    (whose rows and columns step on from the thread's first, with no
    division), at most `TILE_LOAD_BATCH` loads before their stores. The
    grid's four phase planes are zeroed first, contiguously, and a barrier
    orders that before the pixels land, so the halo (rows and columns outside
    the image) costs one store per element and no loads. At 14 x 14 the
    row-pair load of :func:`_emit_tile_load` (24 of a 24 x 24 grid's
    elements per lane, bounds checked in 64-bit integers) was 27% of the
    kernel's executed instructions on an H200.
    """
    Hp, Wp, NT, H0 = spec.height, spec.width, spec.threads, geo.halos[0]
    grid, ph = geo.grids[0], geo.phase(0)
    if _halos_halve(geo):
        e("# grid 0: zeros, then the plane's pixels over them")
        zeros = 4 * ph
    else:  # the LL grids' halos stay zero too (_emit_ll_band fills the tile's part only)
        e("# grid 0: zeros, then the plane's pixels over them; grids 1 to L - 1: zeros")
        last = len(geo.halos) - 1
        zeros = geo.grids[last] + 4 * geo.phase(last) - grid
    _emit_round_stores(e, zeros, NT, lambda r: f"S[{grid} + tid + {r * NT}] = fz")
    e("cuda.syncthreads()",
      f"xbase = plane * {Hp * Wp}",
      f"py = tid // {Wp}",
      f"px = tid - py * {Wp}")
    rounds = _thread_rounds(Hp * Wp, NT)
    batches = -(-len(rounds) // TILE_LOAD_BATCH)
    size = -(-len(rounds) // batches)
    dy, dx = divmod(NT, Wp)  # the pixel NT on: whole rows and columns, one carry
    for first in range(0, len(rounds), size):
        batch = rounds[first:first + size]
        for r, rest in batch:
            if r:
                e(f"px += {dx}", f"py += {dy}", f"if px >= {Wp}:",
                  f"    px -= {Wp}", "    py += 1")
            e(f"sy{r} = py + {H0}", f"sx{r} = px + {H0}")
            load = f"{array}[xbase + tid + {r * NT}]"  # converted at its store
            e(f"v{r} = {load}" if rest is None
              else f"v{r} = " + _guarded_load(spec.storage, load, f"tid < {rest}"))
        for r, rest in batch:
            store = (f"S[{_grid_index(geo, geo.grids, 0, f'sy{r}', f'sx{r}')}] = "
                     f"{_load(spec.storage, f'v{r}')}")
            if rest is None:
                e(store)
            else:
                e(f"if tid < {rest}:", f"    {store}")


def _levels_top_down(geo: TileGeometry) -> bool:
    """Whether ``z_1`` lies over the LL grids (see :func:`tile_geometry`): the kernel then
    forms every LL band first and convolves the levels from the top down, level 1 last."""
    return len(geo.grids) > 1 and geo.z[0] < geo.grids[-1] + 4 * geo.phase(len(geo.grids) - 1)


def _base_pitch(kernel_size: int) -> int:
    """Words between the base taps' columns where the taps are ordered by tap column:
    ``K`` rounded up to a multiple of 4."""
    return -(-kernel_size // 4) * 4


def _tap_columns(geo: TileGeometry) -> bool:
    """Whether the taps are ordered by tap column (see :func:`tile_geometry`).

    In a tile whose levels run top down, base tap ``(dy, dx)`` is at ``dx Kp +
    dy`` (``Kp`` = :func:`_base_pitch`) and level ``j``'s tap ``(k, dy, dx)`` at
    ``level_taps + (j - 1) 4 K**2 + dx 4 K + k K + dy``: the taps one tap
    column reads are adjacent and start on a 16-byte boundary, at addresses the
    generated code gives as constants (the tap columns are unrolled), so
    ptxas loads them four at a time (``LDS.128``).
    """
    return _levels_top_down(geo)


def _halos_halve(geo: TileGeometry) -> bool:
    """Whether each grid's halo is half the one below it (a tile inside its plane), not
    ``2P`` on every grid (a tile over its whole plane, see :func:`tile_geometry`)."""
    return all(h == 2 * n for h, n in zip(geo.halos, geo.halos[1:]))


def _emit_ll_band(e: _Emitter, spec: TileSpec, geo: TileGeometry, grids: tuple, j: int) -> None:
    """LL band ``j`` over grid ``j``'s region, from grid ``j - 1`` (of the set ``grids``).

    Where the halos halve, grid ``j``'s element ``(a, b)`` is the Haar block at
    ``(2a, 2b)`` of grid ``j - 1``, i.e. index ``a * pitch + b`` of its four
    phase planes, and the whole grid is formed. A tile over its whole plane
    forms only its own ``TS / 2**j`` square at ``(H_j, H_j)``; the band is zero
    around it (outside the plane), and those zeros were stored with grid 0's.
    """
    NT = spec.threads
    src, ph, pitch = grids[j - 1], geo.phase(j - 1), geo.pitch(j - 1)
    if _halos_halve(geo):
        n, first, shift = geo.edges[j], "", ""
        e(f"# LL band {j} over its {n} x {n} region")
    else:
        n, first = spec.tile >> j, f" + {geo.halos[j]}"
        shift = f" + {geo.halos[j - 1] // 2 * (pitch + 1)}"  # the tile's first block
        e(f"# LL band {j} over the tile's {n} x {n} values (zeros around them)")
    e(f"nll = int64({n})")
    with _DivmodLoop(e, "it", "tid", str(n * n), NT, "nll", "a", "b"):
        e(f"p = {src} + a * {pitch} + b{shift}",
          f"S[{_grid_index(geo, grids, j, f'a{first}', f'b{first}')}] = "
          f"f05 * ((S[p] + S[p + {ph}]) + (S[p + {2 * ph}] + S[p + {3 * ph}]))")


def _level_layout(spec: TileSpec, geo: TileGeometry, j: int) -> tuple:
    """Constants of level ``j``'s analysis: ``(n, off, src, phase, pitch, z, taps)``.

    ``n`` coefficients per tile edge; coefficient row ``q``'s tap row ``t``
    reads phase row ``q + t + off`` of grid ``j - 1`` (at ``src``, with
    ``phase`` and ``pitch``); ``z`` is the offset of ``z_j``, ``taps`` that of
    the level's folded taps.
    """
    K = spec.kernel_size
    off = geo.halos[j - 1] // 2 - (K - 1) // 2
    return (spec.tile >> j, off, geo.grids[j - 1], geo.phase(j - 1), geo.pitch(j - 1),
            geo.z[j - 1], geo.level_taps + (j - 1) * 4 * K * K)


def _emit_tile_strips(e: _Emitter, spec: TileSpec, geo: TileGeometry, j: int, Q: int,
                      add_coarse: bool = False) -> None:
    """Level ``j``'s four convolved subbands, ``Q`` coefficient rows of one column per item.

    As the plane kernel's strip items: for each tap column the ``Q + K - 1``
    Haar blocks of that column are formed once and feed every (row, tap row)
    pair they belong to. Grid ``j - 1``'s phase row of coefficient row ``q`` is
    ``q + H_{j-1} / 2``; the taps reach ``P`` rows and columns either side.
    With ``add_coarse`` the LL subband's sums are added to the values parked
    in its place (:func:`_emit_coarse_stores`).
    """
    K, NT, K2, T = spec.kernel_size, spec.threads, spec.kernel_size ** 2, _taps(spec)
    n, off, src, ph, pitch, zo, wb = _level_layout(spec, geo, j)
    e(f"# level {j}: {n} x {n} coefficients, strips of {Q} rows")
    with _strip_items(e, n, Q, NT, pitch):
        e(f"base = {src} + (qy0 + {off}) * {pitch} + qx + {off}")
        for k in range(4):
            e(", ".join(f"acc{k}_{i}" for i in range(Q)) + " = "
              + ", ".join("fz" for _ in range(Q)))
        columns = _tap_columns(geo)  # constant tap addresses, one tap column at a time
        for dx in range(K if columns else 1):
            if columns:
                e(f"# tap column {dx}", f"col = base + {dx}")
                body = nullcontext()
            else:
                e(f"for dx in range({K}):")
                body = e.indent()
            with body:
                if not columns:
                    e(f"wr = {wb} + dx", "col = base + dx")
                for k in range(4):
                    for dy in range(K):
                        e(f"w{k}_{dy} = {T}[{wb + dx * 4 * K + k * K + dy}]" if columns
                          else f"w{k}_{dy} = {T}[wr + {k * K2 + dy * K}]")
                for r in range(Q + K - 1):
                    _butterfly(e, "u", "", f"col + {r * pitch}", str(ph))
                    for i in range(Q):
                        dy = r - i
                        if 0 <= dy < K:
                            for k in range(4):
                                e(f"acc{k}_{i} += w{k}_{dy} * u{k}_")
        for i in range(Q):
            e(f"zq = {zo} + (qy0 + {i}) * {n} + qx")
            if add_coarse:
                e(f"S[zq] = acc0_{i} + S[zq]")
            for k in range(1 if add_coarse else 0, 4):
                e(f"S[zq + {k * n * n}] = acc{k}_{i}")


def _emit_tile_singles(e: _Emitter, spec: TileSpec, geo: TileGeometry, j: int,
                       add_coarse: bool = False) -> None:
    """Level ``j``'s subbands, one (subband, coefficient) per item: for coarse levels.

    With ``add_coarse`` the LL subband's sums are added to the values parked in
    its place (:func:`_emit_coarse_stores`).
    """
    K, NT, K2 = spec.kernel_size, spec.threads, spec.kernel_size ** 2
    n, off, src, ph, pitch, zo, wb = _level_layout(spec, geo, j)
    band = f"(S[p] + s1 * S[p + {ph}]) + s2 * (S[p + {2 * ph}] + s1 * S[p + {3 * ph}])"
    e(f"# level {j}: {n} x {n} coefficients, one subband of one coefficient per item",
      f"for it in range(tid, {4 * n * n}, {NT}):")
    with e.indent():
        e("k = it & 3", "q = it >> 2",
          "# subband k of the butterfly (a, b, c, d): (a + s1 b) + s2 (c + s1 d)",
          "s1 = float32(1 - 2 * (k >> 1))", "s2 = float32(1 - 2 * (k & 1))",
          f"qx = {_floor_mod('q', n)}", f"qy = {_floor_div('q', n)}",
          f"base = {src} + (qy + {off}) * {pitch} + qx + {off}")
        columns = _tap_columns(geo)  # tap (k, dy, dx) at wk + dx 4K + dy
        e(f"wk = {wb} + k * {K if columns else K2}", "acc = fz", f"for dx in range({K}):")
        with e.indent():
            for dy in range(K):
                tap = (f"{_taps(spec)}[wk + dx * {4 * K} + {dy}]" if columns
                       else f"{_taps(spec)}[wk + {dy * K} + dx]")
                e(f"p = base + {dy * pitch} + dx", f"acc += {tap} * ({band})")
        if add_coarse:
            e("if k == 0:", f"    acc += S[{zo} + q]")
        e(f"S[{zo} + k * {n * n} + q] = acc")


def _thread_rounds(count: int, threads: int) -> list:
    """``(r, rest)`` for each round in which thread ``tid`` takes item ``tid + r * threads``
    of ``count``: ``rest`` is None where every thread has one, else how many do (the
    threads ``tid < rest``)."""
    return [(r, None if (r + 1) * threads <= count else count - r * threads)
            for r in range(-(-count // threads))]


def _emit_round_stores(e: _Emitter, count: int, threads: int, store) -> None:
    """``store(r)`` (a statement) for each of :func:`_thread_rounds`, guarded in a partial
    round."""
    for r, rest in _thread_rounds(count, threads):
        if rest is None:
            e(store(r))
        else:
            e(f"if tid < {rest}:", f"    {store(r)}")


def _emit_coarse_loads(e: _Emitter, spec: TileSpec) -> None:
    """Issue the loads of the coarse pass's output at the top level's tile coefficients.

    Level ``L``'s coefficient ``(qy, qx)`` of the tile is ``(oy >> L) + qy,
    (ox >> L) + qx`` of the coarse planes. Thread ``tid`` takes coefficients
    ``tid + r * threads``; the values wait in registers (``cv{r}``) while the
    tile of ``x`` loads, so their latency hides behind it. A coefficient
    outside the ``Hc x Wc`` grid (it only feeds pixels outside the image)
    gets ``-0.0``, which leaves any sum it is added to unchanged.
    """
    L, NT = spec.levels, spec.threads
    if L < 1:
        raise ValueError("a coarse pre-pass needs at least one fine level")
    n = spec.tile >> L
    e(f"# the coarse levels' synthesis at level {L}'s coefficients, loaded early",
      "cbase = plane * Hc * Wc", f"cy0 = oy >> {L}", f"cx0 = ox >> {L}",
      "fneg0 = float32(-0.0)")
    for r, rest in _thread_rounds(n * n, NT):
        e(f"ci = tid + {r * NT}", f"cqy = {_floor_div('ci', n)}", "cgy = cy0 + cqy",
          f"cgx = cx0 + ci - cqy * {n}")
        inside = "cgy < Hc and cgx < Wc"
        if rest is not None:
            inside = f"ci < {n * n} and {inside}"
        e(f"cv{r} = coarse[cbase + cgy * Wc + cgx] if {inside} else fneg0")


def _emit_coarse_stores(e: _Emitter, spec: TileSpec, geo: TileGeometry) -> None:
    """Park the values of :func:`_emit_coarse_loads` in level ``L``'s LL subband.

    The region is free until level ``L``'s analysis, which adds its sums to
    them (``acc + coarse``, the order the separate pass used).
    """
    L, NT = spec.levels, spec.threads
    n = spec.tile >> L
    _emit_round_stores(e, n * n, NT, lambda r: f"S[{geo.z[L - 1]} + tid + {r * NT}] = cv{r}")


def _emit_inner_blocks(e: _Emitter, spec: TileSpec, geo: TileGeometry, i: int) -> None:
    """Inner level ``i``'s transformed Haar blocks, zero blocks around them.

    Block ``(a, b)`` holds the butterfly (:func:`~wtconv_cuda.kernels.codegen._butterfly`)
    of the band one level finer at ``(2a, 2b)``: for ``i = 1`` the tile's LL band
    of level ``L``, each value formed from grid ``L - 1`` as :func:`_emit_ll_band`
    forms it (so this runs in level ``L``'s phase); else the LL band of level
    ``L + i - 1``, half the first plane of inner level ``i - 1``'s blocks (in
    that level's phase). Values past an odd band's edge are zero.
    """
    L, NT, P = spec.levels, spec.threads, (spec.kernel_size - 1) // 2
    inner = geo.inner
    m, fine, n = inner.sizes[i], inner.sizes[i - 1], inner.blocks[i - 1]
    e(f"# level {L + i}'s Haar blocks, {m} x {m} (and the zero ones around), transformed",
      f"for it in range(tid, {n * n}, {NT}):")
    with e.indent():
        e(f"by = {_floor_div('it', n)}", f"a = by - {P}", f"b = it - by * {n} - {P}",
          "u0 = u1 = u2 = u3 = fz", f"if a >= 0 and a < {m} and b >= 0 and b < {m}:")
        with e.indent():
            if i == 1:  # values of the tile's LL band of level L, from grid L - 1
                src, ph, pitch = geo.grids[L - 1], geo.phase(L - 1), geo.pitch(L - 1)
                hh = geo.halos[L - 1] // 2
                e(f"p0 = {src} + a * {2 * pitch} + 2 * b + {hh * (pitch + 1)}")
            else:  # values of the LL band of level L + i - 1: half of level i - 1's u0
                pn = inner.blocks[i - 2]
                e(f"p0 = {inner.grids[i - 2]} + a * {2 * pn} + 2 * b + {P * (pn + 1)}")
            for dr in (0, 1):
                for dc in (0, 1):
                    name = ("_a", "_b", "_c", "_d")[2 * dr + dc]
                    if i == 1:
                        e(f"p = p0 + {dr * pitch + dc}")
                        value = (f"f05 * ((S[p] + S[p + {ph}]) + (S[p + {2 * ph}] + "
                                 f"S[p + {3 * ph}]))")
                    else:
                        value = f"f05 * S[p0 + {dr * pn + dc}]"
                    guard = [f"2 * {v} + 1 < {fine}" for v, d in (("a", dr), ("b", dc))
                             if d and fine % 2]
                    if guard:
                        e(f"{name} = {value} if {' and '.join(guard)} else fz")
                    else:
                        e(f"{name} = {value}")
            e("_s = _a + _b", "_m = _a - _b", "_t = _c + _d", "_n = _c - _d",
              "u0 = _s + _t", "u1 = _s - _t", "u2 = _m + _n", "u3 = _m - _n")
        for k in range(4):
            e(f"S[{inner.grids[i - 1] + k * inner.strides[i - 1]} + it] = u{k}")


def _emit_inner_tap_loads(e: _Emitter, spec: TileSpec, geo: TileGeometry) -> None:
    """Issue the loads of the inner levels' scales and taps, one tap per item.

    Emitted at the start of level ``L``'s phase: the values wait in registers
    (``tws{r}``, ``tww{r}``) while the level runs, and :func:`_emit_inner_levels`
    folds and stores them after the level's barrier (their place may be grid
    ``L - 1``, dead by then: :func:`inner_geometry`). (Loaded
    there, after a barrier, every warp of the block waited on them: 4.8% of the
    56 x 56 tile's warp samples. A loop per level and subband, as
    :func:`~wtconv_cuda.kernels.codegen._emit_fold_weights` has, kept ~25
    more registers live: the loads' 64-bit addresses.)
    """
    K, L, NT = spec.kernel_size, spec.levels, spec.threads
    K2, n = K * K, len(geo.inner.blocks) * 4 * K * K
    ld = lambda x: _load(spec.storage, x)  # noqa: E731
    e("# the inner levels' scales and taps, loaded early (stored after this phase)")
    for r, rest in _thread_rounds(n, NT):
        e(f"t = tid + {r * NT}", f"jk = t // {K2}",
          f"wq = ({L} + (jk >> 2)) * C * 4 + c * 4 + (jk & 3)")
        if rest is not None:
            e(f"tws{r} = {ld('ws[wq]')} if t < {n} else fz",
              f"tww{r} = {ld(f'ww[wq * {K2} + t - jk * {K2}]')} if t < {n} else fz")
        else:
            e(f"tws{r} = {ld('ws[wq]')}", f"tww{r} = {ld(f'ww[wq * {K2} + t - jk * {K2}]')}")


def _emit_inner_levels(e: _Emitter, spec: TileSpec, geo: TileGeometry) -> None:
    """The levels above ``L``, in the block, added into level ``L``'s LL subband.

    The same sums, in the same order, as the coarse problem of a split pass
    on the plane kernel: the inner levels' taps folded as
    :func:`~wtconv_cuda.kernels.codegen._emit_fold_weights` folds them; each
    level's subbands one (subband, coefficient) per item, tap columns outer
    and tap rows inner, on blocks transformed once (the butterfly's subband
    ``k`` is bit for bit the plane kernel's sign combination); then the
    syntheses from the coarsest down, coefficients past an odd band's edge
    dropped.
    """
    K, L, NT = spec.kernel_size, spec.levels, spec.threads
    K2, inner = K * K, geo.inner
    Li = len(inner.blocks)
    e(f"# ---- levels {L + 1}..{L + Li} in the block, on the plane's LL band of level {L} ----",
      "# their folded taps, from the values loaded during level {L}".format(L=L))
    _emit_round_stores(e, Li * 4 * K2, NT,
                       lambda r: f"S[{inner.taps} + tid + {r * NT}] = f05 * (tws{r} * tww{r})")
    e("cuda.syncthreads()")
    for i in range(1, Li + 1):
        m, n = inner.sizes[i], inner.blocks[i - 1]
        if i < Li:
            _emit_inner_blocks(e, spec, geo, i + 1)
        e(f"# level {L + i}: {m} x {m} coefficients, one subband of one coefficient per item",
          "# (coefficients fastest: inner_conv_wavefronts)",
          f"for it in range(tid, {4 * m * m}, {NT}):")
        with e.indent():
            e(f"k = {_floor_div('it', m * m)}", f"q = it - k * {m * m}",
              f"qy = {_floor_div('q', m)}",
              f"base = {inner.grids[i - 1]} + k * {inner.strides[i - 1]} + qy * {n} + q"
              f" - qy * {m}",
              f"wk = {inner.taps + (i - 1) * 4 * K2} + k * {K2}", "acc = fz",
              f"for dx in range({K}):")
            with e.indent():
                for dy in range(K):
                    e(f"acc += S[wk + {dy * K} + dx] * S[base + {dy * n} + dx]")
            e(f"S[{inner.z[i - 1]} + it] = acc")
        e("cuda.syncthreads()")
    for i in range(Li, 0, -1):
        zp = inner.z[i - 2] if i > 1 else geo.z[L - 1]
        _emit_synthesis_into(e, NT, f"level {L + i} synthesis into level {L + i - 1}'s LL "
                             "subband", inner.z[i - 1], zp, inner.sizes[i], inner.sizes[i - 1])
        e("cuda.syncthreads()")


def _emit_tile_synthesis(e: _Emitter, spec: TileSpec, geo: TileGeometry, j: int) -> None:
    """Level ``j``'s synthesis added into level ``j - 1``'s LL band (``j >= 2``)."""
    n = spec.tile >> j
    _emit_synthesis_into(e, spec.threads, f"level {j} synthesis into level {j - 1}'s LL band",
                         geo.z[j - 1], geo.z[j - 2], n, 2 * n)


def _emit_synthesis_into(e: _Emitter, threads: int, title: str, zo: int, zp: int, m: int,
                         mp: int) -> None:
    """Add the synthesis of the four ``m x m`` subbands at ``zo`` into the ``mp x mp`` plane
    at ``zp``; where ``mp`` is odd (``2 m > mp``) the last row and column have no partner
    and their terms are dropped."""
    mm = m * m
    e(f"# {title}", f"for it in range(tid, {mm}, {threads}):")
    with e.indent():
        e(f"qy = {_floor_div('it', m)}", f"qx = it - qy * {m}", f"z = {zo} + it",
          f"_s = S[z] + S[z + {mm}]", f"_m = S[z] - S[z + {mm}]",
          f"_t = S[z + {2 * mm}] + S[z + {3 * mm}]",
          f"_n = S[z + {2 * mm}] - S[z + {3 * mm}]",
          f"t = {zp} + 2 * qy * {mp} + 2 * qx",
          "S[t] += f05 * (_s + _t)")
        col = f"if 2 * qx + 1 < {mp}:"
        if 2 * m > mp:
            e(col, "    S[t + 1] += f05 * (_s - _t)",
              f"if 2 * qy + 1 < {mp}:", f"    S[t + {mp}] += f05 * (_m + _n)",
              f"    {col}", f"        S[t + {mp + 1}] += f05 * (_m - _n)")
        else:
            e("S[t + 1] += f05 * (_s - _t)", f"S[t + {mp}] += f05 * (_m + _n)",
              f"S[t + {mp + 1}] += f05 * (_m - _n)")


def _emit_tile_output(e: _Emitter, spec: TileSpec, geo: TileGeometry, out: str) -> None:
    """Base convolution, level-1 synthesis and bias of the tile's pixels; store those in the image.

    An item is ``Q`` level-1 coefficient rows of one column: the ``2Q x 2``
    pixels they cover. The base convolution walks the input columns of that
    window; the outermost two feed one output column each and are peeled, so
    no tap meets a pixel outside its output's window (a NaN stays where it
    belongs), as in the plane kernel.
    """
    K, L, NT, Q, TS = spec.kernel_size, spec.levels, spec.threads, spec.strip, spec.tile
    P = (K - 1) // 2
    n1 = TS // 2
    H0, pitch0, ph0 = geo.halos[0], geo.pitch(0), geo.phase(0)
    rows = list(range(2 * Q))
    bias = geo.ntaps - 1
    # a tile over its whole plane (spec.height) stores with compile-time sizes, and checks
    # only the sides where the tile reaches past the plane; other tiles check both
    if spec.height:
        Hp, Wp = spec.height, spec.width
        checks = [f"py < {Hp}"] * (Hp < TS) + [f"px < {Wp}"] * (Wp < TS)
    else:
        Hp, Wp = "H", "W"
        checks = ["py < H", "px < W"]
    inside = " and ".join(checks)
    e("# output: base convolution + level-1 synthesis + bias",
      f"bias = {_taps(spec)}[{bias}]", f"obase = plane * {Hp} * {Wp}")
    with _strip_items(e, n1, Q, NT, pitch0):
        e(f"rowbase = {geo.grids[0]} + (qy0 + {H0 // 2}) * {pitch0} + qx + {H0 // 2}")
        e(", ".join(f"acc{o}_{ex}" for o in rows for ex in (0, 1)) + " = "
          + ", ".join("fz" for _ in rows for _ in (0, 1)))

        columns = _tap_columns(geo)  # then every tap address is a constant

        def column(u, used) -> None:
            # input column 2*qx + u feeds output column 2*qx + ex through tap column u - ex + P
            e(f"colbase = rowbase + (({u}) & 1) * {ph0} + (({u}) >> 1)")
            if not columns:
                e(f"wu = ({u}) + {P}")
            for ex in used:
                for dy in range(K):
                    e(f"w{ex}_{dy} = {_taps(spec)}[{(u + P - ex) * _base_pitch(K) + dy}]"
                      if columns else f"w{ex}_{dy} = {_taps(spec)}[wu + {dy * K - ex}]")
            for t in range(-P, 2 * Q + P):
                e(f"v = S[colbase + {(t & 1) * 2 * ph0 + (t >> 1) * pitch0}]")
                for o in rows:
                    dy = t - o + P
                    if 0 <= dy < K:
                        for ex in used:
                            e(f"acc{o}_{ex} += w{ex}_{dy} * v")

        column(-P if columns else f"{-P}", (0,))
        if columns:
            for u in range(-P + 1, P + 1):
                column(u, (0, 1))
        else:
            e(f"for u in range({-P + 1}, {P + 1}):")
            with e.indent():
                column("u", (0, 1))
        column(P + 1 if columns else f"{P + 1}", (1,))
        for i in range(Q):
            e(f"qy = qy0 + {i}")
            if L > 0:
                zq = f"{geo.z[0]} + qy * {n1} + qx"
                e(f"_s = S[{zq}] + S[{zq} + {n1 * n1}]", f"_m = S[{zq}] - S[{zq} + {n1 * n1}]",
                  f"_t = S[{zq} + {2 * n1 * n1}] + S[{zq} + {3 * n1 * n1}]",
                  f"_n = S[{zq} + {2 * n1 * n1}] - S[{zq} + {3 * n1 * n1}]",
                  "r00 = f05 * (_s + _t)", "r01 = f05 * (_s - _t)",
                  "r10 = f05 * (_m + _n)", "r11 = f05 * (_m - _n)")
            else:
                e("r00 = r01 = r10 = r11 = fz")
            for ey in (0, 1):
                e(f"py = oy + 2 * qy + {ey}")
                for ex in (0, 1):
                    e(f"px = ox + 2 * qx + {ex}")
                    if inside:
                        e(f"if {inside}:")
                    with e.indent() if inside else nullcontext():
                        _store(e, spec.storage, f"{out}[obase + py * {Wp} + px]",
                               f"acc{2 * i + ey}_{ex} + bias + r{ey}{ex}")


def _emit_tile_weight_gradients(e: _Emitter, spec: TileSpec, geo: TileGeometry) -> None:
    """Backward: the tile's weight-gradient sums, written as one partial.

    The grids still hold ``dy`` and its LL chain. ``x`` and its chain go into
    the ``x`` grids (the same halos), then every tap's correlation is summed
    over the tile: base taps ``sum_p x[p + d] dy[p]`` at full resolution, the
    bias ``sum_p dy[p]``, level ``j``'s taps ``sum_q Xu_k[q + d] Gu_k[q]`` over
    the tile's coefficients, ``Xu`` and ``Gu`` the Haar blocks (twice the
    subbands) of the two chains at level ``j - 1``. A work item is (tap
    column, chunk of columns); it slides a window of ``K + 1`` pixels (``K``
    Haar blocks) down its columns, so every loaded value feeds ``K`` taps.
    Thread ``t`` takes chunk ``t // K`` and tap column ``t % K``: all lanes of
    a warp are in the same row, at a few neighbouring columns (many the same,
    a broadcast), which the padded phase planes (:func:`phase_stride`) put in
    different banks. (Lanes in different rows, as the plane kernel's items,
    met 2- to 4-way bank conflicts: 734 M of them for 582 M shared loads at
    8 x 128 x 512 x 512, L3, on an H200.) The items' sums meet in the
    reduction area and are added in chunk order (deterministic) into
    ``part[((c * B + b) * ntiles + tile) * ntaps:]``, which
    ``wtconv_finalize`` adds up per channel (``B * ntiles`` partials) exactly
    as it adds the plane kernel's.
    """
    K, L, TS, NT = spec.kernel_size, spec.levels, spec.tile, spec.threads
    P, K2 = (K - 1) // 2, K * K
    ntaps = K2 + 1 + 4 * K2 * L
    red = geo.reduce
    e("# ---- weight gradients: x and its LL chain, then the correlations ----")
    _emit_tile_load(e, spec, geo, "x", geo.xgrids)
    e("cuda.syncthreads()")
    for j in range(1, L):
        _emit_ll_band(e, spec, geo, geo.xgrids, j)
        e("cuda.syncthreads()")
    e("bq = plane // C",
      f"pbase = ((c * B + bq) * ntiles + tile) * {ntaps}")

    # base taps and bias
    H0, ph0, pitch0 = geo.halos[0], geo.phase(0), geo.pitch(0)
    nch = correlation_chunks(K, TS, NT)
    nit = K * nch
    e(f"# base taps: item (tap column tx, columns ch, ch + {nch}, ...), rows in pairs",
      f"if tid < {nit}:")
    with e.indent():
        e(f"ch = tid // {K}", f"tx = tid - ch * {K}", "gsum = fz",
          ", ".join(f"acc_{d}" for d in range(K)) + " = " + ", ".join("fz" for _ in range(K)),
          f"for px in range(ch, {TS}, {nch}):")
        with e.indent():
            e(f"gcol = {geo.grids[0]} + (px & 1) * {ph0} + (px >> 1) + {H0 // 2 * (pitch0 + 1)}",
              f"fx = px + tx + {H0 - P}",
              f"xcol = {geo.xgrids[0]} + (fx & 1) * {ph0} + (fx >> 1) + {H0 // 2 * pitch0}")
            _emit_pair_window(
                e, K, lambda ev, m: (f"xcol + {f'm * {pitch0} + ' if m else ''}"
                                     f"{(ev & 1) * 2 * ph0 + (ev >> 1) * pitch0}"),
                lambda h, r: f"gcol + {h * 2 * ph0} + m * {pitch0} + {r * pitch0}", str(TS // 2))
        for d in range(K):
            e(f"S[{red} + tid * {K} + {d}] = acc_{d}")
        e("if tx == 0:", f"    S[{red + nit * K} + ch] = gsum")
    e("cuda.syncthreads()",
      f"for t in range(tid, {K2 + 1}, {NT}):")
    with e.indent():
        e("tot = fz", f"if t < {K2}:")
        with e.indent():
            e(f"ty = t // {K}", f"dx = t - ty * {K}",
              f"for ch in range({nch}):",
              f"    tot += S[{red} + (ch * {K} + dx) * {K} + ty]")
        e("else:")
        with e.indent():
            e(f"for ch in range({nch}):", f"    tot += S[{red + nit * K} + ch]")
        e("part[pbase + t] = tot")
    e("cuda.syncthreads()")

    # level taps
    for j in range(1, L + 1):
        n = TS >> j
        nch = correlation_chunks(K, n, NT)
        nit = K * nch
        hh = geo.halos[j - 1] // 2
        ph, pitch = geo.phase(j - 1), geo.pitch(j - 1)
        e(f"# level {j} taps: item (tap column tx, coefficient columns ch, ch + {nch}, ...)",
          f"if tid < {nit}:")
        with e.indent():
            e(f"ch = tid // {K}", f"tx = tid - ch * {K}")
            _emit_level_accumulators(e, K)
            e(f"for qc in range(ch, {n}, {nch}):")
            with e.indent():
                e(f"gp = {geo.grids[j - 1]} + {hh * pitch + hh} + qc",
                  f"xp = {geo.xgrids[j - 1]} + {(hh - P) * pitch + hh - P} + qc + tx")
                _emit_block_window(e, K, "xp", "gp", str(n), str(ph), step=pitch)
            _emit_level_item_sums(e, K, str(red))
        e("cuda.syncthreads()",
          f"for t in range(tid, {4 * K2}, {NT}):")
        with e.indent():
            e(f"k = t // {K2}", f"rem = t - k * {K2}", f"ty = rem // {K}", f"dx = rem - ty * {K}",
              "tot = fz", f"for ch in range({nch}):",
              f"    tot += S[{red} + ((ch * {K} + dx) * 4 + k) * {K} + ty]",
              f"part[pbase + {K2 + 1 + (j - 1) * 4 * K2} + t] = tot")
        e("cuda.syncthreads()")
