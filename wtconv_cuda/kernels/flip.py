"""``wtconv_flip``: every ``K x K`` filter turned by 180 degrees.

The layer is linear in ``x``, and its adjoint is the layer itself with every
convolution replaced by its adjoint, a correlation with the filter flipped in
both axes (SPEC.md, Gradients; the Haar matrix is its own transpose, and pads
and crops swap). So for stride 1, ``dx`` is the forward on ``dy`` with flipped
base and level filters, the same scales and no bias; the backward
(:func:`wtconv_cuda.kernels.launch.run_backward`) runs the forward kernels for
it and the plane kernel for the weight gradients alone
(``PlaneSpec.weights_only``). This kernel writes the flipped filters it needs,
in the storage type, into a work buffer.
"""

from __future__ import annotations

from typing import NamedTuple

from .codegen import STORAGE, _Emitter

#: Threads per block of ``wtconv_flip``.
FLIP_THREADS = 128


class FlipSpec(NamedTuple):
    """Compile-time parameters of one ``wtconv_flip`` variant.

    The storage comes first: specs are compared as tuples, and
    ``(kernel_size, storage, threads)`` would equal a `FinalizeSpec`'s fields
    (see :func:`wtconv_cuda.kernels.compiler.distinct`).

    Attributes
    ----------
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"`` (raw ``uint16`` bits):
        the type of the filters read and written; values are copied, never
        converted.
    kernel_size : int
        Odd ``K``.
    threads : int
        Threads per block.
    """

    storage: str
    kernel_size: int
    threads: int = FLIP_THREADS


def flip_kernel_source(spec: FlipSpec) -> str:
    """Python source of ``wtconv_flip`` for ``spec``.

    Arguments ``(w0, ww, f0, fw, n0, nw)``: pointers to the storage type for
    the base filters ``w0`` ``(C, K, K)`` and the level filters ``ww`` ``(L,
    C, 4, K, K)``, and for their flipped copies ``f0`` and ``fw`` (same
    shapes), then the int64 element counts ``n0 = C K K`` and ``nw = 4 L C K
    K``. ``f[f * K * K + t] = w[f * K * K + K * K - 1 - t]`` for every filter
    ``f``; a grid-stride loop covers both arrays.

    Parameters
    ----------
    spec : FlipSpec
        The variant.

    Returns
    -------
    str
        Source of ``wtconv_flip`` for :func:`wtconv_cuda.kernels.codegen.build`.

    Raises
    ------
    ValueError
        An even or non-positive ``K``, an unknown storage, or threads not a
        positive multiple of 32.
    """
    K = spec.kernel_size
    if K < 1 or K % 2 == 0:
        raise ValueError(f"kernel_size must be odd and >= 1, got {K}")
    if spec.storage not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, got {spec.storage!r}")
    if spec.threads < 32 or spec.threads % 32:
        raise ValueError(f"threads must be a positive multiple of 32, got {spec.threads}")
    K2 = K * K
    e = _Emitter()
    e("def wtconv_flip(w0, ww, f0, fw, n0, nw):")
    with e.indent():
        e("for i in range(int64(cuda.grid(1)), n0 + nw, int64(cuda.gridsize(1))):")
        with e.indent():
            e("if i < n0:")
            with e.indent():
                e(f"t = i % {K2}", f"f0[i] = w0[i - t + {K2 - 1} - t]")
            e("else:")
            with e.indent():
                e("k = i - n0", f"t = k % {K2}", f"fw[k] = ww[k - t + {K2 - 1} - t]")
    return e.text()
