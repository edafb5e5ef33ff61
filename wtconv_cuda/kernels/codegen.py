"""Source generator for the fused plane kernels.

Numba does not reliably unroll loops whose trip count is a compile-time
constant, and a register array indexed inside such a loop ends up in local
memory (slow). The hot loops are therefore *generated* as straight-line scalar
code: every accumulator, weight and tap value is a named local variable. The
generated text is ordinary Python for ``numba.cuda``; the same text runs under
the CUDA simulator, which is how CI tests it.

Two kernels are generated:

``wtconv_plane``
    A block runs ``planes_per_block`` ``(b, c)`` planes side by side, one
    thread group and one buffer slot each (see :func:`plane_kernel_source`);
    blocks step through the planes until all are done. For each plane it loads
    the plane, builds the Haar pyramid on chip, convolves every subband, runs
    the closed-form synthesis and the base convolution and writes the output.
    With ``backward=True`` it runs the same pipeline on ``dy`` with flipped
    taps (that is ``dx``), then loads ``x`` and correlates both pyramids into
    weight-gradient sums. A backward thread group works on *units* of ``rb``
    consecutive batch entries of one channel and adds up the unit's weight
    gradients on chip; the block then adds the sums of its units of one
    channel into one partial (so the partials take ``C * ceil(B / rb) / M *
    ntaps`` floats instead of ``B * C * ntaps``, ``M`` units per partial).
    When ``M`` is all of a channel's units the block writes the channel's
    gradients itself (``fused_finalize``) and no partials are needed. A
    ``weights_only`` backward leaves ``dx`` to the forward kernels: it builds
    ``dy``'s raw-LL chain without convolving it (in halo-less grids of its
    own, see :mod:`wtconv_cuda.kernels.layout`) and runs the weight-gradient
    phase alone.
``wtconv_finalize``
    One block per channel: sums the channel's partials in a fixed order
    (deterministic) and unfolds them into the gradients of the published
    parameters.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

from .layout import (
    HEADER, HEADER_FIELDS, LEVEL_BASE, LEVEL_FIELDS, LEVEL_STRIDE, bias_index, plane_layout,
)
from .weight_blocks import emit_blocked_weight_gradients

#: Storage dtypes the kernels read and write (accumulation is always float32).
STORAGE = ("float32", "float16", "bfloat16")


class PlaneSpec(NamedTuple):
    """Compile-time parameters of one ``wtconv_plane`` variant.

    Attributes
    ----------
    kernel_size : int
        Odd ``K``.
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (raw ``uint16`` bits).
    in_stride, out_stride : int
        Input upsampling and output subsampling factors.
    backward : bool
        Flip the taps, drop the bias and append the weight-gradient phase.
    scratch : bool
        Keep the working set in global scratch instead of shared memory.
    threads : int
        Threads per plane (a block has ``threads * planes_per_block``).
    strip : int
        Coefficient rows per thread in the analysis and output phases.
    max_registers : int
        Register cap handed to ptxas (``.maxnreg``); 0 leaves it free.
    planes_per_block : int
        Planes a block works on side by side (``threads`` each); small planes
        need several to keep a multiprocessor busy.
    warp_sync : bool
        Each plane's thread group lies within one warp (``threads`` 32, or 16,
        8, ... with several groups per warp) and waits only for its warp
        (``syncwarp``) instead of for the whole block, so the warps of a block
        run independently. Groups that share a warp pass the same barriers
        (their control flow differs only inside work loops), and a block
        holds whole warps.
    fused_finalize : bool
        Backward only: a block holds every work unit of each of its channels
        (the units per channel divide ``planes_per_block``), so it writes the
        channel's parameter gradients itself, exactly as ``wtconv_finalize``
        would, instead of a partial; the kernel takes the five gradient
        arrays after ``geo`` and no finalize launch follows.
    weights_only : bool
        Backward only: the weight gradients without ``dx`` (the caller runs
        the forward on ``dy`` with flipped taps for it, see
        :func:`wtconv_cuda.kernels.launch.run_backward`). The kernel loads
        ``dy``, builds its raw-LL chain without convolving anything, and
        correlates it with the ``x`` pyramid; ``out`` is never written and
        the taps are never folded.
    plane : tuple of int
        ``weights_only`` only: ``(H, W, L)`` of every plane of the launch, or
        ``()``. The level table's entries are then compiled in
        (:func:`_level`): the raw-LL chains run unrolled by level with
        constant offsets, sizes and divisors, and the level taps' phases
        with constant bounds, where they otherwise read ``geo`` in global
        memory on every level (loads, then 64-bit divisions by their
        values, then a barrier).
    blocked : bool
        ``plane`` variants only: the correlations on register blocks
        (:mod:`wtconv_cuda.kernels.weight_blocks`): a thread owns a block of
        ``dy`` values and all ``K * K`` taps, and the levels' subbands are
        formed once, in place. Its partial-sum region may be larger
        (``plane_layout(..., blocked=True)``).
    """

    kernel_size: int
    storage: str
    in_stride: int = 1
    out_stride: int = 1
    backward: bool = False
    scratch: bool = False
    threads: int = 256
    strip: int = 4
    max_registers: int = 0
    planes_per_block: int = 1
    warp_sync: bool = False
    fused_finalize: bool = False
    weights_only: bool = False
    plane: tuple = ()
    blocked: bool = False

    def __repr__(self) -> str:
        """As a named tuple's, without ``blocked=False``: a variant's name, and the key of
        its compiled PTX (:mod:`.compiler`), stay what they were before the field."""
        fields = (f"{name}={value!r}" for name, value in zip(self._fields, self)
                  if not (name == "blocked" and not value))
        return f"PlaneSpec({', '.join(fields)})"


#: Partials whose loads ``wtconv_finalize`` issues at once (one channel's
#: partials are summed serially per tap; at 64 x 96 x 56 x 56 fp32 the loop
#: of one load at a time took 60 us for 6.7 MB, latency-bound).
FINALIZE_UNROLL = 8


class FinalizeSpec(NamedTuple):
    """Compile-time parameters of one ``wtconv_finalize`` variant.

    Attributes
    ----------
    kernel_size : int
        Odd ``K``.
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (raw ``uint16`` bits):
        dtype of the weights read and of the gradients written.
    threads : int
        Threads per block (one block per channel).
    """

    kernel_size: int
    storage: str
    threads: int = 128


class _Emitter:
    """Collects indented source lines."""

    def __init__(self, geo=None) -> None:
        self.lines: list[str] = []
        self.depth = 0
        self.geo = geo  # the level table, where the variant compiles it in (PlaneSpec.plane)

    def __call__(self, *lines: str) -> None:
        for line in lines:
            self.lines.append("    " * self.depth + line)

    def indent(self) -> "_Indent":
        return _Indent(self)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class _Indent:
    def __init__(self, emitter: _Emitter) -> None:
        self.emitter = emitter

    def __enter__(self) -> None:
        self.emitter.depth += 1

    def __exit__(self, *exc) -> None:
        self.emitter.depth -= 1


class _DivmodLoop:
    """``for var in range(start, stop, step)`` whose body sees ``hi, lo = divmod(var, d)``.

    An integer division costs ~50 instructions on the GPU (64-bit, with a
    32-bit fast path), more than a small work item's own index arithmetic.
    Here ``hi`` and ``lo`` are divided out once before the loop and then
    stepped: ``lo`` grows by ``step % d`` and carries into ``hi``. ``d`` must
    be a plain name (it is read several times); the body must not
    ``continue``.
    """

    def __init__(self, e: "_Emitter", var: str, start: str, stop: str, step, d: str, hi: str,
                 lo: str) -> None:
        self.e, self.var, self.start, self.stop, self.step = e, var, start, stop, step
        self.d, self.hi, self.lo = d, hi, lo

    @staticmethod
    def setup(e: "_Emitter", start: str, step, d: str, hi: str, lo: str) -> None:
        """Emit ``hi, lo = divmod(start, d)`` and their steps for an index step of ``step``
        (``start``: a name or a parenthesised expression)."""
        e(f"{hi} = {start} // {d}", f"{lo} = {start} - {hi} * {d}",
          f"{hi}_step = {step} // {d}", f"{lo}_step = {step} - {hi}_step * {d}")

    @staticmethod
    def advance(e: "_Emitter", d: str, hi: str, lo: str) -> None:
        """Emit one step of ``hi, lo`` (the remainder carries into the quotient)."""
        e(f"{hi} += {hi}_step", f"{lo} += {lo}_step", f"if {lo} >= {d}:",
          f"    {lo} -= {d}", f"    {hi} += 1")

    def __enter__(self) -> None:
        self.setup(self.e, f"({self.start})", self.step, self.d, self.hi, self.lo)
        self.e(f"for {self.var} in range({self.start}, {self.stop}, {self.step}):")
        self.e.depth += 1

    def __exit__(self, *exc) -> None:
        self.advance(self.e, self.d, self.hi, self.lo)
        self.e.depth -= 1


def _floor_div(expr: str, divisor: int) -> str:
    """Expression of ``expr // divisor`` for an integer ``expr`` and constant ``divisor > 0``,
    parenthesised whole, so it can stand in any larger expression.

    A power of two gives an arithmetic shift, which is floor division for
    every sign (``-5 >> 1 == -3``), without the sign fix-up numba emits for
    ``//`` on int64.
    """
    if divisor == 1:
        return f"({expr})"
    if divisor & (divisor - 1):
        return f"(({expr}) // {divisor})"
    return f"(({expr}) >> {divisor.bit_length() - 1})"


def _floor_mod(expr: str, divisor: int) -> str:
    """Expression of ``expr % divisor`` (Python's sign) for an integer ``expr`` and constant
    ``divisor > 0``, parenthesised whole: a mask where it is a power of two (two's
    complement: ``-5 & 3 == 3``). (``&`` binds less tightly than ``-``: unparenthesised,
    ``a - a & 7`` was ``(a - a) & 7``.)"""
    if divisor & (divisor - 1):
        return f"(({expr}) % {divisor})"
    return f"(({expr}) & {divisor - 1})"


def _load(storage: str, expr: str) -> str:
    """Expression converting one stored element to float32."""
    if storage == "float32":
        return expr
    if storage == "float16":
        return f"float32({expr})"
    return f"libdevice.int_as_float(int32(int64({expr}) << 16))"


#: A zero of each storage's array element type (bfloat16: raw bits).
_STORED_ZERO = {"float32": "fz", "float16": "np.float16(fz)", "bfloat16": "uint16(0)"}


def _guarded_load(storage: str, element: str, guard: str) -> str:
    """Expression of the stored ``element`` where ``guard`` holds, else a stored zero;
    :func:`_load` converts it where it is used.

    Kept as stored, a batch of such loads issues before the first of them
    completes. Converted inside the guard (``float32(x[i]) if ok else fz``),
    each conversion sits in its load's conditional block, and ptxas, which
    keeps the if-converted block's order, stalls on every load in turn.
    """
    return f"{element} if {guard} else {_STORED_ZERO[storage]}"


def _store(emit: _Emitter, storage: str, target: str, value: str) -> None:
    """Emit a store of the float32 ``value`` into ``target``, rounded once."""
    if storage == "float32":
        emit(f"{target} = {value}")
    elif storage == "float16":
        emit(f"{target} = np.float16({value})")
    else:  # round to nearest even on the raw bits; NaN stays a quiet NaN
        emit(f"_v = {value}",
             "_bits = int64(libdevice.float_as_int(_v))",
             "if _v != _v:",
             "    _bits = int64(0x7FC0)",
             "else:",
             "    _bits = (_bits + 0x7FFF + ((_bits >> 16) & 1)) >> 16",
             f"{target} = uint16(_bits & 0xFFFF)")


_F = {name: i for i, name in enumerate(LEVEL_FIELDS)}


def _geo(name: str) -> str:
    """A header field: a scalar kernel parameter of the same name.

    Scalar parameters live in the constant bank, so the many header values
    that stay live for the whole kernel take no registers.
    """
    assert name in HEADER, name
    return name


def _lvl(level, field: str) -> str:
    return f"geo[{LEVEL_BASE} + {LEVEL_STRIDE} * ({level}) + {_F[field]}]"


def _level(e: "_Emitter", level, field: str) -> str:
    """A level field: its value where the variant compiles the table in and ``level`` is
    an int, else the table read of :func:`_lvl`."""
    if e.geo is not None and isinstance(level, int):
        return str(int(e.geo[LEVEL_BASE + LEVEL_STRIDE * level + _F[field]]))
    return _lvl(level, field)


def _emit_zero_fill(e: _Emitter, T: int) -> None:
    """Zero a ``weights_only`` slot's ``[a_off, p_off)`` once per launch, ``T`` threads.

    With the plane's table compiled in, the count is a constant: a ``while``
    loop over ``count // T`` stores and one guarded tail store, which ptxas
    unrolls by 16 at about 1.4 instructions a store. A ``range(tid, count, T)``
    loop keeps numba's 64-bit range bookkeeping in every unrolled step: 41
    instructions for 4 stores, constant count or not; at 56 x 56 that loop executed
    5.6% of the weights-only kernel's instructions (10.8 M of 194.6 M, ncu).
    """
    if e.geo is None:
        e(f"for i in range(tid, p_off - a_off, {T}):", "    S[sb + a_off + i] = fz")
        return
    start = int(e.geo[HEADER["a_off"]])
    full, tail = divmod(int(e.geo[HEADER["p_off"]]) - start, T)
    e(f"zb = sb + {start} + tid", f"zend = zb + {full * T}", "while zb < zend:",
      "    S[zb] = fz", f"    zb += {T}")
    if tail:
        e(f"if tid < {tail}:", "    S[zend] = fz")


def _butterfly(emit: _Emitter, out: str, idx, base: str, phase: str) -> None:
    """Haar butterfly of one coefficient's 2x2 block, stored as four phase planes.

    ``S[base + n * phase]`` holds the block's element ``n`` (0: top-left,
    1: top-right, 2: bottom-left, 3: bottom-right). Defines
    ``{out}0_{idx}..{out}3_{idx}`` = twice (LL, LH, HL, HH).
    """
    emit(f"_a = S[{base}]", f"_b = S[{base} + {phase}]",
         f"_c = S[{base} + 2 * {phase}]", f"_d = S[{base} + 3 * {phase}]",
         "_s = _a + _b", "_m = _a - _b", "_t = _c + _d", "_n = _c - _d",
         f"{out}0_{idx} = _s + _t", f"{out}1_{idx} = _s - _t",
         f"{out}2_{idx} = _m + _n", f"{out}3_{idx} = _m - _n")


def _phase_index(src: str, pitch: str, phase: str, row: str, col: str, R: int) -> str:
    """Index of full-resolution element ``(row, col)`` of a polyphase source grid."""
    return (f"{src} + (({row}) & 1) * 2 * {phase} + (({col}) & 1) * {phase} + "
            f"((({row}) >> 1) + {R}) * {pitch} + (({col}) >> 1) + {R}")


LOAD_UNROLL = 8


def plane_kernel_source(spec: PlaneSpec) -> str:
    """Python source of ``wtconv_plane`` for ``spec``.

    The kernel takes ``(src, out, xsrc, w0, b0, s0, ww, ws, part, scratch,
    geo, *header)``: pointers, then the table's header fields
    (:data:`wtconv_cuda.kernels.layout.HEADER_FIELDS`) again as int64
    scalars (see :func:`wtconv_cuda.kernels.compiler.plane_signature`). A block
    of ``spec.threads * spec.planes_per_block`` threads runs
    ``planes_per_block`` planes side by side: thread group ``g`` (``threads``
    threads) owns buffer slot ``g`` of the block, in dynamic shared memory or,
    with ``spec.scratch``, in ``scratch``. Blocks loop over the planes with a
    stride of ``gridDim.x * planes_per_block``, so a grid smaller than the
    plane count (persistent blocks) covers them all. The backward kernel's
    groups take work units instead of planes: ``rb`` (header field
    ``bchunk``) planes
    of one channel in turn, their weight-gradient sums kept in the slot's
    unit-sum region; the block adds the sums of its units of one channel into
    one partial (see ``_emit_block_partials``). Generated
    code names its locals apart from the header fields (which are kernel
    parameters): a test checks that no header field is assigned.

    Parameters
    ----------
    spec : PlaneSpec
        The variant to generate.

    Returns
    -------
    str
        Source of a function ``wtconv_plane``, to be turned into a function by
        :func:`build`.

    Raises
    ------
    ValueError
        ``spec.kernel_size`` is even or smaller than 1, ``spec.storage`` is
        not one of `STORAGE`, or ``spec.warp_sync`` is set with groups that do
        not tile whole warps.
    """
    K, T, G = spec.kernel_size, spec.threads, spec.planes_per_block
    if K < 1 or K % 2 == 0:
        raise ValueError(f"kernel_size must be odd and >= 1, got {K}")
    if spec.storage not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, got {spec.storage!r}")
    if spec.warp_sync and (32 % T or (T * G) % 32):
        raise ValueError("warp_sync needs thread groups that tile whole warps (threads "
                         f"dividing 32, threads * planes_per_block a multiple of 32), got "
                         f"threads={T}, planes_per_block={G}")
    if spec.fused_finalize and not spec.backward:
        raise ValueError("fused_finalize needs a backward variant")
    if spec.weights_only and not (spec.backward and spec.in_stride == spec.out_stride == 1):
        raise ValueError("weights_only needs a stride-1 backward variant")
    if spec.plane and not (spec.weights_only and len(spec.plane) == 3):
        raise ValueError(f"plane=(H, W, L) needs a weights_only variant, got {spec!r}")
    if spec.blocked and not spec.plane:
        raise ValueError(f"blocked needs a plane=(H, W, L) variant, got {spec!r}")
    e = _Emitter(_compiled_level_table(spec) if spec.plane else None)

    grads = "gw0, gb0, gs0, gww, gws, " if spec.fused_finalize else ""
    e("def wtconv_plane(src, out, xsrc, w0, b0, s0, ww, ws, part, scratch, geo, " + grads
      + ", ".join(HEADER_FIELDS) + "):")
    with e.indent():
        e("# A block runs G planes side by side, one group of T threads (and one",
          "# buffer slot) each; `tid` is the thread's index within its group.",
          f"grp = cuda.threadIdx.x // {T}",
          f"tid = cuda.threadIdx.x - grp * {T}",
          "fz = float32(0.0)",
          "f05 = float32(0.5)",
          "B = nplanes // C",
          f"src0 = {_level(e, 0, 'src')}", f"sp0 = {_level(e, 0, 'pitch')}",
          f"sph0 = {_level(e, 0, 'phase')}")
        if spec.scratch:
            e("S = scratch", f"sb = (int64(cuda.blockIdx.x) * {G} + grp) * {_geo('slot')}")
        else:
            e("S = cuda.shared.array(0, dtype=float32)", f"sb = grp * {_geo('slot')}")
        if spec.backward:
            e("xshift = xb_off - a_off",
              f"ntaps = {K * K + 1} + {4 * K * K} * L")
        if spec.weights_only:
            e(f"gsrc0 = {_level(e, 0, 'gsrc')}", f"gsp0 = {_level(e, 0, 'gpitch')}",
              f"gsph0 = {_level(e, 0, 'gphase')}",
              "# The x pyramid's halos and the dy grids' padding stay zero for the",
              "# whole launch.")
            _emit_zero_fill(e, T)
        else:
            e("# The halos of region A stay zero for the whole launch.",
              f"for i in range(tid, a_len, {T}):",
              "    S[sb + a_off + i] = fz")
        e(f"first = int64(cuda.blockIdx.x) * {G}")
        if not spec.backward:
            e("while first < nplanes:")
            with e.indent():
                e("# Planes run channel-major (the batch varies fastest), so a block's",
                  "# groups usually share one channel's taps in cache. A group past the",
                  "# last plane recomputes the last one and stores nothing.",
                  "valid = first + grp < nplanes",
                  "order = first + grp if valid else nplanes - 1",
                  "c = order // B",
                  "plane = (order - c * B) * C + c",
                  "cuda.syncthreads()")
                _emit_fold_weights(e, spec)
                _emit_plane_pass(e, spec)
                e(f"first += cuda.gridDim.x * {G}")
        else:
            e("# Work unit = bchunk consecutive batch entries of one channel, one after",
              "# the other; their weight gradients are summed in the unit-sum region",
              "# and written once. A group past the last unit recomputes the last one,",
              "# and a plane past the batch recomputes the last plane; neither stores.",
              "nchunks = (B + bchunk - 1) // bchunk",
              "nunits = C * nchunks")
            if spec.fused_finalize:
                e("# A block holds whole channels (the planner checked that nchunks",
                  f"# divides {G}): a run of nchunks units is one channel.",
                  "upart = nchunks")
            else:
                e(f"# upart = gcd({G}, nchunks): units summed into one partial (see",
                  "# units_per_partial in launch.py)",
                  f"upart = int64({G})",
                  "rest = nchunks",
                  "while rest != 0:",
                  "    tmp = upart % rest",
                  "    upart = rest",
                  "    rest = tmp")
            e(f"sb0 = sb - grp * {_geo('slot')}",
              "while first < nunits:")
            with e.indent():
                e("# (few values stay live across the planes: registers are tight)",
                  "unit = first + grp if first + grp < nunits else nunits - 1",
                  "c = unit // nchunks",
                  "bstart = (unit - c * nchunks) * bchunk",
                  "cuda.syncthreads()")
                if not spec.weights_only:
                    _emit_fold_weights(e, spec)
                e(f"for i in range(tid, ntaps, {T}):",
                  "    S[sb + w_off + i] = fz",
                  "for bq in range(bstart, bstart + bchunk):")
                with e.indent():
                    e("valid = first + grp < nunits and bq < B",
                      "plane = (bq if bq < B else B - 1) * C + c",
                      "cuda.syncthreads()")
                    if spec.blocked:
                        e("# tid derived from the plane: LLVM then keeps the pyramid's indices",
                          "# and addresses inside the plane loop instead of hoisting them out,",
                          "# live across the blocks' phases (ptxas spilled 248 B at 56 x 56).",
                          f"tid = cuda.threadIdx.x - grp * {T} if plane >= 0 else int64(0)")
                    if spec.weights_only:
                        _emit_gradient_pyramid(e, spec)
                    else:
                        _emit_plane_pass(e, spec)
                    if spec.blocked:
                        emit_blocked_weight_gradients(e, spec)
                    else:
                        _emit_weight_gradients(e, spec)
                if spec.fused_finalize:
                    _emit_block_finalize(e, spec)
                else:
                    _emit_block_partials(e, spec)
                e(f"first += cuda.gridDim.x * {G}")
    text = e.text()
    if spec.warp_sync:  # every other barrier only orders one group's own slot
        text = text.replace("cuda.syncthreads()", "cuda.syncwarp()")
    return text.replace(_BLOCK_BARRIER, "cuda.syncthreads()")


def _compiled_level_table(spec: PlaneSpec):
    """The level table a ``plane`` variant compiles in: the planner's, for the same plane."""
    height, width, levels = spec.plane
    return plane_layout(height, width, levels, spec.kernel_size, spec.strip, spec.threads,
                        1, 1, True, True, spec.blocked).geo


