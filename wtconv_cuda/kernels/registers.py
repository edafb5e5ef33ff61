"""Register kernel for tiny planes: ``wtconv_registers`` (forward and backward).

At ConvNeXt-T's last stage a plane has 7 x 7 pixels. The plane kernel
(:mod:`.codegen`) gives such a plane a group of 16 threads and a shared-memory
buffer, and spends most of its instructions on what that costs: barriers
between the levels, index arithmetic, shared-memory traffic and idle lanes in
the coarse levels (a 7 x 7 plane's level 2 has four coefficients). Here a
plane belongs to **one thread**, and everything about it is known when the
kernel is generated (``H``, ``W``, ``L``, ``K``, the stride): the thread
holds its plane, the Haar pyramid and the convolved subbands in named
registers, and the generated straight-line code contains only the
arithmetic that touches real values. A padded zero is never loaded, added or
multiplied: the generator drops those terms, which also skips the
convolutions' taps that fall outside a small grid (at 7 x 7, ``K = 5``,
level 1 needs 196 of a 4 x 4 grid's 400 products per subband). A warp holds
32 planes of one channel (the batch varies fastest), so its lanes load the
same taps.

One thread, one plane (forward):

1. load the plane and form the Haar pyramid (raw butterflies, no ``1/2``: the
   factors are powers of two and go into the taps, see below);
2. from the coarsest level down: convolve the four subbands (the LL
   accumulator starts from the synthesis of the level above) and synthesise
   them onto the next finer grid (level 1: only the pixels the stride keeps);
3. for each output row, the base convolution over ``K`` input rows (read
   again from shared memory), the bias and the synthesis; one store per
   output pixel.

Folded taps: with raw butterflies, level ``j``'s subbands are ``2**j`` times
the operator's and each raw synthesis doubles again, so the level's taps are
``s_{j,k} * w_{j,k} / 4**j`` (exact powers of two; one rounding, in the product
``s * w``) and the sum over levels needs no other factor (SPEC.md, closed form).
The base taps are ``s0 * w0`` and the bias term ``s0 * b``.

Every value lives in a register, so the plane must be small: the planner
(:func:`wtconv_cuda.kernels.launch.plan_registers`) uses this kernel up to
:data:`MAX_PIXELS` pixels. Neighbouring threads' planes lie ``C * H * W``
elements apart, so a block first copies its planes into shared memory as
one list of elements (a warp's load touches one or two planes' contiguous
bytes), each thread reads its plane from there, and the outputs leave the
same way (:func:`_emit_staging_load`, :func:`_emit_staging_store`). The backward variant
(:func:`register_backward_source`) also writes the parameter gradients.
"""

from __future__ import annotations

from typing import NamedTuple

from .codegen import STORAGE, _DivmodLoop, _Emitter, _emit_gradient_unfold, _load, _store

#: Taps per reduction batch of the backward: a warp transposes its lanes' sums of
#: this many taps through shared memory, so it is the warp size.
TAP_BATCH = 32
#: Largest plane (``H * W``) the planner gives this kernel. At K 5 ptxas fits a
#: 7 x 7 (L 2) or 8 x 8 (L 3) forward in 168 registers without spills (a
#: 7 x 9 one keeps 64 B of local memory); tests/kernels/test_ptx.py checks 7 x 7.
MAX_PIXELS = 64
#: Global loads a thread of the register kernel's forward issues before the shared
#: stores that take their values (:func:`_emit_staging_load`): a whole plane of up to
#: `MAX_PIXELS`. On an H200 (K 5, L 2, 7 x 7, fp32), with one load and its store per
#: loop iteration before: the 7 x 7 stage at 64 x 768 took 22.3 -> 16.6 us, the split
#: forwards' coarse problem 17.5 -> 12.7 us at 28 x 28 and 18.9 -> 14.6 at 14 x 14
#: (168 registers, no local memory either way; 16 ahead: 16.8 us).
STAGING_LOADS = 64
#: The same for the backward, which stages ``dy`` and then ``x``. Its spills move with
#: the staging code (ptxas 13.0, 7 x 7 fp32 at 168 registers: 184 B before, 148 B with
#: 8 or 16 ahead, 232 B with 32, 224 B with 64). On an H200 at 64 x 768 x 7 x 7 the
#: backward took 56.4 -> 34.7 us with 16 ahead and 37.7 with 64 (bf16: 51.4 -> 37.1
#: and 36.2).
STAGING_LOADS_BACKWARD = 16


