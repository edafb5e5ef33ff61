"""Source generator for the fused plane kernels.

Numba does not reliably unroll loops whose trip count is a compile-time
constant, and a register array indexed inside such a loop ends up in local
memory (slow). The hot loops are therefore *generated* as straight-line scalar
code: every accumulator, weight and tap value is a named local variable. The
generated text is ordinary Python for ``numba.cuda``; the same text runs under
the CUDA simulator, which is how CI tests it.

Two kernels are generated:

``wtconv_plane``
    One block per ``(b, c)`` plane. Loads the plane, builds the Haar pyramid on
    chip, convolves every subband, runs the closed-form synthesis and the base
    convolution and writes the output. With ``backward=True`` it runs the same
    pipeline on ``dy`` with flipped taps (that is ``dx``), then loads ``x`` and
    correlates both pyramids into per-plane weight-gradient partial sums.
``wtconv_finalize``
    One block per channel: sums the per-plane partials over the batch in a fixed
    order (deterministic) and unfolds them into the gradients of the published
    parameters.
"""

from __future__ import annotations

from typing import NamedTuple

from .layout import HEADER, LEVEL_BASE, LEVEL_STRIDE, bias_index

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
        Threads per block.
    strip : int
        Outputs per thread along a row.
    max_registers : int
        Register cap handed to ptxas (``.maxnreg``); 0 leaves it free.
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


class FinalizeSpec(NamedTuple):
    """Compile-time parameters of one ``wtconv_finalize`` variant."""

    kernel_size: int
    storage: str
    threads: int = 128