#: Placeholder of a barrier that stays a block barrier in a ``warp_sync``
#: variant (the partial sums read every group's slot).
_BLOCK_BARRIER = "BLOCK_BARRIER()"


def _emit_block_partials(e: _Emitter, spec: PlaneSpec) -> None:
    """Backward: add up the block's unit sums into weight-gradient partials.

    The block's groups hold ``G`` consecutive units (``first`` is a multiple
    of ``G``). Runs of ``M = gcd(G, nchunks)`` of them belong to one channel
    (``nchunks`` is a multiple of ``M``), so each run's unit sums are added in
    group order into one partial, ``part[unit // M * ntaps:]``: ``M`` times
    fewer partials than units, in a fixed order (deterministic). Groups past
    the last unit never add to their sums, and a run is either wholly before or
    wholly past it. Two block barriers: every group's sums are complete before
    the read, and read before the next unit clears them.
    """
    T, G = spec.threads, spec.planes_per_block
    e(_BLOCK_BARRIER,
      f"for idx in range(cuda.threadIdx.x, ({G} // upart) * ntaps, {T * G}):")
    with e.indent():
        e("run = idx // ntaps", "i = idx - run * ntaps", "u0 = first + run * upart",
          "if u0 < nunits:")
        with e.indent():
            e("tot = fz", "for g in range(upart):",
              f"    tot += S[sb0 + (run * upart + g) * {_geo('slot')} + w_off + i]",
              "part[(u0 // upart) * ntaps + i] = tot")
    e(_BLOCK_BARRIER)