class RegisterSpec(NamedTuple):
    """Compile-time parameters of one ``wtconv_registers`` variant.

    Attributes
    ----------
    kernel_size : int
        Odd ``K``.
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (raw ``uint16`` bits).
    height, width : int
        Plane size ``H, W`` (compile-time: the code is unrolled for it).
    levels : int
        Wavelet levels ``L >= 0``; every level's grid is at least 1 x 1.
    stride : int
        Output subsampling factor.
    threads : int
        Threads per block (one plane each).
    max_registers : int
        Register cap handed to ptxas (``.maxnreg``); 0 leaves it free.
    backward : bool
        The backward variant (see :func:`register_backward_source`); it
        needs a batch ``B`` that is a multiple of 32 dividing ``threads``, so
        a block holds whole channels and writes their parameter gradients
        itself.
    """

    kernel_size: int
    storage: str
    height: int
    width: int
    levels: int
    stride: int = 1
    threads: int = 128
    max_registers: int = 128
    backward: bool = False


def grids(height: int, width: int, levels: int) -> list[tuple[int, int]]:
    """``(H_j, W_j)`` for ``j = 0..L``: each level halves the previous grid, rounding up.

    Parameters
    ----------
    height, width : int
        ``H, W >= 1``.
    levels : int
        ``L >= 0``.

    Returns
    -------
    list of (int, int)
        ``L + 1`` grid sizes, level 0 first.
    """
    out = [(height, width)]
    for _ in range(levels):
        h, w = out[-1]
        out.append((-(-h // 2), -(-w // 2)))
    return out


class _Values:
    """Named scalars of one grid, by ``(row, col)``; a missing entry is an exact zero."""

    def __init__(self, shape: tuple[int, int]) -> None:
        self.shape = shape
        self.names: dict[tuple[int, int], str] = {}

    def get(self, r: int, c: int):
        return self.names.get((r, c))


def _add(e: _Emitter, name: str, a, b, minus: bool = False):
    """Emit ``name = a + b`` (or ``a - b``) with zero operands dropped; returns the
    value's name (``None`` when both are zero, ``a`` when ``b`` is zero)."""
    if b is None:
        return a
    if a is None:
        if not minus:
            return b
        e(f"{name} = -{b}")
        return name
    e(f"{name} = {a} {'-' if minus else '+'} {b}")
    return name


def _butterfly(e: _Emitter, tag: str, a, b, c, d) -> list:
    """Raw Haar butterfly of a 2x2 block ``[[a, b], [c, d]]`` (names or ``None``).

    Returns the four results ``(LL, LH, HL, HH)`` times two, as names (or
    ``None`` for an exact zero), in the plane kernel's order of additions:
    ``s = a + b``, ``m = a - b``, ``t = c + d``, ``n = c - d``; ``LL = s + t``,
    ``LH = s - t``, ``HL = m + n``, ``HH = m - n``. The same butterfly is the
    raw synthesis of ``(a, b, c, d) = (LL', LH, HL, HH)`` into the block's
    four pixels.
    """
    s = _add(e, f"s_{tag}", a, b)
    m = _add(e, f"m_{tag}", a, b, minus=True)
    t = _add(e, f"t_{tag}", c, d)
    n = _add(e, f"n_{tag}", c, d, minus=True)
    return [_add(e, f"{o}_{tag}", x, y, minus)
            for o, x, y, minus in (("p", s, t, False), ("q", s, t, True),
                                   ("r", m, n, False), ("v", m, n, True))]


def register_kernel_source(spec: RegisterSpec) -> str:
    """Python source of ``wtconv_registers`` for ``spec``.

    The kernel takes ``(x, y, w0, b0, s0, ww, ws, B, C, has_bias)``: seven
    pointers to the storage type, then int64 scalars (see
    :func:`wtconv_cuda.kernels.compiler.register_signature`). Thread ``q`` of
    the grid (``spec.threads`` per block, ``ceil(B * C / threads)`` blocks)
    computes plane ``(q % B, q // B)``; a thread past ``B * C`` recomputes
    the last plane and stores nothing. The block stages its planes in
    dynamic shared memory (:func:`shared_bytes`), in and out. A backward
    spec gets :func:`register_backward_source` instead.

    Parameters
    ----------
    spec : RegisterSpec
        The variant to generate.

    Returns
    -------
    str
        Source of a function ``wtconv_registers``, for
        :func:`wtconv_cuda.kernels.codegen.build`.

    Raises
    ------
    ValueError
        An even or non-positive kernel size, an unknown storage, a negative
        level count, a plane or stride below 1, or fewer than 32 threads.
    """
    if spec.backward:
        return register_backward_source(spec)
    _check(spec)
    st, H, W, S = spec.storage, spec.height, spec.width, spec.stride
    Ho, Wo = -(-H // S), -(-W // S)
    T, PX, PY = spec.threads, plane_pitch(H * W), plane_pitch(Ho * Wo)
    e = _Emitter()
    e("def wtconv_registers(x, y, w0, b0, s0, ww, ws, B, C, has_bias):")
    with e.indent():
        _emit_prologue(e, T)
        _emit_staging_load(e, st, T, H * W, PX, 0, "x", STAGING_LOADS)
        e("cuda.syncthreads()",
          f"xs = t * {PX}",
          f"ys = {T * PX} + t * {PY}")

        outputs = {(r, col): f"S[ys + {(r // S) * Wo + col // S}]"
                   for r in range(0, H, S) for col in range(0, W, S)}
        _emit_plane(e, spec, lambda r, col: f"S[xs + {r * W + col}]", outputs, flip=False)
        e("cuda.syncthreads()")
        _emit_staging_store(e, st, T, Ho * Wo, PY, T * PX, "y")
    return e.text()


def _check(spec: RegisterSpec) -> None:
    K, L, H, W, S = spec.kernel_size, spec.levels, spec.height, spec.width, spec.stride
    if K < 1 or K % 2 == 0:
        raise ValueError(f"kernel_size must be odd and >= 1, got {K}")
    if spec.storage not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, got {spec.storage!r}")
    if L < 0 or H < 1 or W < 1 or S < 1:
        raise ValueError(f"need levels >= 0 and height, width, stride >= 1, got {spec}")
    if spec.threads < 32 or spec.threads % 32:
        raise ValueError(f"threads must be a positive multiple of 32, got {spec.threads}")


def _emit_prologue(e: _Emitter, threads: int) -> None:
    """The thread's plane, and the block's table of plane indices (``A``)."""
    e("S = cuda.shared.array(0, dtype=float32)",
      f"A = cuda.shared.array({threads}, dtype=int32)",
      "t = int64(cuda.threadIdx.x)",
      f"q0 = int64(cuda.blockIdx.x) * {threads}",
      "nplanes = B * C",
      f"nvalid = min({threads}, nplanes - q0)",
      "# channel-major: a warp's lanes are consecutive batch entries of one channel;",
      "# a thread past the last plane recomputes it and stores nothing",
      "q = min(q0 + t, nplanes - 1)",
      "c = q // B",
      "A[t] = int32((q - c * B) * C + c)",
      "cuda.syncthreads()")


def _emit_pyramid(e: _Emitter, tag: str, sizes: list, value, levels: int) -> list:
    """Load a plane and form its raw Haar pyramid up to level ``levels``, two rows at a time.

    ``value(r, col)`` is the expression of pixel ``(r, col)`` (``None``: an exact
    zero). Returns ``[plane, bands]``: the plane's :class:`_Values` and
    ``bands[j - 1][k]``, level ``j``'s subband ``k`` (raw: ``2**j`` times the
    operator's). Names start with ``tag``.
    """
    H, W = sizes[0]
    level = _Values(sizes[0])
    bands = [[_Values(sizes[j]) for _ in range(4)] for j in range(1, levels + 1)]
    for r in range(H):
        for col in range(W):
            expr = value(r, col)
            if expr is not None:
                name = f"{tag}x{r}_{col}"
                e(f"{name} = {expr}")
                level.names[(r, col)] = name
        if r % 2 == 0 and r < H - 1:
            continue
        # rows r - 1 and r (or the last, odd row) complete a row of level-1 blocks;
        # a completed level-j row may complete a row of level j + 1
        row, j = r // 2, 1
        while j <= levels:
            src = level if j == 1 else bands[j - 2][0]
            sub = bands[j - 1]
            for b in range(sizes[j][1]):
                quad = [src.get(2 * row + dy, 2 * b + dx) for dy in (0, 1) for dx in (0, 1)]
                for k, name in enumerate(_butterfly(e, f"{tag}a{j}_{row}_{b}", *quad)):
                    if name is not None:
                        sub[k].names[(row, b)] = name
            if row % 2 == 0 and row < sizes[j][0] - 1:
                break
            row, j = row // 2, j + 1
    return [level, bands]


def _emit_plane(e: _Emitter, spec: RegisterSpec, value, outputs: dict, flip: bool) -> None:
    """One plane through the operator (``flip``: its adjoint), all in registers.

    ``value(r, col)`` gives input pixel ``(r, col)`` (``None``: an exact zero);
    ``outputs`` maps each output pixel ``(r, col)`` that is kept to the target
    it is stored into. The forward (``flip`` false) adds the bias; the adjoint
    (the input gradient, from the zero-filled upsampled output gradient)
    correlates with every filter flipped and has no bias.
    """
    K, L, st = spec.kernel_size, spec.levels, spec.storage
    H, W = spec.height, spec.width
    P, K2 = K // 2, K * K
    sizes = grids(H, W, L)
    ld = lambda expr: _load(st, expr)  # noqa: E731
    tap_of = (lambda t: K2 - 1 - t) if flip else (lambda t: t)

    # 1. the plane and its raw Haar pyramid, two rows at a time
    _, bands = _emit_pyramid(e, "", sizes, value, L)

    # 2. levels L..1: convolve, then synthesise onto the finer grid
    finer = None  # synthesis of the levels above, on the current level's grid
    for j in range(L, 0, -1):
        hj, wj = sizes[j]
        e(f"wq{j} = ({j - 1} * C + c) * 4")
        z = []
        for k in range(4):
            acc = _Values((hj, wj))
            if k == 0 and finer is not None:
                acc.names = dict(finer.names)
            _emit_conv(e, f"z{j}_{k}", bands[j - 1][k], acc, K,
                       scale=f"{ld(f'ws[wq{j} + {k}]')} * float32({4.0 ** -j!r})",
                       tap=lambda t, k=k, j=j: ld(f"ww[(wq{j} + {k}) * {K2} + {tap_of(t)}]"))
            z.append(acc)
        hf, wf = sizes[j - 1]
        keep = (lambda r, col: (r, col) in outputs) if j == 1 else (lambda r, col: True)
        finer = _Values((hf, wf))
        for a in range(hj):
            for b in range(wj):
                outs = _butterfly(e, f"y{j}_{a}_{b}", *(z[k].get(a, b) for k in range(4)))
                for (dy, dx), name in zip(((0, 0), (0, 1), (1, 0), (1, 1)), outs):
                    r, col = 2 * a + dy, 2 * b + dx
                    if r < hf and col < wf and keep(r, col) and name is not None:
                        finer.names[(r, col)] = name

    # 3. the base convolution, row by row, plus the bias and the synthesis
    e(f"scale0 = {ld('s0[c]')}")
    if flip:
        e("bias = float32(0.0)")
    else:
        e(f"bias = scale0 * {ld('b0[c]')} if has_bias != 0 else float32(0.0)")
    for t in range(K2):
        e(f"f0_{t} = scale0 * {ld(f'w0[c * {K2} + {tap_of(t)}]')}")
    for r in range(H):
        cols = [col for col in range(W) if (r, col) in outputs]
        if not cols:
            continue
        acc = {col: "bias" for col in cols}
        for d in range(K):
            i = r + d - P
            if not 0 <= i < H:
                continue
            row = {}
            for col in range(W):  # input row i, reloaded for each output row
                expr = value(i, col)
                if expr is not None:
                    row[col] = f"xr{r}_{i}_{col}"
                    e(f"{row[col]} = {expr}")
            for col in cols:
                for dx in range(K):
                    jx = col + dx - P
                    if jx in row:
                        name = f"o{r}_{col}_{d}_{dx}"
                        e(f"{name} = f0_{d * K + dx} * {row[jx]} + {acc[col]}")
                        acc[col] = name
        for col in cols:
            value_name = acc[col]
            if finer is not None and finer.get(r, col) is not None:
                e(f"out{r}_{col} = {value_name} + {finer.get(r, col)}")
                value_name = f"out{r}_{col}"
            e(f"{outputs[(r, col)]} = {value_name}")


def _emit_conv(e: _Emitter, tag: str, src: _Values, acc: _Values, K: int, scale: str,
               tap) -> None:
    """``acc += conv_same(src, taps)`` on ``src``'s grid, zero terms dropped.

    Taps are folded (``fold = scale * tap(t)``) and applied one at a time, in
    row-major order, to every coefficient whose input lies in the grid, so
    each output adds its products in the same order as a gathering loop.
    An output with no term keeps its initial value (or stays zero).
    """
    P = K // 2
    hj, wj = src.shape
    e(f"sc_{tag} = {scale}")
    for dy in range(K):
        for dx in range(K):
            pairs = [((a, b), src.get(a + dy - P, b + dx - P))
                     for a in range(hj) for b in range(wj)]
            pairs = [(o, v) for o, v in pairs if v is not None]
            if not pairs:
                continue
            f = f"f_{tag}_{dy}_{dx}"
            e(f"{f} = sc_{tag} * {tap(dy * K + dx)}")
            for (a, b), v in pairs:
                name = f"{tag}_{a}_{b}_{dy}_{dx}"
                old = acc.get(a, b)
                e(f"{name} = {f} * {v}" if old is None else f"{name} = {f} * {v} + {old}")
                acc.names[(a, b)] = name


def _store_rounded(e: _Emitter, storage: str, target: str, value: str, tag: str) -> None:
    """Store the float32 ``value`` into ``target``, rounded once, without a branch.

    float32 and float16 as :func:`wtconv_cuda.kernels.codegen._store`; bfloat16
    rounds the raw bits to nearest even and turns a NaN into the quiet NaN
    ``0x7FC0``, as that function does, but with a select instead of an
    ``if``: every branch splits the straight-line code into more blocks,
    and numba's compile time grows with blocks times statements.
    """
    if storage != "bfloat16":
        _store(e, storage, target, value)
        return
    e(f"bits_{tag} = int64(libdevice.float_as_int({value}))",
      f"near_{tag} = (bits_{tag} + 0x7FFF + ((bits_{tag} >> 16) & 1)) >> 16",
      f"nan_{tag} = int64({value} != {value})",
      f"{target} = uint16((near_{tag} + (0x7FC0 - near_{tag}) * nan_{tag}) & 0xFFFF)")


def plane_pitch(pixels: int) -> int:
    """Floats between two threads' planes in shared memory: ``pixels`` made odd.

    Thread ``t`` reads word ``t * pitch + k``; an odd pitch puts the 32 lanes
    of a warp on 32 different banks.
    """
    return pixels | 1


def shared_bytes(spec: RegisterSpec) -> int:
    """Dynamic shared memory of a ``wtconv_registers`` block, in bytes.

    Forward: every thread's input plane and output plane, as float32, at
    :func:`plane_pitch` (the int32 table of plane indices is static).
    Backward: see :func:`backward_layout`.
    """
    if spec.backward:
        return 4 * backward_layout(spec).floats
    Ho, Wo = -(-spec.height // spec.stride), -(-spec.width // spec.stride)
    return 4 * spec.threads * (plane_pitch(spec.height * spec.width) + plane_pitch(Ho * Wo))


class BackwardLayout(NamedTuple):
    """Offsets (float32 words) in a backward block's shared buffer.

    Attributes
    ----------
    dy, x : int
        Every thread's plane of ``dy`` and of ``x`` (pitches :func:`plane_pitch`).
    work : int
        First ``dx`` (staged for a coalesced store); then, per warp, a
        `TAP_BATCH` x (`TAP_BATCH` + 1) transpose tile (tap ``i`` of lane ``m``
        at ``i * 33 + m``).
    sums : int
        After the tiles (inside the ``dx`` area): ``ntaps`` warp sums for each
        warp; after the final combine, a channel's sums are in the row of its
        first warp.
    floats : int
        Size of the buffer.
    ntaps : int
        ``K**2 (1 + 4 L) + 1``: base taps, bias, level taps.
    """

    dy: int
    x: int
    work: int
    sums: int
    floats: int
    ntaps: int


def backward_layout(spec: RegisterSpec) -> BackwardLayout:
    """The shared-memory layout of a backward ``wtconv_registers`` block.

    Parameters
    ----------
    spec : RegisterSpec
        A backward variant.

    Returns
    -------
    BackwardLayout
    """
    H, W, S, T = spec.height, spec.width, spec.stride, spec.threads
    Ho, Wo = -(-H // S), -(-W // S)
    ntaps = spec.kernel_size ** 2 * (1 + 4 * spec.levels) + 1
    warps = T // 32
    x = T * plane_pitch(Ho * Wo)
    work = x + T * plane_pitch(H * W)
    sums = work + warps * TAP_BATCH * (TAP_BATCH + 1)
    end = max(work + T * plane_pitch(H * W), sums + warps * ntaps)
    return BackwardLayout(0, x, work, sums, end, ntaps)


def register_backward_source(spec: RegisterSpec) -> str:
    """Python source of the backward ``wtconv_registers`` for ``spec``.

    The kernel takes ``(dy, dx, x, w0, b0, s0, ww, ws, gw0, gb0, gs0, gww,
    gws, B, C, has_bias)`` (see
    :func:`wtconv_cuda.kernels.compiler.register_signature`). As in the
    forward, thread ``q`` owns plane ``(q % B, q // B)``; ``B`` (a multiple
    of 32, a run-time value) must divide the block, which then holds
    ``threads / B`` whole channels.

    1. The block stages its planes of ``dy`` and ``x`` (coalesced).
    2. Each thread runs the adjoint pipeline on its ``dy`` (upsampled by the
       stride with zeros, every filter flipped, no bias) and the block stores
       ``dx``.
    3. Each thread forms the ``ntaps`` weight-gradient sums of its plane, in
       the order of the published parameters: base taps (``dy`` correlated
       with ``x``), the bias (the sum of ``dy``), then each level's four
       subbands (the raw pyramids of ``dy`` and ``x`` correlated, times
       ``4**-j``), recomputing the pyramids it needs from the staged planes.
       Each warp reduces its 32 planes' sums without a block barrier: lanes
       write a batch of `TAP_BATCH` taps into the warp's transpose tile, and
       after a ``syncwarp`` lane ``i`` adds tap ``i`` of the batch over the
       warp's lanes in lane order. At the end the ``B / 32`` warp sums of a
       channel are added in warp order (deterministic).
    4. The block unfolds its channels' sums into the gradients of the
       published parameters, as ``wtconv_finalize`` does
       (:func:`wtconv_cuda.kernels.codegen._emit_gradient_unfold`): no
       partials, no second launch.

    Parameters
    ----------
    spec : RegisterSpec
        The variant to generate.

    Returns
    -------
    str
        Source of a function ``wtconv_registers``.

    Raises
    ------
    ValueError
        As :func:`register_kernel_source`.
    """
    _check(spec)
    K, L, st, T = spec.kernel_size, spec.levels, spec.storage, spec.threads
    H, W, S = spec.height, spec.width, spec.stride
    P, K2 = K // 2, K * K
    Ho, Wo = -(-H // S), -(-W // S)
    PX, PY = plane_pitch(H * W), plane_pitch(Ho * Wo)
    lay = backward_layout(spec)
    sizes = grids(H, W, L)

    def dy_at(r, col):
        if r % S or col % S:
            return None
        return f"S[dys + {(r // S) * Wo + col // S}]"

    def x_at(r, col):
        return f"S[xs + {r * W + col}]"

    e = _Emitter()
    e("def wtconv_registers(dy, dx, x, w0, b0, s0, ww, ws, gw0, gb0, gs0, gww, gws, B, C, "
      "has_bias):")
    with e.indent():
        _emit_prologue(e, T)
        e(f"L = {L}", f"ntaps = {lay.ntaps}", "fz = float32(0.0)",
          f"runs = {T} // B  # whole channels in the block")
        _emit_staging_load(e, st, T, Ho * Wo, PY, lay.dy, "dy", STAGING_LOADS_BACKWARD)
        _emit_staging_load(e, st, T, H * W, PX, lay.x, "x", STAGING_LOADS_BACKWARD)
        e("cuda.syncthreads()",
          f"dys = {lay.dy} + t * {PY}",
          f"xs = {lay.x} + t * {PX}",
          f"dxs = {lay.work} + t * {PX}")
        outputs = {(r, col): f"S[dxs + {r * W + col}]" for r in range(H) for col in range(W)}
        _emit_plane(e, spec, dy_at, outputs, flip=True)
        e("cuda.syncthreads()")
        _emit_staging_store(e, st, T, H * W, PX, lay.work, "dx")
        e("cuda.syncthreads()")

        e("lane = t % 32", "warp = t // 32",
          f"tile_in = {lay.work} + warp * {TAP_BATCH * (TAP_BATCH + 1)} + lane",
          f"tile_out = {lay.work} + warp * {TAP_BATCH * (TAP_BATCH + 1)} + lane * {TAP_BATCH + 1}",
          f"warp_sums = {lay.sums} + warp * ntaps + lane")
        batch = _TapBatches(e)
        # base taps: dy correlated with x; the bias: the sum of dy
        batch.reserve(K2)
        e("if nvalid > 0:")
        with e.indent():
            xv = _Values((H, W))
            dv = _Values((H, W))
            for r in range(H):
                for col in range(W):
                    xv.names[(r, col)] = f"bx{r}_{col}"
                    e(f"bx{r}_{col} = {x_at(r, col)}")
                    if dy_at(r, col) is not None:
                        dv.names[(r, col)] = f"bd{r}_{col}"
                        e(f"bd{r}_{col} = {dy_at(r, col)}")
            for t in range(K2):
                batch.add(_correlation(e, f"g0_{t}", dv, xv, t // K - P, t % K - P))
        batch.reserve(1)
        e("if nvalid > 0:")
        with e.indent():
            terms = [dv.get(r, col) for r in range(H) for col in range(W)]
            batch.add(_chain_sum(e, "gbias", [v for v in terms if v is not None]))
        # level taps: the raw pyramids of dy and x, recomputed per subband
        for j in range(1, L + 1):
            for k in range(4):
                batch.reserve(K2)
                e("if nvalid > 0:")
                with e.indent():
                    _, gbands = _emit_pyramid(e, f"pd{j}{k}_", sizes, dy_at, j)
                    _, xbands = _emit_pyramid(e, f"px{j}{k}_", sizes, x_at, j)
                    for t in range(K2):
                        v = _correlation(e, f"g{j}_{k}_{t}", gbands[j - 1][k],
                                         xbands[j - 1][k], t // K - P, t % K - P)
                        if v != "fz":
                            e(f"g{j}_{k}_{t}s = {v} * float32({4.0 ** -j!r})")
                            v = f"g{j}_{k}_{t}s"
                        batch.add(v)
        batch.flush()
        # a channel's warp sums, added in warp order into its first warp's row
        e("cuda.syncthreads()", "nw = B // 32", "run_row = nw * ntaps",
          f"for idx in range(t, runs * ntaps, {T}):")
        with e.indent():
            e("at = {} + (idx // ntaps) * run_row + idx % ntaps".format(lay.sums),
              "tot = S[at]", "for m in range(1, nw):", "    tot += S[at + m * ntaps]",
              "S[at] = tot")
        e("cuda.syncthreads()", "cb = q0 // B", "tu = t  # the unfold below names its taps t")
        _emit_gradient_unfold(e, K, st, "tu", T, "runs", run_channel="cb + run",
                              run_valid="q0 + run * B < nplanes",
                              gsum=lambda tt: f"S[{lay.sums} + run * run_row + {tt}]")
    return e.text()


class _TapBatches:
    """Per-thread tap sums into the warp's transpose tile, reduced over the warp every
    `TAP_BATCH` taps (uses the names ``tile_in``, ``tile_out`` and ``warp_sums``)."""

    def __init__(self, e: _Emitter) -> None:
        self.e = e
        self.first, self.count = 0, 0  # first tap of the open batch, taps in it

    def reserve(self, taps: int) -> None:
        """Flush the open batch now unless it can take ``taps`` more.

        Called between groups of taps, where none of the last group's values
        is live, so a group's taps share a batch when they fit (a flush inside
        a group holds the tile's loads and the group's values at once). At 7 x
        7, K 5, ptxas reported the same spills at a 168 cap with and without
        it (352 B of stack); it costs one flush more there (9).
        """
        if self.count + taps > TAP_BATCH:
            self.flush()

    def add(self, value: str) -> None:
        """Store this thread's sum of the next tap (``value``: a name or ``fz``)."""
        self.e(f"S[tile_in + {self.count * (TAP_BATCH + 1)}] = {value}")
        self.count += 1
        if self.count == TAP_BATCH:
            self.flush()

    def flush(self) -> None:
        """Warp barrier; lane ``i`` adds tap ``first + i`` over the warp's 32 lanes, in lane
        order, into the warp's sums; warp barrier (the tile is written again next)."""
        if not self.count:
            return
        e = self.e
        e("cuda.syncwarp()", f"if lane < {self.count}:")
        with e.indent():
            terms = " + ".join(f"S[tile_out + {m}]" for m in range(TAP_BATCH))
            e(f"S[warp_sums + {self.first}] = {terms}")
        e("cuda.syncwarp()")
        self.first += self.count
        self.count = 0


def _correlation(e: _Emitter, tag: str, g: _Values, u: _Values, oy: int, ox: int) -> str:
    """``sum_q g[q] * u[q + (oy, ox)]`` over the grid, zero terms dropped; returns its name
    (``fz`` when no term is left)."""
    hj, wj = g.shape
    terms = []
    for a in range(hj):
        for b in range(wj):
            gv, uv = g.get(a, b), u.get(a + oy, b + ox)
            if gv is not None and uv is not None:
                terms.append((gv, uv))
    if not terms:
        return "fz"
    acc = None
    for n, (gv, uv) in enumerate(terms):
        name = f"{tag}_{n}"
        e(f"{name} = {gv} * {uv}" if acc is None else f"{name} = {gv} * {uv} + {acc}")
        acc = name
    return acc


def _chain_sum(e: _Emitter, tag: str, names: list) -> str:
    """The sum of ``names`` in order (``fz`` for none); returns its name."""
    if not names:
        return "fz"
    acc = names[0]
    for n, v in enumerate(names[1:]):
        e(f"{tag}_{n} = {acc} + {v}")
        acc = f"{tag}_{n}"
    return acc


def _emit_staging_store(e: _Emitter, storage: str, threads: int, pixels: int, pitch: int,
                        base: int, array: str) -> None:
    """Store the block's planes from the shared buffer into ``array``, coalesced.

    The block's planes of ``pixels`` elements are taken as one list of
    elements; thread ``t`` moves elements ``t, t + threads, ...``, so a warp
    touches one or two planes per instruction (each plane is contiguous in
    memory) where a thread writing its own plane would touch 32. Element ``i``
    is pixel ``i % pixels`` of the block's plane ``i // pixels``, which is
    plane ``A[i // pixels]`` of the array, and float32 word ``base + (i //
    pixels) * pitch + i % pixels`` of the buffer. The loop covers the block's
    ``nvalid`` planes; its quotient and remainder are stepped, not divided.
    Each word is rounded once to ``storage``. :func:`_emit_staging_load` is the
    same copy the other way.
    """
    tag = f"store_{array}"
    e(f"n_{tag} = int64({pixels})")
    with _DivmodLoop(e, f"i_{tag}", "t", f"nvalid * {pixels}", threads, f"n_{tag}", f"pl_{tag}",
                     f"px_{tag}"):
        e(f"g_{tag} = int64(A[pl_{tag}]) * {pixels} + px_{tag}")
        _store_rounded(e, storage, f"{array}[g_{tag}]",
                       f"S[{base} + pl_{tag} * {pitch} + px_{tag}]", tag)


def _emit_staging_load(e: _Emitter, storage: str, threads: int, pixels: int, pitch: int,
                       base: int, array: str, ahead: int) -> None:
    """Load the block's planes into the shared buffer as float32 words, unrolled: each
    thread copies ``pixels`` elements of the block's ``threads`` planes (in the element
    order of :func:`_emit_staging_store`), ``ahead`` loads before their stores.

    A loop with one load and its store per iteration makes a thread wait out
    one memory latency per element (49 for a 7 x 7 plane), and a small problem
    has too few warps to cover them. Here element ``t + k * threads`` is
    pixel ``tr + b_k`` of block plane ``tq + a_k`` (``divmod(t, pixels) = (tq,
    tr)``, ``divmod(k * threads, pixels) = (a_k, b_k)``, constants), carried
    once when ``tr + b_k`` passes ``pixels``: no division per element and no
    loop. The block's planes past ``nvalid`` are its last valid plane again
    (``A``, :func:`_emit_prologue`), so every thread loads all of its elements
    without a bound check and the buffer's extra planes hold copies.
    """
    tag = f"load_{array}"
    e(f"tq_{tag} = t // {pixels}", f"tr_{tag} = t - tq_{tag} * {pixels}")
    for first in range(0, pixels, ahead):
        group = range(first, min(first + ahead, pixels))
        for k in group:
            a, b = divmod(k * threads, pixels)
            pl, px = f"pl{k}_{tag}", f"px{k}_{tag}"
            if b == 0:
                e(f"{pl} = tq_{tag} + {a}", f"{px} = tr_{tag}")
            else:
                e(f"o{k}_{tag} = int64(tr_{tag} >= {pixels - b})",
                  f"{pl} = tq_{tag} + ({a} + o{k}_{tag})",
                  f"{px} = tr_{tag} + ({b} - {pixels} * o{k}_{tag})")
            e(f"v{k}_{tag} = {_load(storage, f'{array}[int64(A[{pl}]) * {pixels} + {px}]')}")
        for k in group:
            e(f"S[{base} + pl{k}_{tag} * {pitch} + px{k}_{tag}] = v{k}_{tag}")