class _Emitter:
    """Collects indented source lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

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


def _load(storage: str, expr: str) -> str:
    """Expression converting one stored element to float32."""
    if storage == "float32":
        return expr
    if storage == "float16":
        return f"float32({expr})"
    return f"libdevice.int_as_float(int32(int64({expr}) << 16))"


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


def _geo(name: str) -> str:
    return f"geo[{HEADER[name]}]"


def _lvl(level: str, field: int) -> str:
    return f"geo[{LEVEL_BASE} + {LEVEL_STRIDE} * ({level}) + {field}]"


def _butterfly(emit: _Emitter, out: str, idx, p0: str, p1: str) -> None:
    """Haar butterfly of the 2x2 block whose top-left is ``S[p0]`` (row below: ``p1``).

    Defines ``{out}0_{idx}..{out}3_{idx}`` = twice (LL, LH, HL, HH).
    """
    emit(f"_a = S[{p0}]", f"_b = S[{p0} + 1]", f"_c = S[{p1}]", f"_d = S[{p1} + 1]",
         "_s = _a + _b", "_m = _a - _b", "_t = _c + _d", "_n = _c - _d",
         f"{out}0_{idx} = _s + _t", f"{out}1_{idx} = _s - _t",
         f"{out}2_{idx} = _m + _n", f"{out}3_{idx} = _m - _n")


def plane_kernel_source(spec: PlaneSpec) -> str:
    """Python source of ``wtconv_plane`` for ``spec``."""
    K, Q, T = spec.kernel_size, spec.strip, spec.threads
    if K < 1 or K % 2 == 0:
        raise ValueError(f"kernel_size must be odd and >= 1, got {K}")
    if spec.storage not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, got {spec.storage!r}")
    if Q * spec.out_stride % 2:
        raise ValueError("strip * out_stride must be even (parity of strip outputs is static)")
    R = (K - 1) // 2
    HALO = 2 * R
    K2 = K * K
    SI, SO = spec.in_stride, spec.out_stride
    ld = lambda e: _load(spec.storage, e)  # noqa: E731
    e = _Emitter()

    e("def wtconv_plane(src, out, xsrc, w0, b0, s0, ww, ws, part, scratch, geo):")
    with e.indent():
        e("tid = cuda.threadIdx.x",
          "fz = float32(0.0)",
          "f05 = float32(0.5)",
          f"H = {_geo('H')}", f"W = {_geo('W')}",
          f"Hin = {_geo('Hin')}", f"Win = {_geo('Win')}",
          f"Hout = {_geo('Hout')}", f"Wout = {_geo('Wout')}",
          f"L = {_geo('L')}", f"C = {_geo('C')}", f"nplanes = {_geo('nplanes')}",
          f"a_off = {_geo('a_off')}", f"a_len = {_geo('a_len')}",
          f"has_bias = {_geo('has_bias')}",
          f"src0 = {_lvl(0, 2)}", f"sp0 = {_lvl(0, 3)}")
        if spec.scratch:
            e(f"S = scratch", f"sb = int64(cuda.blockIdx.x) * {_geo('slot')}")
        else:
            e("S = cuda.shared.array(0, dtype=float32)", "sb = int64(0)")
        if spec.backward:
            e(f"xb_off = {_geo('xb_off')}", f"p_off = {_geo('p_off')}",
              "xshift = xb_off - a_off",
              f"ntaps = {K2 + 1} + {4 * K2} * L")
        e("# The halos of region A stay zero for the whole launch.",
          f"for i in range(tid, a_len, {T}):",
          "    S[sb + a_off + i] = fz",
          "plane = int64(cuda.blockIdx.x)",
          "while plane < nplanes:")
        with e.indent():
            e("c = plane % C", "cuda.syncthreads()")
            _emit_fold_weights(e, spec)
            e("# Input plane into source grid 0 (zero-filled upsampling by the input stride).",
              "ibase = plane * (Hin * Win)",
              f"for idx in range(tid, Hin * Win, {T}):")
            with e.indent():
                e("iy = idx // Win", "ix = idx - iy * Win",
                  f"S[sb + src0 + (iy * {SI} + {HALO}) * sp0 + ix * {SI} + {HALO}] = "
                  + ld("src[ibase + idx]"))
            e("cuda.syncthreads()")
            _emit_analysis(e, spec)
            _emit_synthesis(e, spec)
            _emit_output(e, spec)
            if spec.backward:
                _emit_weight_gradients(e, spec)
            e("plane += cuda.gridDim.x")
    return e.text()


def _emit_fold_weights(e: _Emitter, spec: PlaneSpec) -> None:
    """Scales (and the Haar 1/2) folded into the channel's taps, in S[sb:]."""
    K, T = spec.kernel_size, spec.threads
    K2 = K * K
    ld = lambda x: _load(spec.storage, x)  # noqa: E731
    flip = (lambda t: f"{K2 - 1} - {t}") if spec.backward else (lambda t: t)
    base_tap = ld(f"w0[c * {K2} + {flip('i')}]")
    level_tap = ld(f"ww[widx * {K2} + {flip('t')}]")
    e(f"nw = {K2} + {4 * K2} * L",
      f"for i in range(tid, nw + 1, {T}):")
    with e.indent():
        e(f"if i < {K2}:",
          f"    v = {ld('s0[c]')} * {base_tap}",
          "elif i < nw:")
        with e.indent():
            e(f"r = i - {K2}", f"j = r // {4 * K2}", f"rem = r - j * {4 * K2}",
              f"k = rem // {K2}", f"t = rem - k * {K2}", "widx = (j * C + c) * 4 + k",
              f"v = f05 * ({ld('ws[widx]')} * {level_tap})")
        e("else:")
        with e.indent():
            e("v = fz")
            if not spec.backward:
                e("if has_bias != 0:", f"    v = {ld('s0[c]')} * {ld('b0[c]')}")
        e("S[sb + i] = v")


