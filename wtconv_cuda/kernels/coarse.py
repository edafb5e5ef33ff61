"""The coarse pre-pass of a split pass: ``wtconv_coarse_in``, ``wtconv_coarse_out`` and,
for a backward in batch chunks, ``wtconv_partial_sum``.

A tile's halo grows as ``2**L`` (:mod:`.tiles`), so deep transforms on
large planes cannot run on tiles whole. They are split at a level ``c``:

1. ``wtconv_coarse_in`` (this module) pools ``x`` into its raw LL band of
   level ``c``, ``v_c`` (float32, ``(B, C, ceil(H / 2**c), ceil(W / 2**c))``),
   and copies the coarse levels' parameters, ``w_j`` and ``s_j`` for ``j > c``,
   into float32, next to a zero base weight and a zero base scale;
2. the fused kernel runs on ``v_c`` as a float32 problem of ``L - c`` levels
   with those parameters. Its output is then exactly the synthesis of the
   levels above ``c``, ``r_{c+1}`` of SPEC.md (the base branch is ``0 * conv
   + r``);
3. the tile kernel runs the ``c`` fine levels and adds ``r_{c+1}`` to level
   ``c``'s convolved LL subband before its synthesis (``TileSpec.coarse``).

The backward is the same chain on ``dy`` (flipped taps): ``wtconv_coarse_in``
pools ``x`` and ``dy``, the fused backward on the pooled pair gives the
gradient of ``v_c`` (which the tiles add where the forward adds ``r_{c+1}``)
and the coarse levels' parameter gradients in float32, and
``wtconv_coarse_out`` stores those into the levels above ``c`` of the caller's
gradient arrays, rounded once to the storage type.

``v_c`` is formed as the tile and plane kernels form it, level by level:
``LL = 0.5 * ((a + b) + (c + d))`` over zero-extended blocks (the zero
extension is exactly SPEC.md's padding of odd sizes, at every level), so
the split changes no rounding of the LL chain.

Two float32 work buffers (see :func:`coarse_layout`): the pooled arrays,
``[ v_c(x) ]`` (backward ``[ v_c(x) | v_c(dy) ]``), which are dead once the
coarse pass has run and are released before the tiles allocate theirs, and
the rest::

    [ r | zero base weight (C K K) | zero base scale (C) | w_j, j > c | s_j, j > c ]

(``r`` is written by step 2). Where step 2 runs on the register kernel,
which may write its output over its input, the forward needs only the
second buffer: ``wtconv_coarse_in`` pools ``x`` into the area of ``r``
(``SplitPlan.in_place``). The backward's::

    [ gradient of v_c | parameters as above | their gradients ]

the gradients laid out as the parameters, with a bias gradient's ``C``
values (never written) after the base weight's.

A backward in batch chunks
(:func:`~wtconv_cuda.kernels.launch.split_batch_chunks`) runs steps 1-3 per
chunk with that chunk's two buffers, and keeps one more to the end::

    [ partial sums: C x chunks x ntaps | a set of coarse gradients per chunk ]

``wtconv_partial_sum`` adds a chunk's tile partials per channel into its
column of the sums, which ``wtconv_finalize`` then reads as its partials;
``wtconv_coarse_out`` adds the chunks' coarse gradients in chunk order before
rounding them.
"""

from __future__ import annotations

from typing import NamedTuple

from .codegen import (
    FINALIZE_UNROLL, STORAGE, _Emitter, _emit_ordered_sum, _guarded_load, _load, _store,
)

#: Threads per block of ``wtconv_coarse_in``.
COARSE_THREADS = 256


class CoarseSpec(NamedTuple):
    """Compile-time parameters of one ``wtconv_coarse_in`` variant.

    Attributes
    ----------
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"``: dtype of ``x`` and
        of the parameters (read); the outputs are float32.
    split : int
        Level ``c >= 1`` of the LL band to form (``2**c x 2**c`` pixels per
        value).
    pooled : int
        How many arrays to pool (1: ``x``; 2: ``x`` and ``dy``, the backward).
    threads : int
        Threads per block.
    height, width : int
        ``Hc, Wc``: the LL band's size, compile-time so that an item's plane,
        row and column come from divisions by constants. With them variable
        (and a grid-stride loop) the kernel took 74 registers at ``c = 1``
        (16 now), three 256-thread blocks per SM, and the 64 x 384 x 14 x 14
        forward 117 us on an H200 (108 us now).
    """

    storage: str
    split: int
    pooled: int = 1
    threads: int = COARSE_THREADS
    height: int = 0
    width: int = 0