def _emit_block_finalize(e: _Emitter, spec: PlaneSpec) -> None:
    """Backward, ``fused_finalize``: the block's channels' gradients, written directly.

    Each run of ``upart`` (= ``nchunks``) units is a whole channel. First its
    unit sums are added in group order into the run's first slot, the level
    taps times the two Haar factors 1/2, exactly as ``_emit_block_partials``
    and ``wtconv_finalize`` would add them (so both paths give the same
    bits); then, after a block barrier, those channel sums are unfolded into
    the gradients of the published parameters (:func:`_emit_gradient_unfold`).
    The last barrier keeps the sums until every thread has read them.
    """
    T, G, K2 = spec.threads, spec.planes_per_block, spec.kernel_size ** 2
    block_threads = T * G
    e(_BLOCK_BARRIER,
      f"for idx in range(cuda.threadIdx.x, ({G} // upart) * ntaps, {block_threads}):")
    with e.indent():
        e("run = idx // ntaps", "i = idx - run * ntaps",
          "if first + run * upart < nunits:")
        with e.indent():
            e("tot = fz", "for g in range(upart):",
              f"    tot += S[sb0 + (run * upart + g) * {_geo('slot')} + w_off + i]",
              f"if i > {K2}:", "    tot = tot * float32(0.25)",
              f"S[sb0 + run * upart * {_geo('slot')} + w_off + i] = tot")
    e(_BLOCK_BARRIER)
    _emit_gradient_unfold(
        e, spec.kernel_size, spec.storage, "cuda.threadIdx.x", block_threads, f"{G} // upart",
        run_channel="(first + run * upart) // upart",
        run_valid="first + run * upart < nunits",
        gsum=lambda t: f"S[sb0 + run * upart * {_geo('slot')} + w_off + {t}]")
    e(_BLOCK_BARRIER)


def _emit_gradient_unfold(e: _Emitter, K: int, storage: str, start: str, step: int, runs: str,
                          run_channel: str, run_valid: str, gsum) -> None:
    """Unfold channel sums into the published parameters' gradients.

    For each of ``runs`` runs (channels), ``gsum(t)`` is the float32 sum of
    tap ``t`` (``ntaps`` of them: base taps, bias, level taps with the Haar
    factors applied) of channel ``run_channel``; ``run_valid`` says whether the
    run exists. Writes ``s0 * G`` for the base taps and bias, ``ws * G`` for
    the level taps, and the scale gradients ``sum(w * G)`` (plus ``b0 *
    G_bias`` for ``s0``), each rounded once to the storage dtype. Work is
    dealt out as ``range(start, ..., step)`` over (run, tap) and then (run,
    scale) pairs. Shared by ``wtconv_finalize`` and the fused backward.
    """
    K2 = K * K
    ld = lambda x: _load(storage, x)  # noqa: E731
    e(f"for idx in range({start}, ({runs}) * ntaps, {step}):")
    with e.indent():
        e("run = idx // ntaps", "t = idx - run * ntaps", f"if {run_valid}:")
        with e.indent():
            e(f"c = {run_channel}", "s0c = " + ld("s0[c]"), f"if t < {K2}:")
            with e.indent():
                _store(e, storage, f"gw0[c * {K2} + t]", f"s0c * {gsum('t')}")
            e(f"elif t == {K2}:")
            with e.indent():
                e("if has_bias != 0:")
                with e.indent():
                    _store(e, storage, "gb0[c]", f"s0c * {gsum('t')}")
            e("else:")
            with e.indent():
                e(f"r = t - {K2 + 1}", f"j = r // {4 * K2}", f"rem = r - j * {4 * K2}",
                  f"k = rem // {K2}", f"tt = rem - k * {K2}", "widx = (j * C + c) * 4 + k")
                _store(e, storage, f"gww[widx * {K2} + tt]", ld("ws[widx]") + f" * {gsum('t')}")
    e("nscales = 1 + 4 * L",
      f"for idx in range({start}, ({runs}) * nscales, {step}):")
    with e.indent():
        e("run = idx // nscales", "u = idx - run * nscales", f"if {run_valid}:")
        with e.indent():
            e(f"c = {run_channel}", "acc = fz", "if u == 0:")
            with e.indent():
                e(f"for t in range({K2}):",
                  f"    acc += {ld(f'w0[c * {K2} + t]')} * {gsum('t')}",
                  "if has_bias != 0:",
                  f"    acc += {ld('b0[c]')} * {gsum(str(K2))}")
                _store(e, storage, "gs0[c]", "acc")
            e("else:")
            with e.indent():
                e("r = u - 1", "j = r // 4", "k = r - j * 4", "widx = (j * C + c) * 4 + k",
                  f"for t in range({K2}):",
                  f"    acc += {ld(f'ww[widx * {K2} + t]')} * {gsum(f'{K2 + 1} + r * {K2} + t')}")
                _store(e, storage, "gws[widx]", "acc")


def _emit_plane_pass(e: _Emitter, spec: PlaneSpec) -> None:
    """Load ``plane``, transform, convolve, synthesise and store its output."""
    e("# Input plane into source grid 0 (zero-filled upsampling by the input stride).")
    _emit_plane_load(e, spec, "src", "plane * (Hin * Win)", "Hin", "Win", spec.in_stride,
                     "src0")
    e("cuda.syncthreads()")
    _emit_analysis(e, spec)
    _emit_synthesis(e, spec)
    if spec.out_stride in (1, 2):
        _emit_output_blocks(e, spec)
    else:
        _emit_output_generic(e, spec)