def _emit_analysis(e: _Emitter, spec: PlaneSpec) -> None:
    """Levels 1..L: Haar analysis fused into each subband's KxK convolution."""
    K, Q, T = spec.kernel_size, spec.strip, spec.threads
    R, K2 = (K - 1) // 2, K * K
    HALO = 2 * R
    M = Q + K - 1  # source blocks one tap row of a strip touches
    e("for j in range(1, L + 1):")
    with e.indent():
        e(f"srcp = {_lvl('j - 1', 2)}", f"spp = {_lvl('j - 1', 3)}",
          f"Hj = {_lvl('j', 0)}", f"Wj = {_lvl('j', 1)}", f"zo = {_lvl('j', 4)}",
          f"srcn = {_lvl('j', 2)}", f"spn = {_lvl('j', 3)}",
          "HWj = Hj * Wj",
          f"wb = sb + {K2} + (j - 1) * {4 * K2}",
          f"nstrip = (Wj + {Q - 1}) // {Q}",
          f"for it in range(tid, Hj * nstrip, {T}):")
        with e.indent():
            e("qy = it // nstrip", f"sx0 = (it - qy * nstrip) * {Q}",
              "rb = sb + srcp + 2 * qy * spp + 2 * sx0")
            for k in range(4):
                e(", ".join(f"acc{k}_{i}" for i in range(Q)) + " = "
                  + ", ".join("fz" for _ in range(Q)))
            e(f"for dy in range({K}):")
            with e.indent():
                e("r0 = rb + 2 * dy * spp", "r1 = r0 + spp", f"wr = wb + dy * {K}")
                for m in range(M):
                    _butterfly(e, "u", m, f"r0 + {2 * m}", f"r1 + {2 * m}")
                for k in range(4):
                    for dx in range(K):
                        e(f"w{k}_{dx} = S[wr + {k * K2 + dx}]")
                for k in range(4):
                    for i in range(Q):
                        for dx in range(K):
                            e(f"acc{k}_{i} += w{k}_{dx} * u{k}_{i + dx}")
            e("zr = sb + zo + qy * Wj + sx0",
              f"cr = rb + {HALO} * spp + {2 * R}",
              f"nr = sb + srcn + (qy + {HALO}) * spn + sx0 + {HALO}")
            for i in range(Q):
                e(f"if sx0 + {i} < Wj:")
                with e.indent():
                    for k in range(4):
                        e(f"S[zr + {k} * HWj + {i}] = acc{k}_{i}")
                    e("if j < L:")
                    with e.indent():
                        e(f"p = cr + {2 * i}",
                          f"S[nr + {i}] = f05 * ((S[p] + S[p + 1]) + (S[p + spp] + S[p + spp + 1]))")
        e("cuda.syncthreads()")