class CoarseLayout(NamedTuple):
    """Offsets (float32 elements) of the coarse pre-pass's two work buffers.

    Attributes
    ----------
    pooled : tuple of int
        Offset of each pooled array (``v_c`` of ``x``; then of ``dy``) in the
        pooled buffer.
    pooled_floats : int
        Elements of the pooled buffer.
    out : int
        Offset, in the other buffer (as every offset below), of the coarse
        pass's output (``r`` forward, the gradient of ``v_c`` backward): 0.
    base_weight, base_scale, wavelet_weight, wavelet_scale : int
        Offsets of the coarse problem's float32 parameters.
    grads : int
        Backward only (else 0): offset of the coarse problem's gradients,
        laid out as its parameters (five arrays, the bias's ``C`` included).
    grad_levels : int
        Backward only (else 0): offset of the coarse levels' weight
        gradients within them, followed by their scale gradients.
    floats : int
        Elements of the other buffer.
    plane : int
        Elements of one pooled array, ``B C Hc Wc``.
    """

    pooled: tuple
    pooled_floats: int
    out: int
    base_weight: int
    base_scale: int
    wavelet_weight: int
    wavelet_scale: int
    grads: int
    grad_levels: int
    floats: int
    plane: int


def coarse_layout(batch: int, channels: int, coarse_height: int, coarse_width: int,
                  kernel_size: int, coarse_levels: int, backward: bool = False) -> CoarseLayout:
    """Offsets of the coarse pre-pass's work buffers (see the module docstring).

    Parameters
    ----------
    batch, channels : int
        ``B`` and ``C``.
    coarse_height, coarse_width : int
        ``Hc, Wc``: the LL band's size at the split level.
    kernel_size : int
        ``K``.
    coarse_levels : int
        ``L - c``: the levels the coarse pass runs.
    backward : bool, default False
        Add the pooled ``dy`` and the coarse gradients.

    Returns
    -------
    CoarseLayout
    """
    C, K2 = channels, kernel_size ** 2
    plane = batch * channels * coarse_height * coarse_width
    npooled = 2 if backward else 1
    pooled = tuple(i * plane for i in range(npooled))
    out = 0
    params = C * K2 + C + coarse_levels * C * 4 * K2 + coarse_levels * C * 4
    base_weight = out + plane
    base_scale = base_weight + C * K2
    wavelet_weight = base_scale + C
    wavelet_scale = wavelet_weight + coarse_levels * C * 4 * K2
    grads = wavelet_scale + coarse_levels * C * 4 if backward else 0
    grad_levels = grads + C * K2 + 2 * C if backward else 0
    floats = base_weight + params + (params + C if backward else 0)
    return CoarseLayout(pooled, npooled * plane, out, base_weight, base_scale, wavelet_weight, wavelet_scale,
                        grads, grad_levels, floats, plane)