def _emit_gradient_pyramid(e: _Emitter, spec: PlaneSpec) -> None:
    """``weights_only`` backward: ``dy`` into gradient grid 0 and ``x`` into region A's
    grid 0, then both raw-LL chains.

    The two planes are loaded in one loop and the two chains built in one
    loop per level: half the barriers, twice the independent work between
    them. On an H200 (K 5, fp32) this took the backward from 0.776 to 0.696
    ms at 64 x 96 x 56 x 56 and from 0.519 to 0.459 ms at 64 x 192 x 28 x
    28; 13 or 20 elements in flight instead of 8 changed nothing. float32
    planes load by 2 x 2 quads (:func:`_emit_planes_load_quads`, ``LOAD_QUADS``
    quads of each in flight): backward 0.577 -> 0.557 ms at 56 x 56, 0.377
    -> 0.366 at 28 x 28. In bfloat16 the quads took it from 0.564 to 0.587
    and from 0.421 to 0.446 ms, so 16-bit planes keep one pixel per item.
    """
    e("# dy into gradient grid 0, x into region A; then both raw-LL chains. Nothing is",
      "# convolved (dx comes from the forward kernels).",
      "xsrc0 = src0 + xshift")
    targets = [("src", "gsrc0", "gsp0", "gsph0", 0), ("xsrc", "xsrc0", "sp0", "sph0", None)]
    if spec.storage == "float32":
        _emit_planes_load_quads(e, spec, targets, "plane * (H * W)")
    else:  # 16-bit storage: the quads were slower (see the docstring)
        _emit_planes_load(e, spec, targets, "plane * (H * W)", "H", "W", 1)
    e("cuda.syncthreads()")
    _emit_ll_chains(e, spec, [("", _GRADIENT_GRIDS, 0), (" + xshift", _SOURCE_GRIDS, None)])


#: Level fields of region A's grids and of the ``weights_only`` gradient grids.
_SOURCE_GRIDS = ("src", "pitch", "phase")
_GRADIENT_GRIDS = ("gsrc", "gpitch", "gphase")


def _emit_ll_chain(e: _Emitter, spec: PlaneSpec, shift: str, grids=_SOURCE_GRIDS,
                   halo: int | None = None) -> None:
    """Grids ``1..L-1`` from grid 0: each the raw LL of the grid before.

    ``shift`` is appended to every grid offset (``" + xshift"``: region B's
    copy of region A's geometry); ``grids`` names the level fields of the
    grids' offset, pitch and phase stride, and ``halo`` their halo width
    (default ``R``).
    """
    _emit_ll_chains(e, spec, [(shift, grids, halo)])


def _emit_ll_chains(e: _Emitter, spec: PlaneSpec, pyramids: list) -> None:
    """The raw-LL chains of one or more pyramids of the same plane, one loop per level.

    ``pyramids`` holds ``(shift, grids, halo)`` per pyramid, as
    :func:`_emit_ll_chain` takes them; each level's loop forms every
    pyramid's LL values of a 2 x 2 quad of coefficients per item, then one
    barrier follows.
    """
    suffixes = ["", "_b"]
    if not 1 <= len(pyramids) <= len(suffixes):
        raise ValueError(f"one or two pyramids, got {len(pyramids)}")
    if e.geo is None:
        e("for j in range(1, L):")
        with e.indent():
            _emit_ll_level(e, spec, pyramids, "j", "j - 1")
    else:  # the table compiled in: one block per level, its fields constants
        for j in range(1, int(e.geo[HEADER["L"]])):
            e(f"# level {j}'s raw LL")
            _emit_ll_level(e, spec, pyramids, j, j - 1)


def _emit_ll_level(e: _Emitter, spec: PlaneSpec, pyramids: list, j, prev) -> None:
    """One level of :func:`_emit_ll_chains`: grid ``j`` from grid ``prev`` (ints where the
    table is compiled in, else expressions of the loop variable), then a barrier."""
    suffixes = ["", "_b"]
    for x, (shift, (fsrc, fpitch, fphase), _) in zip(suffixes, pyramids):
        e(f"srcp{x} = {_level(e, prev, fsrc)}{shift}", f"spp{x} = {_level(e, prev, fpitch)}",
          f"sph{x} = {_level(e, prev, fphase)}")
        if not x:
            e(f"Hj = {_level(e, j, 'Hj')}", f"Wj = {_level(e, j, 'Wj')}")
        e(f"srcn{x} = {_level(e, j, fsrc)}{shift}", f"spn{x} = {_level(e, j, fpitch)}",
          f"sphn{x} = {_level(e, j, fphase)}")
    # One item per 2 x 2 quad of grid j's coefficients: they land at one position
    # (my, mx) of its four phase planes, and read one 2 x 2 square of positions
    # of grid j - 1's phase planes, so the indices are formed once per quad.
    e("Mj = (Wj + 1) >> 1")
    with _DivmodLoop(e, "it", "tid", "((Hj + 1) >> 1) * Mj", spec.threads, "Mj", "my", "mx"):
        for x, (_, _, halo) in zip(suffixes, pyramids):
            R = (spec.kernel_size - 1) // 2 if halo is None else halo
            e(f"pq{x} = sb + srcp{x} + (2 * my + {R}) * spp{x} + 2 * mx + {R}",
              f"tq{x} = sb + srcn{x} + (my + {R}) * spn{x} + mx + {R}")
        # every value of the quad before its first store (a store may alias them)
        checks = (("2 * my + 1 < Hj", 1, 0), ("2 * mx + 1 < Wj", 0, 1))
        quads = [(a, b, " and ".join(c for c, ra, cb in checks if (ra and a) or (cb and b)))
                 for a in (0, 1) for b in (0, 1)]
        for a, b, inside in quads:
            for x in suffixes[:len(pyramids)]:
                p = f"pq{x}" + (f" + spp{x}" if a else "") + (" + 1" if b else "")
                value = (f"f05 * ((S[{p}] + S[{p} + sph{x}]) + "
                         f"(S[{p} + 2 * sph{x}] + S[{p} + 3 * sph{x}]))")
                e(f"ll{x}_{a}{b} = {value}" + (f" if {inside} else fz" if inside else ""))
        for a, b, inside in quads:
            if inside:
                e(f"if {inside}:")
            with e.indent() if inside else nullcontext():
                e(*(f"S[tq{x} + {2 * a + b} * sphn{x}] = ll{x}_{a}{b}"
                    for x in suffixes[:len(pyramids)]))
    e("cuda.syncthreads()")


def _emit_plane_load(e: _Emitter, spec: PlaneSpec, array: str, base: str, rows: str,
                     cols: str, stride: int, grid: str, pitch: str = "sp0",
                     phase: str = "sph0", halo: int | None = None) -> None:
    """Copy a plane from global memory into a polyphase grid.

    The grid starts at ``grid``, with row pitch ``pitch``, phase stride
    ``phase`` and a halo of ``halo`` (default ``R``) coefficients. Each thread
    issues ``LOAD_UNROLL`` independent loads before its first store, so one
    memory latency covers several elements.
    """
    _emit_planes_load(e, spec, [(array, grid, pitch, phase, halo)], base, rows, cols, stride)


def _emit_planes_load(e: _Emitter, spec: PlaneSpec, targets: list, base: str, rows: str,
                      cols: str, stride: int) -> None:
    """Copy planes of the same size from global memory into polyphase grids.

    ``targets`` holds ``(array, grid, pitch, phase, halo)`` per plane, as
    :func:`_emit_plane_load` takes them; every array is read at ``base``.
    Each thread issues ``LOAD_UNROLL`` loads of every plane before its first
    store.
    """
    T, U = spec.threads, LOAD_UNROLL
    names = ["v", "xv"]  # (not "w": w0 is a kernel parameter)
    if not 1 <= len(targets) <= len(names):
        raise ValueError(f"one or two planes, got {len(targets)}")
    e(f"gbase = {base}", f"count = {rows} * {cols}", f"ncols = {cols}",
      "# (iy, ix) of element i, stepped by T (see _DivmodLoop)")
    _DivmodLoop.setup(e, "tid", T, "ncols", "iy", "ix")
    e(f"for i0 in range(tid, count, {T * U}):")
    with e.indent():
        for name, (array, *_) in zip(names, targets):
            for u in range(U):
                e(f"{name}{u} = " + _guarded_load(spec.storage, f"{array}[gbase + i0 + {u * T}]",
                                                  f"i0 + {u * T} < count"))
        for u in range(U):
            e(f"if i0 + {u * T} < count:")
            with e.indent():
                for name, (_, grid, pitch, phase, halo) in zip(names, targets):
                    R = (spec.kernel_size - 1) // 2 if halo is None else halo
                    index = _phase_index(grid, pitch, phase, f"iy * {stride}", f"ix * {stride}", R)
                    e(f"S[sb + {index}] = {_load(spec.storage, f'{name}{u}')}")
            _DivmodLoop.advance(e, "ncols", "iy", "ix")


#: 2 x 2 quads of each plane a thread loads before its first store
#: (:func:`_emit_planes_load_quads`): as many elements as ``LOAD_UNROLL``.
LOAD_QUADS = LOAD_UNROLL // 4


def _emit_planes_load_quads(e: _Emitter, spec: PlaneSpec, targets: list, base: str) -> None:
    """Copy ``H x W`` planes into polyphase grids, one 2 x 2 quad of pixels per item.

    What :func:`_emit_planes_load` does at stride 1, with the indices formed
    once per quad instead of once per pixel: pixel ``(2 my + a, 2 mx + b)``
    goes to phase plane ``2 a + b`` at position ``(my, mx)``, so a quad's four
    pixels share one grid index and one row address. ``targets`` as
    :func:`_emit_planes_load` takes them. Each thread issues the loads of
    ``LOAD_QUADS`` quads of every plane before its first store.
    """
    T, U = spec.threads, LOAD_QUADS
    names = ["v", "xv"]
    if not 1 <= len(targets) <= len(names):
        raise ValueError(f"one or two planes, got {len(targets)}")
    e(f"gbase = {base}", "Mq = (W + 1) >> 1", "nq = ((H + 1) >> 1) * Mq",
      "# (my, mx) of quad i, stepped by T (see _DivmodLoop)")
    _DivmodLoop.setup(e, "tid", T, "Mq", "my", "mx")
    e(f"for q0 in range(tid, nq, {T * U}):")
    with e.indent():
        for u in range(U):
            # the quad's second row and column, where the plane has them
            e(f"qy{u}, qx{u} = my, mx", f"ok{u} = q0 + {u * T} < nq",
              f"rw{u} = 2 * my + 1 < H", f"cl{u} = 2 * mx + 1 < W",
              f"gq{u} = gbase + 2 * my * W + 2 * mx")
            pixels = [(0, 0, f"ok{u}"), (0, 1, f"ok{u} and cl{u}"), (1, 0, f"ok{u} and rw{u}"),
                      (1, 1, f"ok{u} and rw{u} and cl{u}")]
            for name, (array, *_) in zip(names, targets):
                for a, b, cond in pixels:
                    at = f"gq{u}" + (" + W" if a else "") + (" + 1" if b else "")
                    e(f"{name}{u}_{a}{b} = "
                      + _guarded_load(spec.storage, f"{array}[{at}]", cond))
            _DivmodLoop.advance(e, "Mq", "my", "mx")
        for u in range(U):
            e(f"if ok{u}:")
            with e.indent():
                for name, (_, grid, pitch, phase, halo) in zip(names, targets):
                    R = (spec.kernel_size - 1) // 2 if halo is None else halo
                    v = {ab: _load(spec.storage, f"{name}{u}_{ab}")
                         for ab in ("00", "01", "10", "11")}
                    e(f"tq = sb + {grid} + (qy{u} + {R}) * {pitch} + qx{u} + {R}",
                      f"S[tq] = {v['00']}",
                      f"if cl{u}:", f"    S[tq + {phase}] = {v['01']}",
                      f"if rw{u}:", f"    S[tq + 2 * {phase}] = {v['10']}",
                      f"if rw{u} and cl{u}:", f"    S[tq + 3 * {phase}] = {v['11']}")