def _emit_synthesis(e: _Emitter, spec: PlaneSpec) -> None:
    """Levels L..2: add each level's synthesis into the LL band one level finer."""
    T = spec.threads
    e("for j in range(L, 1, -1):")
    with e.indent():
        e(f"Hj = {_lvl('j', 0)}", f"Wj = {_lvl('j', 1)}", f"zo = {_lvl('j', 4)}",
          f"Hp = {_lvl('j - 1', 0)}", f"Wp = {_lvl('j - 1', 1)}", f"zp = {_lvl('j - 1', 4)}",
          "HWj = Hj * Wj",
          f"for it in range(tid, HWj, {T}):")
        with e.indent():
            e("qy = it // Wj", "qx = it - qy * Wj", "z = sb + zo + it",
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


def _emit_output(e: _Emitter, spec: PlaneSpec) -> None:
    """Base convolution + bias + level-1 synthesis, one strip of outputs per thread."""
    K, Q, T, SO = spec.kernel_size, spec.strip, spec.threads, spec.out_stride
    R = (K - 1) // 2
    offsets = sorted({i * SO + dx for i in range(Q) for dx in range(K)})
    e(f"bias = S[sb + {bias_index(K, 0)} + {4 * K * K} * L]",
      f"H1 = {_lvl(1, 0)} if L > 0 else int64(1)",
      f"W1 = {_lvl(1, 1)} if L > 0 else int64(1)",
      f"z1 = {_lvl(1, 4)} if L > 0 else int64(0)",
      "HW1 = H1 * W1",
      "obase = plane * (Hout * Wout)",
      f"nstrip = (Wout + {Q - 1}) // {Q}",
      f"for it in range(tid, Hout * nstrip, {T}):")
    with e.indent():
        e("oy = it // nstrip", f"ox0 = (it - oy * nstrip) * {Q}", f"py = oy * {SO}",
          f"rb = sb + src0 + (py + {R}) * sp0 + ox0 * {SO} + {R}")
        e(", ".join(f"acc_{i}" for i in range(Q)) + " = " + ", ".join("fz" for _ in range(Q)))
        e(f"for dy in range({K}):")
        with e.indent():
            e("r = rb + dy * sp0", f"wr = sb + dy * {K}")
            for o in offsets:
                e(f"x_{o} = S[r + {o}]")
            for dx in range(K):
                e(f"w_{dx} = S[wr + {dx}]")
            for i in range(Q):
                for dx in range(K):
                    e(f"acc_{i} += w_{dx} * x_{i * SO + dx}")
        e("orow = obase + oy * Wout + ox0",
          "zrow = sb + z1 + (py >> 1) * W1 + ((ox0 * %d) >> 1)" % SO,
          "odd_row = (py & 1) == 1")
        for i in range(Q):
            odd_col = (i * SO) % 2 == 1
            col = (i * SO) // 2
            e(f"if ox0 + {i} < Wout:")
            with e.indent():
                e(f"v = acc_{i} + bias", "if L > 0:")
                with e.indent():
                    e(f"z = zrow + {col}",
                      "if odd_row:",
                      "    _u = S[z] - S[z + HW1]",
                      "    _v = S[z + 2 * HW1] - S[z + 3 * HW1]",
                      "else:",
                      "    _u = S[z] + S[z + HW1]",
                      "    _v = S[z + 2 * HW1] + S[z + 3 * HW1]",
                      f"v += f05 * (_u {'-' if odd_col else '+'} _v)")
                _store(e, spec.storage, f"out[orow + {i}]", "v")
    e("cuda.syncthreads()")


def _emit_weight_gradients(e: _Emitter, spec: PlaneSpec) -> None:
    """Backward only: correlate the x pyramid with the dy pyramid, per plane."""
    K, T = spec.kernel_size, spec.threads
    R, K2 = (K - 1) // 2, K * K
    HALO = 2 * R
    ld = lambda x: _load(spec.storage, x)  # noqa: E731
    chunks_cap = max(1, T // K)
    e("# ---- weight gradients: x pyramid into region B, then correlations ----",
      f"for i in range(tid, a_len, {T}):",
      "    S[sb + xb_off + i] = fz",
      "cuda.syncthreads()",
      "xbase = plane * (H * W)",
      f"for idx in range(tid, H * W, {T}):")
    with e.indent():
        e("iy = idx // W", "ix = idx - iy * W",
          f"S[sb + src0 + xshift + (iy + {HALO}) * sp0 + ix + {HALO}] = " + ld("xsrc[xbase + idx]"))
    e("cuda.syncthreads()",
      "for j in range(1, L):")
    with e.indent():
        e(f"srcp = {_lvl('j - 1', 2)}", f"spp = {_lvl('j - 1', 3)}",
          f"Hj = {_lvl('j', 0)}", f"Wj = {_lvl('j', 1)}",
          f"srcn = {_lvl('j', 2)}", f"spn = {_lvl('j', 3)}",
          f"for it in range(tid, Hj * Wj, {T}):")
        with e.indent():
            e("qy = it // Wj", "qx = it - qy * Wj",
              f"p = sb + srcp + xshift + (2 * qy + {HALO}) * spp + 2 * qx + {HALO}",
              f"S[sb + srcn + xshift + (qy + {HALO}) * spn + qx + {HALO}] = "
              "f05 * ((S[p] + S[p + 1]) + (S[p + spp] + S[p + spp + 1]))")
        e("cuda.syncthreads()")

    e("pbase = plane * ntaps",
      "# base taps and bias: item = (tap row dy, row chunk)",
      f"P = max(int64(1), min(H, int64({chunks_cap})))",
      f"nit = {K} * P",
      "if tid < nit:")
    with e.indent():
        e("dy = tid // P", "ch = tid - dy * P", "gsum = fz",
          ", ".join(f"acc_{dx}" for dx in range(K)) + " = " + ", ".join("fz" for _ in range(K)),
          "py = ch", "while py < H:")
        with e.indent():
            e(f"grow = sb + src0 + (py + {HALO}) * sp0 + {HALO}",
              f"xrow = sb + src0 + xshift + (py + dy + {R}) * sp0 + {R}")
            for m in range(K - 1):
                e(f"win_{m} = S[xrow + {m}]")
            e("for px in range(W):")
            with e.indent():
                e(f"win_{K - 1} = S[xrow + px + {K - 1}]", "g = S[grow + px]", "gsum += g")
                for dx in range(K):
                    e(f"acc_{dx} += win_{dx} * g")
                for m in range(K - 1):
                    e(f"win_{m} = win_{m + 1}")
            e("py += P")
        for dx in range(K):
            e(f"S[sb + p_off + tid * {K} + {dx}] = acc_{dx}")
        e("if dy == 0:", f"    S[sb + p_off + nit * {K} + ch] = gsum")
    e("cuda.syncthreads()",
      f"for t in range(tid, {K2 + 1}, {T}):")
    with e.indent():
        e("tot = fz",
          f"if t < {K2}:",
          f"    dy = t // {K}",
          f"    dx = t - dy * {K}",
          "    for ch in range(P):",
          f"        tot += S[sb + p_off + (dy * P + ch) * {K} + dx]",
          "else:",
          "    for ch in range(P):",
          f"        tot += S[sb + p_off + nit * {K} + ch]",
          "part[pbase + t] = tot")
    e("cuda.syncthreads()")

    e("# level taps: item = (tap row dy, row chunk of coefficients), all 4 subbands",
      "for j in range(1, L + 1):")
    with e.indent():
        e(f"srcp = {_lvl('j - 1', 2)}", f"spp = {_lvl('j - 1', 3)}",
          f"Hj = {_lvl('j', 0)}", f"Wj = {_lvl('j', 1)}",
          f"P = max(int64(1), min(Hj, int64({chunks_cap})))",
          f"nit = {K} * P",
          "if tid < nit:")
        with e.indent():
            e("dy = tid // P", "ch = tid - dy * P")
            for k in range(4):
                e(", ".join(f"acc{k}_{dx}" for dx in range(K)) + " = "
                  + ", ".join("fz" for _ in range(K)))
            e("qy = ch", "while qy < Hj:")
            with e.indent():
                e(f"gp = sb + srcp + (2 * qy + {HALO}) * spp + {HALO}",
                  "xp = sb + srcp + xshift + (2 * qy + 2 * dy) * spp")
                for m in range(K - 1):
                    _butterfly(e, "xu", m, f"xp + {2 * m}", f"xp + spp + {2 * m}")
                e("for qx in range(Wj):")
                with e.indent():
                    e(f"xq = xp + 2 * qx + {2 * (K - 1)}")
                    _butterfly(e, "xu", K - 1, "xq", "xq + spp")
                    e("gq = gp + 2 * qx")
                    _butterfly(e, "gu", "", "gq", "gq + spp")
                    for k in range(4):
                        for dx in range(K):
                            e(f"acc{k}_{dx} += xu{k}_{dx} * gu{k}_")
                    for m in range(K - 1):
                        for k in range(4):
                            e(f"xu{k}_{m} = xu{k}_{m + 1}")
                e("qy += P")
            for k in range(4):
                for dx in range(K):
                    e(f"S[sb + p_off + (tid * 4 + {k}) * {K} + {dx}] = acc{k}_{dx}")
        e("cuda.syncthreads()",
          f"for t in range(tid, {4 * K2}, {T}):")
        with e.indent():
            e(f"k = t // {K2}", f"rem = t - k * {K2}", f"dy = rem // {K}", f"dx = rem - dy * {K}",
              "tot = fz",
              "for ch in range(P):",
              f"    tot += S[sb + p_off + ((dy * P + ch) * 4 + k) * {K} + dx]",
              f"part[pbase + {K2 + 1} + (j - 1) * {4 * K2} + t] = tot")
        e("cuda.syncthreads()")


def finalize_kernel_source(spec: FinalizeSpec) -> str:
    """Python source of ``wtconv_finalize`` for ``spec``.

    ``dims`` holds ``(B, C, L, has_bias)``. Partials are summed over the batch
    in index order; level taps carry the two Haar factors 1/2 (one from each
    pyramid), applied here exactly.
    """
    K, T = spec.kernel_size, spec.threads
    K2 = K * K
    ld = lambda x: _load(spec.storage, x)  # noqa: E731
    e = _Emitter()
    e("def wtconv_finalize(part, w0, b0, s0, ww, ws, gw0, gb0, gs0, gww, gws, dims):")
    with e.indent():
        e("G = cuda.shared.array(0, dtype=float32)",
          "tid = cuda.threadIdx.x", "c = int64(cuda.blockIdx.x)", "fz = float32(0.0)",
          "B = dims[0]", "C = dims[1]", "L = dims[2]", "has_bias = dims[3]",
          f"ntaps = {K2 + 1} + {4 * K2} * L",
          f"for t in range(tid, ntaps, {T}):")
        with e.indent():
            e("tot = fz", "for b in range(B):", "    tot += part[(b * C + c) * ntaps + t]",
              f"if t > {K2}:", "    tot = tot * float32(0.25)", "G[t] = tot")
        e("cuda.syncthreads()",
          "s0c = " + ld("s0[c]"),
          f"for t in range(tid, ntaps, {T}):")
        with e.indent():
            e(f"if t < {K2}:")
            with e.indent():
                _store(e, spec.storage, f"gw0[c * {K2} + t]", "s0c * G[t]")
            e(f"elif t == {K2}:")
            with e.indent():
                e("if has_bias != 0:")
                with e.indent():
                    _store(e, spec.storage, "gb0[c]", "s0c * G[t]")
            e("else:")
            with e.indent():
                e(f"r = t - {K2 + 1}", f"j = r // {4 * K2}", f"rem = r - j * {4 * K2}",
                  f"k = rem // {K2}", f"tt = rem - k * {K2}", "widx = (j * C + c) * 4 + k")
                _store(e, spec.storage, f"gww[widx * {K2} + tt]", ld("ws[widx]") + " * G[t]")
        e(f"for u in range(tid, 1 + 4 * L, {T}):")
        with e.indent():
            e("acc = fz", "if u == 0:")
            with e.indent():
                e(f"for t in range({K2}):",
                  f"    acc += {ld(f'w0[c * {K2} + t]')} * G[t]",
                  "if has_bias != 0:",
                  f"    acc += {ld('b0[c]')} * G[{K2}]")
                _store(e, spec.storage, "gs0[c]", "acc")
            e("else:")
            with e.indent():
                e("r = u - 1", "j = r // 4", "k = r - j * 4", "widx = (j * C + c) * 4 + k",
                  f"for t in range({K2}):",
                  f"    acc += {ld(f'ww[widx * {K2} + t]')} * G[{K2 + 1} + r * {K2} + t]")
                _store(e, spec.storage, "gws[widx]", "acc")
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


def build(source: str, name: str):
    """Execute generated ``source`` and return the Python function ``name``."""
    import numpy as np

    from ._numba_compat import cuda
    from numba import float32, int32, int64, uint16, uint64
    namespace = dict(np=np, cuda=cuda, float32=float32, int32=int32, int64=int64, uint16=uint16,
                     uint64=uint64)
    if "libdevice." in source:
        from numba.cuda import libdevice
        namespace["libdevice"] = libdevice
    code = compile(_unsigned_indices(source), f"<wtconv_cuda generated {name}>", "exec")
    exec(code, namespace)  # noqa: S102 - generated by this module
    return namespace[name]
