"""Register kernel for tiny planes: ``wtconv_registers`` (forward).

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

One thread, one plane:

1. load the plane and form the Haar pyramid (raw butterflies, no ``1/2``: the
   factors are powers of two and go into the taps, see below);
2. from the coarsest level down: convolve the four subbands (the LL
   accumulator starts from the synthesis of the level above) and synthesise
   them onto the next finer grid (level 1: only the pixels the stride keeps);
3. for each output row, the base convolution over ``K`` reloaded input rows
   (from L1), the bias and the synthesis; one store per output pixel.

Folded taps: with raw butterflies, level ``j``'s subbands are ``2**j`` times
the operator's and each raw synthesis doubles again, so the level's taps are
``s_{j,k} * w_{j,k} / 4**j`` (exact powers of two; one rounding, in the product
``s * w``) and the sum over levels needs no other factor (SPEC.md, closed form).
The base taps are ``s0 * w0`` and the bias term ``s0 * b``.

Every value lives in a register, so the plane must be small: the planner
(:func:`wtconv_cuda.kernels.launch.plan_registers`) uses this kernel up to
:data:`MAX_PIXELS` pixels. The pixels a thread reads are ``C * H * W``
elements apart from its neighbours'; each thread reads ``H * W`` contiguous
elements, which L1 serves after the first touch of each sector.
"""

from __future__ import annotations

from typing import NamedTuple

from .codegen import STORAGE, _DivmodLoop, _Emitter, _load, _store