def _emit_fold_weights(e: _Emitter, spec: PlaneSpec, tap_columns: int = 0,
                       base_pitch: int = 0, array: str = "S") -> None:
    """Scales (and the Haar 1/2) folded into the channel's taps, in ``array[sb:]`` (``S``).

    Layout (see :func:`wtconv_cuda.kernels.layout.weight_region`): ``K*K``
    base taps, then ``4*K*K`` taps per level (subband-major), then the bias.
    Every loop runs over one structured range, so no index is divided; the
    four subbands' loads of a level are issued together. With ``tap_columns``
    (a multiple of 4, at least ``K * base_pitch``) and ``base_pitch`` (at least
    ``K``) every tap is ordered by tap column (tiles whose levels run top
    down, :func:`wtconv_cuda.kernels.tiles._tap_columns`): base tap ``(dy,
    dx)`` at ``dx * base_pitch + dy``, and the level taps from ``tap_columns``
    on, each level's as ``(dx, k, dy)``.
    """
    K, T = spec.kernel_size, spec.threads
    K2 = K * K
    ld = lambda x: _load(spec.storage, x)  # noqa: E731
    tap = f"{K2 - 1} - t" if spec.backward else "t"  # dx uses the flipped kernels
    base = f"scale * {ld(f'w0[c * {K2} + {tap}]')}"
    e(f"scale = {ld('s0[c]')}", f"for t in range(tid, {K2}, {T}):")
    if base_pitch:  # t = dy K + dx goes to dx base_pitch + dy
        e(f"    ty = t // {K}", f"    {array}[sb + (t - ty * {K}) * {base_pitch} + ty] = {base}")
    else:
        e(f"    {array}[sb + t] = {base}")
    e("for j in range(L):")
    with e.indent():
        e("wq = (j * C + c) * 4")
        for k in range(4):
            e(f"ws{k} = {ld(f'ws[wq + {k}]')}")
        e(f"for t in range(tid, {K2}, {T}):")
        with e.indent():
            for k in range(4):
                e(f"v{k} = f05 * (ws{k} * {ld(f'ww[(wq + {k}) * {K2} + {tap}]')})")
            if tap_columns:  # t = dy K + dx goes to dx 4K + k K + dy
                e(f"ty = t // {K}",
                  f"tc = {tap_columns} + j * {4 * K2} + (t - ty * {K}) * {4 * K} + ty")
                for k in range(4):
                    e(f"{array}[sb + tc + {k * K}] = v{k}")
            else:
                for k in range(4):
                    e(f"{array}[sb + {K2} + j * {4 * K2} + {k * K2} + t] = v{k}")
    bias = f"{tap_columns} + {4 * K2} * L" if tap_columns else f"{K2} + {4 * K2} * L"
    e("if tid == 0:")
    with e.indent():
        if spec.backward:  # dx has no bias
            e(f"{array}[sb + {bias}] = fz")
        else:
            e(f"{array}[sb + {bias}] = scale * {ld('b0[c]')} if has_bias != 0 else fz")


def _strip_item_cost(K: int, Q: int) -> int:
    """Rough instruction count of one strip item of the analysis (see :func:`_emit_analysis`):
    per tap column, 4K tap loads, Q+K-1 butterflies (4 loads, 8 adds) and 4QK FMAs."""
    return K * (4 * K + 12 * (Q + K - 1) + 4 * Q * K)


def _single_item_cost(K: int) -> int:
    """Rough instruction count of one single item: per tap, 1 tap and 4 value loads, 3 sign
    combinations and 1 FMA."""
    return 9 * K * K