def coarse_in_source(spec: CoarseSpec) -> str:
    """Python source of ``wtconv_coarse_in`` for ``spec``.

    Arguments: ``(x, [dy,] ww, ws, pooled, params, H, W, npool, nzero, nweight,
    nscale, wstart, sstart)``: pointers to the storage type for the pooled
    arrays and the parameters ``ww`` ``(L, C, 4, K, K)`` and ``ws`` ``(L, C,
    4)``, float32 pointers to the two work buffers, then int64 scalars.
    Thread ``i`` of the grid (at least ``npool + nzero + nweight + nscale``
    threads) takes item ``i``, in this order: LL value ``i`` of every pooled
    array (written at ``pooled[i]``, ``pooled[npool + i]``; the band is
    ``spec.height x spec.width``), then ``nzero`` zeros (base weight and
    scale), the coarse ``ww[wstart:]`` and ``ws[sstart:]`` as float32,
    written into ``params`` from its start (the work buffer's view from
    ``CoarseLayout.base_weight``).

    Parameters
    ----------
    spec : CoarseSpec
        The variant.

    Returns
    -------
    str
        Source of ``wtconv_coarse_in`` for :func:`wtconv_cuda.kernels.codegen.build`.

    Raises
    ------
    ValueError
        An unknown storage, ``split < 1``, ``pooled`` not 1 or 2, threads
        not a positive multiple of 32, or an empty band.
    """
    c, m = spec.split, 2 ** spec.split
    hc, wc = spec.height, spec.width
    if spec.storage not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, got {spec.storage!r}")
    if c < 1:
        raise ValueError(f"split must be >= 1, got {c}")
    if spec.pooled not in (1, 2):
        raise ValueError(f"pooled must be 1 or 2, got {spec.pooled}")
    if spec.threads < 32 or spec.threads % 32:
        raise ValueError(f"threads must be a positive multiple of 32, got {spec.threads}")
    if hc < 1 or wc < 1:
        raise ValueError(f"height and width must be positive, got {hc} x {wc}")
    arrays = ["x", "dy"][:spec.pooled]
    e = _Emitter()
    e(f"def wtconv_coarse_in({', '.join(arrays)}, ww, ws, pooled, params, H, W, npool, "
      "nzero, nweight, nscale, wstart, sstart):")
    with e.indent():
        e("fz = float32(0.0)", "f05 = float32(0.5)",
          "i = int64(cuda.grid(1))",
          "if i < npool:")
        with e.indent():
            e(f"plane = i // {hc * wc}", f"q = i - plane * {hc * wc}",
              f"cy = q // {wc}", f"cx = q - cy * {wc}",
              f"y0 = cy * {m}", f"x0 = cx * {m}",
              "src = plane * H * W + y0 * W + x0")
            for r in range(m):
                e(f"row{r} = y0 + {r} < H")
            for s in range(m):
                e(f"col{s} = x0 + {s} < W")
            for a, array in enumerate(arrays):
                value = _emit_block_ll(e, spec.storage, array, c, 0, 0, f"v{a}")
                e(f"pooled[{a} * npool + i] = {value}")
        e("elif i < npool + nzero + nweight + nscale:")
        with e.indent():
            e("j = i - npool",
              "if j < nzero:", "    params[j] = fz",
              "elif j < nzero + nweight:",
              f"    params[j] = {_load(spec.storage, 'ww[wstart + j - nzero]')}",
              "else:",
              f"    params[j] = "
              f"{_load(spec.storage, 'ws[sstart + j - nzero - nweight]')}")
    return e.text()


class CoarseOutSpec(NamedTuple):
    """Compile-time parameters of one ``wtconv_coarse_out`` variant.

    Attributes
    ----------
    storage : str
        Storage type of the gradient arrays written.
    threads : int
        Threads per block.
    """

    storage: str
    threads: int = COARSE_THREADS


def coarse_out_source(spec: CoarseOutSpec) -> str:
    """Python source of ``wtconv_coarse_out`` for ``spec``.

    Arguments: ``(grads, gww, gws, nweight, nscale, wstart, sstart, copies,
    stride)``: a float32 pointer to the coarse problem's level gradients
    (``nweight`` weight values, then ``nscale`` scale values; ``copies`` such
    sets ``stride`` elements apart, one per batch chunk of the backward),
    pointers to the storage type for the caller's ``(L, C, 4, K, K)`` and
    ``(L, C, 4)`` gradients, then int64 scalars. Writes ``gww[wstart + i]``
    and ``gws[sstart + i]``: the copies' float32 sum, in chunk order, rounded
    once (one copy: the value itself).

    Parameters
    ----------
    spec : CoarseOutSpec
        The variant.

    Returns
    -------
    str
        Source of ``wtconv_coarse_out`` for :func:`wtconv_cuda.kernels.codegen.build`.

    Raises
    ------
    ValueError
        An unknown storage, or threads not a positive multiple of 32.
    """
    if spec.storage not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, got {spec.storage!r}")
    if spec.threads < 32 or spec.threads % 32:
        raise ValueError(f"threads must be a positive multiple of 32, got {spec.threads}")
    e = _Emitter()
    e("def wtconv_coarse_out(grads, gww, gws, nweight, nscale, wstart, sstart, copies, "
      "stride):")
    with e.indent():
        e("for i in range(int64(cuda.grid(1)), nweight + nscale, int64(cuda.gridsize(1))):")
        with e.indent():
            e("total = grads[i]",
              "for k in range(1, copies):",
              "    total += grads[k * stride + i]",
              "if i < nweight:")
            with e.indent():
                _store(e, spec.storage, "gww[wstart + i]", "total")
            e("else:")
            with e.indent():
                _store(e, spec.storage, "gws[sstart + i - nweight]", "total")
    return e.text()