#: Largest plane (``H * W``) the planner gives this kernel: a 7 x 7 or 8 x 8
#: plane's live values fit in 128 registers (see tests/kernels/test_ptxas.py).
MAX_PIXELS = 64


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
    """

    kernel_size: int
    storage: str
    height: int
    width: int
    levels: int
    stride: int = 1
    threads: int = 128
    max_registers: int = 128


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
    computes plane ``(q % B, q // B)``; threads past ``B * C`` return at once.
    No shared memory, no barriers.

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
    K, L, st = spec.kernel_size, spec.levels, spec.storage
    H, W, S = spec.height, spec.width, spec.stride
    if K < 1 or K % 2 == 0:
        raise ValueError(f"kernel_size must be odd and >= 1, got {K}")
    if st not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, got {st!r}")
    if L < 0 or H < 1 or W < 1 or S < 1:
        raise ValueError(f"need levels >= 0 and height, width, stride >= 1, got {spec}")
    if spec.threads < 32 or spec.threads % 32:
        raise ValueError(f"threads must be a positive multiple of 32, got {spec.threads}")
    P, K2 = K // 2, K * K
    Ho, Wo = -(-H // S), -(-W // S)
    sizes = grids(H, W, L)
    ld = lambda expr: _load(st, expr)  # noqa: E731

    T, PX, PY = spec.threads, plane_pitch(H * W), plane_pitch(Ho * Wo)
    e = _Emitter()
    e("def wtconv_registers(x, y, w0, b0, s0, ww, ws, B, C, has_bias):")
    with e.indent():
        e("S = cuda.shared.array(0, dtype=float32)",
          f"A = cuda.shared.array({T}, dtype=int32)",
          "t = int64(cuda.threadIdx.x)",
          f"q0 = int64(cuda.blockIdx.x) * {T}",
          "nplanes = B * C",
          f"nvalid = min({T}, nplanes - q0)",
          "# channel-major: a warp's lanes are consecutive batch entries of one channel;",
          "# a thread past the last plane recomputes it and stores nothing",
          "q = min(q0 + t, nplanes - 1)",
          "c = q // B",
          "A[t] = int32((q - c * B) * C + c)",
          "cuda.syncthreads()")
        _emit_staging(e, "load", st, T, H * W, PX, 0)
        e("cuda.syncthreads()",
          f"xs = t * {PX}",
          f"ys = {T * PX} + t * {PY}")

        # 1. the plane and its raw Haar pyramid, two rows at a time
        level = _Values(sizes[0])
        bands = [[_Values(sizes[j]) for _ in range(4)] for j in range(1, L + 1)]
        for r in range(H):
            for col in range(W):
                name = f"x{r}_{col}"
                e(f"{name} = S[xs + {r * W + col}]")
                level.names[(r, col)] = name
            if r % 2 == 0 and r < H - 1:
                continue
            # rows r - 1 and r (or the last, odd row) complete a row of level-1 blocks;
            # a completed level-j row may complete a row of level j + 1
            row, j = r // 2, 1
            while j <= L:
                src = level if j == 1 else bands[j - 2][0]
                sub = bands[j - 1]
                for b in range(sizes[j][1]):
                    quad = [src.get(2 * row + dy, 2 * b + dx) for dy in (0, 1) for dx in (0, 1)]
                    for k, name in enumerate(_butterfly(e, f"a{j}_{row}_{b}", *quad)):
                        if name is not None:
                            sub[k].names[(row, b)] = name
                if row % 2 == 0 and row < sizes[j][0] - 1:
                    break
                row, j = row // 2, j + 1

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
                           tap=lambda t, k=k, j=j: ld(f"ww[(wq{j} + {k}) * {K2} + {t}]"))
                z.append(acc)
            hf, wf = sizes[j - 1]
            keep = (lambda r, col: r % S == 0 and col % S == 0) if j == 1 else (lambda r, col: True)
            finer = _Values((hf, wf))
            for a in range(hj):
                for b in range(wj):
                    outs = _butterfly(e, f"y{j}_{a}_{b}", *(z[k].get(a, b) for k in range(4)))
                    for (dy, dx), name in zip(((0, 0), (0, 1), (1, 0), (1, 1)), outs):
                        r, col = 2 * a + dy, 2 * b + dx
                        if r < hf and col < wf and keep(r, col) and name is not None:
                            finer.names[(r, col)] = name

        # 3. the base convolution, row by row, plus the bias and the synthesis
        e(f"scale0 = {ld('s0[c]')}",
          f"bias = scale0 * {ld('b0[c]')} if has_bias != 0 else float32(0.0)")
        for t in range(K2):
            e(f"f0_{t} = scale0 * {ld(f'w0[c * {K2} + {t}]')}")
        for r in range(0, H, S):
            cols = range(0, W, S)
            acc = {col: "bias" for col in cols}
            for d in range(K):
                i = r + d - P
                if not 0 <= i < H:
                    continue
                for col in range(W):  # input row i, reloaded for each output row
                    e(f"xr{r}_{i}_{col} = S[xs + {i * W + col}]")
                for col in cols:
                    for dx in range(K):
                        jx = col + dx - P
                        if 0 <= jx < W:
                            name = f"o{r}_{col}_{d}_{dx}"
                            e(f"{name} = f0_{d * K + dx} * xr{r}_{i}_{jx} + {acc[col]}")
                            acc[col] = name
            for col in cols:
                value = acc[col]
                if finer is not None and finer.get(r, col) is not None:
                    e(f"out{r}_{col} = {value} + {finer.get(r, col)}")
                    value = f"out{r}_{col}"
                e(f"S[ys + {(r // S) * Wo + col // S}] = {value}")
        e("cuda.syncthreads()")
        _emit_staging(e, "store", st, T, Ho * Wo, PY, T * PX)
    return e.text()


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

    Every thread's input plane and output plane, as float32, at
    :func:`plane_pitch` (the int32 table of plane indices is static).
    """
    Ho, Wo = -(-spec.height // spec.stride), -(-spec.width // spec.stride)
    return 4 * spec.threads * (plane_pitch(spec.height * spec.width) + plane_pitch(Ho * Wo))


def _emit_staging(e: _Emitter, direction: str, storage: str, threads: int, pixels: int,
                  pitch: int, base: int) -> None:
    """Copy the block's planes between global memory and the shared buffer, coalesced.

    The block's ``nvalid`` planes of ``pixels`` elements are taken as one list
    of elements; thread ``t`` moves elements ``t, t + threads, ...``, so a
    warp touches one or two planes per instruction (each plane is contiguous
    in memory) where a thread reading its own plane would touch 32. Element
    ``i`` is pixel ``i % pixels`` of the block's plane ``i // pixels``, which
    is plane ``A[i // pixels]`` of the array; quotient and remainder are
    stepped, not divided. ``direction`` "load" converts ``x`` into float32
    words of the buffer (from word ``base``, planes ``pitch`` apart), "store"
    rounds them into ``y``.
    """
    tag = direction
    e(f"n_{tag} = int64({pixels})")
    with _DivmodLoop(e, f"i_{tag}", "t", f"nvalid * {pixels}", threads, f"n_{tag}", f"pl_{tag}",
                     f"px_{tag}"):
        e(f"g_{tag} = int64(A[pl_{tag}]) * {pixels} + px_{tag}")
        word = f"S[{base} + pl_{tag} * {pitch} + px_{tag}]"
        if direction == "load":
            e(f"{word} = {_load(storage, f'x[g_{tag}]')}")
        else:
            _store_rounded(e, storage, f"y[g_{tag}]", word, tag)