def single_items_win(hj: int, wj: int, kernel_size: int, strip: int, threads: int) -> bool:
    """Whether level grid ``hj x wj`` is analysed with single items (else strips).

    The host-side mirror of the run-time choice in :func:`_emit_analysis`,
    for tests and notes.

    Parameters
    ----------
    hj, wj : int
        Coefficient grid of the level.
    kernel_size, strip, threads : int
        ``K``, ``Q`` and ``T`` of the kernel variant.

    Returns
    -------
    bool
        ``True`` when rounds of single items take fewer serial instructions.
    """
    strip_rounds = -(-(-(-hj // strip) * wj) // threads)
    single_rounds = -(-(4 * hj * wj) // threads)
    return (single_rounds * _single_item_cost(kernel_size)
            < strip_rounds * _strip_item_cost(kernel_size, strip))


def _emit_analysis(e: _Emitter, spec: PlaneSpec) -> None:
    """Levels 1..L: Haar analysis fused into each subband's KxK convolution.

    Two work decompositions, picked per level at run time by which finishes
    in fewer serial instructions (rounds of ``T`` items times the cost of one):

    strip items
        A thread owns ``Q`` consecutive coefficient rows of one column, all
        four subbands; the lanes of a warp own neighbouring columns. It walks
        the ``K`` tap columns; for each, the ``Q+K-1`` source blocks of that
        column are loaded once and feed every (output row, tap row) pair
        they belong to. Least work per coefficient: for the fine levels.
    single items
        A thread owns one coefficient of one subband (``4 Hj Wj`` items).
        More work in all, but up to ``4 Q`` times more threads and a chain
        a quarter as long: for the coarse levels, where strip items would
        leave most threads idle. The sums are formed in the same order, so
        both give the same bits.
    """
    K, Q, T = spec.kernel_size, spec.strip, spec.threads
    K2 = K * K
    e("for j in range(1, L + 1):")
    with e.indent():
        e(f"srcp = {_lvl('j - 1', 'src')}", f"spp = {_lvl('j - 1', 'pitch')}",
          f"sph = {_lvl('j - 1', 'phase')}",
          f"Hj = {_lvl('j', 'Hj')}", f"Wj = {_lvl('j', 'Wj')}", f"zo = {_lvl('j', 'z')}",
          f"srcn = {_lvl('j', 'src')}", f"spn = {_lvl('j', 'pitch')}",
          f"sphn = {_lvl('j', 'phase')}",
          "HWj = Hj * Wj",
          f"wb = sb + {K2} + (j - 1) * {4 * K2}",
          f"nrb = (Hj + {Q - 1}) // {Q}",
          f"strip_rounds = (nrb * Wj + {T - 1}) // {T}",
          f"single_rounds = (4 * HWj + {T - 1}) // {T}",
          f"if single_rounds * {_single_item_cost(K)} < strip_rounds * {_strip_item_cost(K, Q)}:")
        with e.indent():
            _emit_analysis_single(e, spec)
        e("else:")
        with e.indent():
            _emit_analysis_strips(e, spec)
        e("cuda.syncthreads()")


def _emit_analysis_single(e: _Emitter, spec: PlaneSpec) -> None:
    """One (subband, coefficient) per work item; see :func:`_emit_analysis`."""
    K, T = spec.kernel_size, spec.threads
    R, K2 = (K - 1) // 2, K * K
    e("# four neighbouring lanes share a coefficient (its values are broadcast), one",
      "# subband each; coefficients step by T/4",
      "k = tid & 3",
      "# subband k of the butterfly (a, b, c, d): (a + s1 b) + s2 (c + s1 d)",
      "s1 = float32(1 - 2 * (k >> 1))", "s2 = float32(1 - 2 * (k & 1))",
      f"wk = wb + k * {K2}",
      f"qstop = HWj if tid < {4 * (T // 4)} else int64(0)")
    with _DivmodLoop(e, "q", "tid >> 2", "qstop", T // 4, "Wj", "qy", "qx"):
        e("base = sb + srcp + qy * spp + qx", "acc = fz")
        band = "(S[p] + s1 * S[p + sph]) + s2 * (S[p + 2 * sph] + s1 * S[p + 3 * sph])"
        e("# a loop over the tap columns (not unrolled): all K*K taps in flight at once",
          "# would take ~230 registers",
          f"for dx in range({K}):")
        with e.indent():
            for dy in range(K):
                e(f"p = base + {dy} * spp + dx", f"acc += S[wk + {dy * K} + dx] * ({band})")
        e("S[sb + zo + k * HWj + q] = acc",
          "if k == 0 and j < L:")
        with e.indent():
            e(f"p = base + {R} * spp + {R}",
              "ll = f05 * ((S[p] + S[p + sph]) + (S[p + 2 * sph] + S[p + 3 * sph]))",
              f"S[sb + {_phase_index('srcn', 'spn', 'sphn', 'qy', 'qx', R)}] = ll")


def _emit_analysis_strips(e: _Emitter, spec: PlaneSpec) -> None:
    """``Q`` rows of one column, four subbands, per work item; see :func:`_emit_analysis`."""
    K, Q, T = spec.kernel_size, spec.strip, spec.threads
    R, K2 = (K - 1) // 2, K * K
    with _DivmodLoop(e, "it", "tid", "nrb * Wj", T, "Wj", "rb", "qx"):
        e(f"qy0 = rb * {Q}", "base = sb + srcp + qy0 * spp + qx")
        for k in range(4):
            e(", ".join(f"acc{k}_{i}" for i in range(Q)) + " = "
              + ", ".join("fz" for _ in range(Q)))
        e(f"for dx in range({K}):")
        with e.indent():
            e("wr = wb + dx", "col = base + dx")
            for k in range(4):
                for dy in range(K):
                    e(f"w{k}_{dy} = S[wr + {k * K2 + dy * K}]")
            for r in range(Q + K - 1):
                _butterfly(e, "u", "", f"col + {r} * spp", "sph")
                for i in range(Q):
                    dy = r - i
                    if 0 <= dy < K:
                        for k in range(4):
                            e(f"acc{k}_{i} += w{k}_{dy} * u{k}_")
        e(f"centre = base + {R} * spp + {R}")
        for i in range(Q):
            e(f"qy = qy0 + {i}", "if qy < Hj:")
            with e.indent():
                e("zq = sb + zo + qy * Wj + qx")
                for k in range(4):
                    e(f"S[zq + {k} * HWj] = acc{k}_{i}")
                e("if j < L:")
                with e.indent():
                    e(f"p = centre + {i} * spp",
                      "ll = f05 * ((S[p] + S[p + sph]) + (S[p + 2 * sph] + S[p + 3 * sph]))",
                      f"S[sb + {_phase_index('srcn', 'spn', 'sphn', 'qy', 'qx', R)}] = ll")


def _emit_synthesis(e: _Emitter, spec: PlaneSpec) -> None:
    """Levels L..2: add each level's synthesis into the LL band one level finer."""
    T = spec.threads
    e("for j in range(L, 1, -1):")
    with e.indent():
        e(f"Hj = {_lvl('j', 'Hj')}", f"Wj = {_lvl('j', 'Wj')}", f"zo = {_lvl('j', 'z')}",
          f"Hp = {_lvl('j - 1', 'Hj')}", f"Wp = {_lvl('j - 1', 'Wj')}",
          f"zp = {_lvl('j - 1', 'z')}",
          "HWj = Hj * Wj")
        with _DivmodLoop(e, "it", "tid", "HWj", T, "Wj", "qy", "qx"):
            e("z = sb + zo + it",
              "_s = S[z] + S[z + HWj]", "_m = S[z] - S[z + HWj]",
              "_t = S[z + 2 * HWj] + S[z + 3 * HWj]", "_n = S[z + 2 * HWj] - S[z + 3 * HWj]",
              "t = sb + zp + 2 * qy * Wp + 2 * qx",
              "S[t] += f05 * (_s + _t)",
              "if 2 * qx + 1 < Wp:",
              "    S[t + 1] += f05 * (_s - _t)",
              "if 2 * qy + 1 < Hp:",
              "    S[t + Wp] += f05 * (_m + _n)",
              "    if 2 * qx + 1 < Wp:",
              "        S[t + Wp + 1] += f05 * (_m - _n)")
        e("cuda.syncthreads()")


def _emit_level1_synthesis(e: _Emitter, zq: str) -> None:
    """``r{ey}{ex}``: level-1 synthesis of the 2x2 output block of coefficient ``zq``."""
    e(f"_s = S[{zq}] + S[{zq} + HW1]", f"_m = S[{zq}] - S[{zq} + HW1]",
      f"_t = S[{zq} + 2 * HW1] + S[{zq} + 3 * HW1]",
      f"_n = S[{zq} + 2 * HW1] - S[{zq} + 3 * HW1]",
      "r00 = f05 * (_s + _t)", "r01 = f05 * (_s - _t)",
      "r10 = f05 * (_m + _n)", "r11 = f05 * (_m - _n)")


def _emit_output_blocks(e: _Emitter, spec: PlaneSpec) -> None:
    """Outputs for stride 1 (2x2 blocks) or 2 (top-left of each block).

    A thread owns ``Q`` level-1 coefficient rows of one column, i.e. the
    ``2Q x 2`` output pixels they cover: the base convolution walks the input
    columns of that window, each feeding both output columns except the two
    outermost ones (peeled), which feed one; no tap is ever multiplied by a
    pixel outside its window, so a NaN cannot leak. The level-1 synthesis
    adds the coarse levels.
    """
    K, Q, T, SO = spec.kernel_size, spec.strip, spec.threads, spec.out_stride
    R = (K - 1) // 2
    parities = (0, 1) if SO == 1 else (0,)
    rows = [2 * i + ey for i in range(Q) for ey in parities]  # output rows, rel. to 2*qy0
    t_lo, t_hi = min(rows) - R, max(rows) + R
    e(f"bias = S[sb + {bias_index(K, 0)} + {4 * K * K} * L]",
      "H1 = (H + 1) // 2", "W1 = (W + 1) // 2",
      f"z1 = {_lvl(1, 'z')} if L > 0 else int64(0)",
      "HW1 = H1 * W1",
      "obase = plane * (Hout * Wout)",
      f"nrb = (H1 + {Q - 1}) // {Q}")
    with _DivmodLoop(e, "it", "tid", "nrb * W1", T, "W1", "rb", "qx"):
        e(f"qy0 = rb * {Q}",
          f"rowbase = sb + src0 + (qy0 + {R}) * sp0")
        e(", ".join(f"acc{o}_{ex}" for o in rows for ex in parities) + " = "
          + ", ".join("fz" for _ in rows for _ in parities))

        def column(u: str, used) -> None:
            # Input column 2*qx + u feeds output column 2*qx + ex through tap
            # column u - ex + R; only the parities in `used` have that tap.
            e(f"colbase = rowbase + (({u}) & 1) * sph0 + qx + (({u}) >> 1) + {R}",
              f"wu = sb + ({u}) + {R}")
            for ex in used:
                for dy in range(K):
                    e(f"w{ex}_{dy} = S[wu + {dy * K - ex}]")
            for t in range(t_lo, t_hi + 1):
                e(f"v = S[colbase + {(t & 1) * 2} * sph0 + {t >> 1} * sp0]")
                for o in rows:
                    dy = t - o + R
                    if 0 <= dy < K:
                        for ex in used:
                            e(f"acc{o}_{ex} += w{ex}_{dy} * v")

        if SO == 1:
            # The outermost columns feed one output column only. Peeling them
            # keeps a NaN/Inf just outside one column's window out of the other
            # (a zero tap times NaN is NaN).
            column(f"{-R}", (0,))
            e(f"for u in range({-R + 1}, {R + 1}):")
            with e.indent():
                column("u", parities)
            column(f"{R + 1}", (1,))
        else:
            e(f"for u in range({-R}, {R + 1}):")
            with e.indent():
                column("u", parities)
        for i in range(Q):
            e(f"qy = qy0 + {i}", "if qy < H1:")
            with e.indent():
                e("r00 = r01 = r10 = r11 = fz", "if L > 0:")
                with e.indent():
                    _emit_level1_synthesis(e, "sb + z1 + qy * W1 + qx")
                if SO == 2:  # the top-left pixel of each block
                    e("if valid:")
                    with e.indent():
                        _store(e, spec.storage, "out[obase + qy * Wout + qx]",
                               f"acc{2 * i}_0 + bias + r00")
                    continue
                for ey in parities:
                    for ex in parities:
                        e(f"if valid and 2 * qy + {ey} < H and 2 * qx + {ex} < W:")
                        with e.indent():
                            _store(e, spec.storage,
                                   f"out[obase + (2 * qy + {ey}) * Wout + 2 * qx + {ex}]",
                                   f"acc{2 * i + ey}_{ex} + bias + r{ey}{ex}")
    e("cuda.syncthreads()")


def _emit_output_generic(e: _Emitter, spec: PlaneSpec) -> None:
    """Outputs for strides other than 1 and 2: one pixel per work item."""
    K, T, SO = spec.kernel_size, spec.threads, spec.out_stride
    R = (K - 1) // 2
    e(f"bias = S[sb + {bias_index(K, 0)} + {4 * K * K} * L]",
      "H1 = (H + 1) // 2", "W1 = (W + 1) // 2",
      f"z1 = {_lvl(1, 'z')} if L > 0 else int64(0)",
      "HW1 = H1 * W1",
      "obase = plane * (Hout * Wout)")
    with _DivmodLoop(e, "it", "tid", "Hout * Wout", T, "Wout", "oy", "ox"):
        e(f"py = oy * {SO}", f"px = ox * {SO}",
          "acc = fz",
          f"for dy in range({K}):")
        with e.indent():
            e(f"fy = py + dy - {R}")
            for dx in range(K):
                idx = _phase_index("src0", "sp0", "sph0", "fy", f"px + {dx - R}", R)
                e(f"acc += S[sb + dy * {K} + {dx}] * S[sb + {idx}]")
        e("v = acc + bias", "if L > 0:")
        with e.indent():
            _emit_level1_synthesis(e, "sb + z1 + (py >> 1) * W1 + (px >> 1)")
            e("if (py & 1) == 0:",
              "    v += r00 if (px & 1) == 0 else r01",
              "else:",
              "    v += r10 if (px & 1) == 0 else r11")
        e("if valid:")
        with e.indent():
            _store(e, spec.storage, "out[obase + it]", "v")
    e("cuda.syncthreads()")


def _emit_weight_gradients(e: _Emitter, spec: PlaneSpec) -> None:
    """Backward only: correlate the x pyramid with the dy pyramid of one plane.

    Work item = (tap row ``dy``, chunk of rows); each walks its rows with a
    sliding window of source values in registers, so every loaded value feeds
    ``K`` taps. Partial sums of the chunks are then added in a fixed order,
    and the plane's total is added to the unit sums (each entry always by the
    same thread, so no barrier is needed between planes). The level taps run
    in the phases of :func:`~wtconv_cuda.kernels.layout.level_tap_plan`: the
    levels of a phase share one list of items (one per thread, chunks from
    the ``geo`` table), then one barrier and one reduction, where running the
    levels one by one left most threads idle on the coarse levels.
    """
    K, T = spec.kernel_size, spec.threads
    R, K2 = (K - 1) // 2, K * K
    chunks_cap = max(1, T // K)
    # The dy pyramid: region A in the one-kernel backward, the halo-less
    # gradient grids in the weights_only one.
    if spec.weights_only:
        g0, gp0, gph0, GR = "gsrc0", "gsp0", "gsph0", 0
    else:
        g0, gp0, gph0, GR = "src0", "sp0", "sph0", R
    e("# ---- weight gradients: the correlations ----" if spec.weights_only else
      "# ---- weight gradients: the x pyramid, then correlations ----")
    if not spec.weights_only:  # (the weights_only kernel loaded x with dy)
        # the plane pass wrote its subbands over region B
        e(f"for i in range(tid, a_len, {T}):",
          "    S[sb + xb_off + i] = fz",
          "cuda.syncthreads()")
        e("xsrc0 = src0 + xshift")
        _emit_plane_load(e, spec, "xsrc", "plane * (H * W)", "H", "W", 1, "xsrc0")
        e("cuda.syncthreads()")
        _emit_ll_chain(e, spec, " + xshift")

    # One work item per thread where K <= T (then there are at most T items);
    # with more tap rows than threads, threads take items in turn (one chunk
    # per tap row).
    item = "tid" if K <= T else "item"

    def items(count: str) -> str:
        return f"if tid < {count}:" if K <= T else f"for item in range(tid, {count}, {T}):"

    # Base taps: pixels are walked in column pairs (2m, 2m+1); the window holds
    # the K+1 x values at columns 2m + e, e = -R..R+1 (register n = e + R).
    e(f"P = max(int64(1), min(H, int64({chunks_cap})))",
      f"nit = {K} * P",
      items("nit"))
    with e.indent():
        e(f"dy = {item} // P", f"ch = {item} - dy * P", "gsum = fz",
          ", ".join(f"acc_{dx}" for dx in range(K)) + " = " + ", ".join("fz" for _ in range(K)),
          "py = ch", "while py < H:")
        with e.indent():
            e(f"fy = py + dy - {R}",
              f"grow = sb + {g0} + (py & 1) * 2 * {gph0} + ((py >> 1) + {GR}) * {gp0} + {GR}",
              f"xrow = sb + xsrc0 + (fy & 1) * 2 * sph0 + ((fy >> 1) + {R}) * sp0 + {R}")

            def odd_column(win) -> None:
                e("# odd W: the last pair has no column W; x there must not meet its zero",
                  "if (W & 1) != 0:")
                with e.indent():
                    e("m = W >> 1")
                    ev = K - 1 - R
                    e(f"{win(K - 1)} = S[xrow + {ev & 1} * sph0 + m + {ev >> 1}]",
                      "g0 = S[grow + m]", "gsum += g0")
                    for dx in range(K):
                        e(f"acc_{dx} += {win(dx)} * g0")

            _emit_pair_window(e, K, lambda ev, m: f"xrow + {ev & 1} * sph0 + {m}{ev >> 1}",
                              lambda h, r: f"grow + {gph0 + ' + ' if h else ''}m + {r}", "W >> 1",
                              after=odd_column)
            e("py += P")
        for dx in range(K):
            e(f"S[sb + p_off + {item} * {K} + {dx}] = acc_{dx}")
        e("if dy == 0:", f"    S[sb + p_off + nit * {K} + ch] = gsum")
    e("cuda.syncthreads()",
      f"for t in range(tid, {K2 + 1}, {T}):")
    with e.indent():
        e("tot = fz", f"if t < {K2}:")
        with e.indent():
            e(f"dy = t // {K}", f"dx = t - dy * {K}")
            _emit_chunk_sum(e, "tot", f"sb + p_off + dy * P * {K} + dx", K)
        e("else:")
        with e.indent():
            _emit_chunk_sum(e, "tot", f"sb + p_off + nit * {K}", 1)
        e("if valid:",
          "    S[sb + w_off + t] += tot")
    e("cuda.syncthreads()")

    e("# level taps: item = (level j, tap row dy, row chunk of coefficients), all 4",
      "# subbands; the levels of a phase share one list, one item per thread")
    if e.geo is None:
        e("j0 = int64(1)", "while j0 <= L:")
        with e.indent():
            e(f"j1 = {_lvl('j0', 'phase_last')}")
            _emit_level_tap_phase(e, spec, "j0", "j1", item, items)
            e("j0 = j1 + 1")
    else:  # the table compiled in: one block per phase, its bounds constants
        levels, j0 = int(e.geo[HEADER["L"]]), 1
        while j0 <= levels:
            j1 = int(_level(e, j0, "phase_last"))
            e(f"# levels {j0}..{j1}")
            _emit_level_tap_phase(e, spec, j0, j1, item, items)
            j0 = j1 + 1


def _emit_level_tap_phase(e: _Emitter, spec: PlaneSpec, j0, j1, item: str, items) -> None:
    """One phase of the level taps (levels ``j0..j1``): its items, a barrier, the
    reduction of its partials, a barrier.

    ``j0`` and ``j1`` are names of the loop's variables, or ints where the
    variant compiles the level table in; then the phase's bounds are
    constants, and so is every field of a one-level phase but ``Hj`` and
    ``Wj`` (constant sizes let LLVM unroll the windows: ptxas then spilled
    212 B at 14 x 14).
    """
    K = spec.kernel_size
    R, K2, T = (K - 1) // 2, K * K, spec.threads
    const = isinstance(j0, int)
    single = const and j0 == j1  # the phase's level is known

    def at(field: str, previous: bool = False) -> str:  # a field of level j (or j - 1)
        if single:
            return _level(e, j0 - previous, field)
        return _lvl("j - 1" if previous else "j", field)

    if const:
        count = int(_level(e, j1, "item0")) + K * int(_level(e, j1, "chunks"))
        e(items(str(count)))
    else:
        e(items(f"{_lvl('j1', 'item0')} + {K} * {_lvl('j1', 'chunks')}"))
    with e.indent():
        if const:  # the item's level: the last whose first item it reaches
            e(f"j = int64({j0})")
            for jj in range(j0 + 1, j1 + 1):
                e(f"if {item} >= {_level(e, jj, 'item0')}:", f"    j = int64({jj})")
        else:
            e("j = j0",
              f"while j < j1 and {item} >= {_lvl('j + 1', 'item0')}:",
              "    j += 1")
        e(f"srcp = {at('src', True)}", f"spp = {at('pitch', True)}",
          f"sph = {at('phase', True)}",
          f"Hj = {_lvl('j', 'Hj')}", f"Wj = {_lvl('j', 'Wj')}",
          f"P = {at('chunks')}",
          f"u = {item} - {at('item0')}",
          "dy = u // P", "ch = u - dy * P")
        _emit_level_accumulators(e, K)
        e("qy = ch", "while qy < Hj:")
        with e.indent():
            if spec.weights_only:
                e(f"gp = sb + {at('gsrc', True)} + qy * {at('gpitch', True)}",
                  f"gph = {at('gphase', True)}")
            else:
                e(f"gp = sb + srcp + (qy + {R}) * spp + {R}")
            e("xp = sb + srcp + xshift + (qy + dy) * spp")
            _emit_block_window(e, K, "xp", "gp", "Wj", "sph",
                               gphase="gph" if spec.weights_only else None)
            e("qy += P")
        _emit_level_item_sums(e, K, "sb + p_off", item)
    rows = f"{(j1 - j0 + 1) * 4 * K}" if const else f"(j1 - j0 + 1) * {4 * K}"
    e("cuda.syncthreads()",
      "# one tap row (level j, subband k, tap row dy) per thread: its K sums",
      "# side by side, each over the chunks in order",
      f"for ru in range(tid, {rows}, {T}):")
    with e.indent():
        e(f"j = {j0} + ru // {4 * K}", f"rr = ru - (j - {j0}) * {4 * K}",
          f"k = rr // {K}", f"dy = rr - k * {K}",
          f"P = {at('chunks')}")
        _emit_row_chunk_sums(e, K, f"sb + p_off + (({at('item0')} + dy * P) * 4 + k)"
                             f" * {K}", 4 * K)
        e("if valid:")
        with e.indent():
            e(f"ro = sb + w_off + {K2 + 1} + (j - 1) * {4 * K2} + rr * {K}")
            e(*(f"S[ro + {dx}] += rt_{dx}" for dx in range(K)))
    e("cuda.syncthreads()")


#: Loads in flight in the backward kernels' chunk sums (:func:`_emit_ordered_sum`).
CHUNK_SUM_GROUP = 4


def _emit_chunk_sum(e: _Emitter, total: str, first: str, stride: int) -> None:
    """Add the ``P`` chunk partials ``S[first + ch * stride]`` into ``total``, ``ch`` in order."""
    _emit_ordered_sum(e, total, "S", first, stride, "P", CHUNK_SUM_GROUP)


#: Chunks whose partials the level-tap reductions load at once (``K`` each).
ROW_SUM_GROUP = 2


def _emit_row_chunk_sums(e: _Emitter, K: int, first: str, stride: int) -> None:
    """``rt_dx`` = the ``P`` chunk partials ``S[first + ch * stride + dx]``, ``ch`` in order.

    The ``K`` sums of one tap row side by side (``dx = 0..K-1``): each adds
    its chunks in the order of :func:`_emit_chunk_sum` (so the bits are those
    of ``K`` separate chunk sums), but the ``K`` chains overlap and the loads
    of ``ROW_SUM_GROUP`` chunks go out together.
    """
    G = ROW_SUM_GROUP
    e(", ".join(f"rt_{dx}" for dx in range(K)) + " = " + ", ".join("fz" for _ in range(K)),
      f"rat = {first}", "rdone = 0", f"while rdone + {G} <= P:")
    with e.indent():
        for g in range(G):
            e(", ".join(f"rv{g}_{dx}" for dx in range(K)) + " = "
              + ", ".join(f"S[rat + {g * stride + dx}]" for dx in range(K)))
        for dx in range(K):
            e(*(f"rt_{dx} += rv{g}_{dx}" for g in range(G)))
        e(f"rat += {G * stride}", f"rdone += {G}")
    e("while rdone < P:")
    with e.indent():
        e(*(f"rt_{dx} += S[rat + {dx}]" for dx in range(K)))
        e(f"rat += {stride}", "rdone += 1")


def _emit_ordered_sum(e: _Emitter, total: str, array: str, first: str, stride, count: str,
                      group: int) -> None:
    """Add ``array[first + i * stride]`` for ``i < count`` into ``total``, ``i`` in order.

    The same sum, bit for bit, as a plain loop, but the loads go out
    ``group`` at a time (a plain loop waits out each load's latency before
    its add) and the index steps instead of being recomputed. ``stride`` is
    an int (offsets folded into the text) or an expression. The loops count
    up: counting ``left`` down instead, ptxas kept more registers (finalize:
    80 against 64) and spilled more in the capped backward kernels.
    """
    def offset(n: int) -> str:
        return str(n * stride) if isinstance(stride, int) else f"{n} * {stride}"

    e(f"at = {first}", "done = 0", f"while done + {group} <= {count}:")
    with e.indent():
        e(", ".join(f"v{g}" for g in range(group)) + " = "
          + ", ".join(f"{array}[at + {offset(g)}]" for g in range(group)))
        e(*(f"{total} += v{g}" for g in range(group)))
        e(f"at += {offset(group)}", f"done += {group}")
    e(f"while done < {count}:")
    with e.indent():
        e(f"{total} += {array}[at]", f"at += {stride}", "done += 1")


def _emit_level_accumulators(e: _Emitter, K: int) -> None:
    """Zero ``acc{k}_{dx}``: one level-tap row's sums, four subbands by ``K`` tap columns."""
    for k in range(4):
        e(", ".join(f"acc{k}_{dx}" for dx in range(K)) + " = " + ", ".join("fz" for _ in range(K)))


def _emit_level_item_sums(e: _Emitter, K: int, base: str, item: str = "tid") -> None:
    """Store a work item's ``acc{k}_{dx}`` at ``S[base + (item * 4 + k) * K + dx]``."""
    for k in range(4):
        for dx in range(K):
            e(f"S[{base} + ({item} * 4 + {k}) * {K} + {dx}] = acc{k}_{dx}")


def _emit_pair_window(e: _Emitter, K: int, x_at, g_at, pairs: str, after=None) -> None:
    """Base-tap correlations along one row, in column pairs ``(2m, 2m + 1)``.

    The window holds the ``K + 1`` values of ``x`` at columns ``2m + n - R``
    (``n = 0..K``), column ``c`` (counted from the row's first window) in
    register ``win_{c % (K + 1)}``; the loop over ``m`` is unrolled
    ``(K + 1) / 2`` times, so the window turns by renaming, not by moves.
    ``x_at(ev, m)`` is the shared index of ``x`` at column ``2m + ev`` (``m``
    is ``""`` for ``m = 0`` or ``"m + "``, the loop variable), ``g_at(h, r)``
    that of the row's gradient at column ``2 (m + r) + h``. Adds into
    ``acc_0..acc_{K-1}`` (tap columns) and ``gsum``, pair by pair; every loaded
    ``x`` feeds ``K`` taps. ``after(win)``, if given, is emitted where the
    row's pairs end, with ``win(n)`` the register holding column
    ``2 * pairs + n - R``. Shared by the plane and tile kernels' weight
    gradients.
    """
    R, N = (K - 1) // 2, K + 1
    period = N // 2

    def window(r: int):
        return lambda n: f"win_{(2 * r + n) % N}"

    def step(r: int) -> None:
        win = window(r)
        for n in (K - 1, K):
            e(f"{win(n)} = S[{x_at(n - R + 2 * r, 'm + ')}]")
        e(f"g0 = S[{g_at(0, r)}]", f"g1 = S[{g_at(1, r)}]", "gsum += g0 + g1")
        # one fused multiply-add per product (a sum of two products first took a
        # multiply, a fused multiply-add and an add)
        for dx in range(K):
            e(f"acc_{dx} += {win(dx)} * g0")
        for dx in range(K):
            e(f"acc_{dx} += {win(dx + 1)} * g1")

    def tail(r: int) -> None:  # fewer than `period` pairs were left
        if r == period - 1:
            if after is not None:
                after(window(r))
            return
        e(f"if m + {r} < {pairs}:")
        with e.indent():
            step(r)
            tail(r + 1)
        if after is not None:
            e("else:")
            with e.indent():
                after(window(r))

    for n in range(K - 1):
        e(f"win_{n} = S[{x_at(n - R, '')}]")
    e("m = 0", f"while m + {period} <= {pairs}:")
    with e.indent():
        for r in range(period):
            step(r)
        e(f"m += {period}")
    tail(0)


def _emit_block_window(e: _Emitter, K: int, xp: str, gp: str, count: str, phase: str,
                       step: int = 1, gphase: str | None = None) -> None:
    """Level-tap correlations along one line of coefficients, all four subbands.

    A window of ``K`` Haar blocks of ``x`` slides along the line while each
    gradient block (``gu``, at ``gp + qx * step``) is formed once; adds into
    ``acc{k}_{d}``, ``d`` the window position. The block of ``x`` at
    coefficient ``c`` of the line (from ``xp``) lives in ``xu{k}_{c % K}``; the
    loop over ``qx`` is unrolled ``K`` times, so the window turns by renaming,
    not by moves, and a guarded tail takes the last ``count % K``
    coefficients. ``step`` 1 walks a row (``d`` is the tap column), the grid's
    pitch a column (``d`` is the tap row). ``phase`` is the phase stride of
    both grids unless ``gphase`` gives the gradient's own. Shared by the plane
    and tile kernels' weight gradients.
    """
    gphase = phase if gphase is None else gphase
    walk = "qx" if step == 1 else f"qx * {step}"

    def step_at(r: int) -> None:  # coefficient qx + r
        _butterfly(e, "xu", (r + K - 1) % K, f"{xp} + {walk} + {(r + K - 1) * step}", phase)
        _butterfly(e, "gu", "", f"{gp} + {walk} + {r * step}", gphase)
        for k in range(4):
            for d in range(K):
                e(f"acc{k}_{d} += xu{k}_{(r + d) % K} * gu{k}_")

    def tail(r: int) -> None:  # fewer than K coefficients were left
        if r == K - 1:
            return
        e(f"if qx + {r} < {count}:")
        with e.indent():
            step_at(r)
            tail(r + 1)

    for m in range(K - 1):
        _butterfly(e, "xu", m, f"{xp} + {m * step}", phase)
    e("qx = 0", f"while qx + {K} <= {count}:")
    with e.indent():
        for r in range(K):
            step_at(r)
        e(f"qx += {K}")
    tail(0)


def finalize_kernel_source(spec: FinalizeSpec) -> str:
    """Python source of ``wtconv_finalize`` for ``spec``.

    The kernel takes ``(part, w0, b0, s0, ww, ws, gw0, gb0, gs0, gww, gws,
    dims)`` (see :func:`wtconv_cuda.kernels.compiler.finalize_signature`) and
    runs one block per channel, with ``4 * ntaps`` bytes of dynamic shared
    memory. ``dims`` holds ``(B, C, L, has_bias, nchunks)``. The partials of
    channel ``c`` are ``part[(c * nchunks + u) * ntaps:]`` for ``u <
    nchunks`` (one per run of work units), summed in index order; level taps carry the two Haar factors
    1/2 (one from each pyramid), applied here exactly.

    Parameters
    ----------
    spec : FinalizeSpec
        The variant to generate. Its fields are not validated here.

    Returns
    -------
    str
        Source of a function ``wtconv_finalize``, to be turned into a function
        by :func:`build`.
    """
    K, T = spec.kernel_size, spec.threads
    K2 = K * K
    e = _Emitter()
    e("def wtconv_finalize(part, w0, b0, s0, ww, ws, gw0, gb0, gs0, gww, gws, dims):")
    with e.indent():
        e("G = cuda.shared.array(0, dtype=float32)",
          "tid = cuda.threadIdx.x", "c = int64(cuda.blockIdx.x)", "fz = float32(0.0)",
          "C = dims[1]", "L = dims[2]", "has_bias = dims[3]", "nchunks = dims[4]",
          f"ntaps = {K2 + 1} + {4 * K2} * L",
          f"for t in range(tid, ntaps, {T}):")
        with e.indent():
            U = FINALIZE_UNROLL
            e(f"# the loads of {U} partials are issued before their adds (the adds in",
              f"# the same order: a plain loop's bits, {U} loads in flight instead of 1)",
              "tot = fz")
            _emit_ordered_sum(e, "tot", "part", "c * nchunks * ntaps + t", "ntaps", "nchunks", U)
            e(f"if t > {K2}:", "    tot = tot * float32(0.25)", "G[t] = tot")
        e("cuda.syncthreads()")
        _emit_gradient_unfold(e, K, spec.storage, "tid", T, "1", run_channel="c",
                              run_valid="True", gsum=lambda t: f"G[{t}]")
    return e.text()


def _unsigned_indices(source: str, arrays=("S", "G")) -> str:
    """Wrap every index of the on-chip buffers in ``uint64(...)``.

    Numba adds a negative-index wraparound (compare and select on 64-bit
    integers) to every access of an array with a signed index. Our indices are
    never negative; an unsigned index removes the check and lets LLVM fold the
    constant part of each unrolled tap's index into the load's immediate offset.
    """
    out, i = [], 0
    while i < len(source):
        hit = next((a for a in arrays if source.startswith(a + "[", i)
                    and (i == 0 or not (source[i - 1].isalnum() or source[i - 1] == "_"))), None)
        if hit is None:
            out.append(source[i])
            i += 1
            continue
        start = i + len(hit) + 1
        depth, j = 1, start
        while depth:
            depth += {"[": 1, "]": -1}.get(source[j], 0)
            j += 1
        out.append(f"{hit}[uint64({source[start:j - 1]})]")
        i = j
    return "".join(out)


class _SimulatedBitCasts:
    """The libdevice bit casts the generated code uses (bfloat16 storage), for numba's
    CUDA simulator, whose libdevice functions are stubs that return None."""

    @staticmethod
    def float_as_int(x):
        import numpy as np
        return np.float32(x).view(np.int32)

    @staticmethod
    def int_as_float(i):
        import numpy as np
        return np.int32(i).view(np.float32)


def build(source: str, name: str):
    """Execute generated ``source`` and return the Python function ``name``.

    Every index of the on-chip buffers is first made unsigned (see
    ``_unsigned_indices``); under the simulator, which lacks ``syncwarp``,
    warp barriers become block barriers. The source runs in a namespace holding ``np``,
    ``cuda``, the numba scalar types it uses and, if referenced, ``libdevice`` (under
    the simulator, NumPy versions of its two bit casts: its own are stubs).

    Parameters
    ----------
    source : str
        Output of :func:`plane_kernel_source` or :func:`finalize_kernel_source`.
    name : str
        Function to return: ``"wtconv_plane"`` or ``"wtconv_finalize"``.

    Returns
    -------
    function
        The plain Python function, ready for ``numba.cuda.jit`` or
        ``numba.cuda.compile_ptx``.
    """
    import numpy as np

    from ._numba_compat import cuda
    from numba import float32, int32, int64, uint16, uint64
    namespace = dict(np=np, cuda=cuda, float32=float32, int32=int32, int64=int64, uint16=uint16,
                     uint64=uint64)
    from .compiler import simulator_enabled
    if "libdevice." in source:
        from numba.cuda import libdevice
        namespace["libdevice"] = _SimulatedBitCasts if simulator_enabled() else libdevice
    if simulator_enabled():  # the simulator has no syncwarp; a block barrier is stronger
        source = source.replace("cuda.syncwarp()", "cuda.syncthreads()")
    code = compile(_unsigned_indices(source), f"<wtconv_cuda generated {name}>", "exec")
    exec(code, namespace)  # noqa: S102 - generated by this module
    return namespace[name]