class PartialSumSpec(NamedTuple):
    """Compile-time parameters of ``wtconv_partial_sum`` (one variant serves every
    kernel size and storage type: it adds float32 partials).

    Attributes
    ----------
    threads : int
        Threads per block (one block per channel).
    """

    threads: int = 128


def partial_sum_source(spec: PartialSumSpec) -> str:
    """Python source of ``wtconv_partial_sum`` for ``spec``.

    Arguments: ``(part, sums, ntaps, count, slot, slots)``: float32 pointers,
    then int64 scalars. Block ``c`` (one per channel) adds a batch chunk's
    partials, ``part[(c * count + u) * ntaps + t]`` for ``u < count``, in
    ``u`` order (as ``wtconv_finalize`` adds them, bit for bit), into
    ``sums[(c * slots + slot) * ntaps + t]``: the layout ``wtconv_finalize``
    reads with ``slots`` partials per channel, one per chunk.

    Parameters
    ----------
    spec : PartialSumSpec
        The variant.

    Returns
    -------
    str
        Source of ``wtconv_partial_sum`` for :func:`wtconv_cuda.kernels.codegen.build`.

    Raises
    ------
    ValueError
        Threads not a positive multiple of 32.
    """
    if spec.threads < 32 or spec.threads % 32:
        raise ValueError(f"threads must be a positive multiple of 32, got {spec.threads}")
    e = _Emitter()
    e("def wtconv_partial_sum(part, sums, ntaps, count, slot, slots):")
    with e.indent():
        e("c = int64(cuda.blockIdx.x)",
          f"for t in range(int64(cuda.threadIdx.x), ntaps, {spec.threads}):")
        with e.indent():
            e("tot = float32(0.0)")
            _emit_ordered_sum(e, "tot", "part", "c * count * ntaps + t", "ntaps", "count",
                              FINALIZE_UNROLL)
            e("sums[(c * slots + slot) * ntaps + t] = tot")
    return e.text()


def _emit_block_ll(e: _Emitter, storage: str, array: str, level: int, r0: int, s0: int,
                   name: str) -> str:
    """Emit the raw LL value of the ``2**level`` block at ``(r0, s0)``; returns a float32
    expression of it (its name, or at level 0 the stored pixel's conversion).

    Depth first (four sub-blocks, then their LL), so few values are live at
    once; pixels outside the image read as zero.
    """
    if level == 0:  # the stored element, converted where it is used (here the
        # compiler still predicates the conversion with the load: benchmarks/NOTES.md,
        # thirty-fourth session)
        e(f"{name} = " + _guarded_load(storage, f"{array}[src + {r0} * W + {s0}]",
                                       f"row{r0} and col{s0}"))
        return _load(storage, name)
    h = 2 ** (level - 1)
    parts = [_emit_block_ll(e, storage, array, level - 1, r0 + dr, s0 + ds, f"{name}{n}")
             for n, (dr, ds) in enumerate(((0, 0), (0, h), (h, 0), (h, h)))]
    e(f"{name} = f05 * (({parts[0]} + {parts[1]}) + ({parts[2]} + {parts[3]}))")
    return name
