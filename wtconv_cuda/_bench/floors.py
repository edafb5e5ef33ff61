"""The time floor of a benchmarked call: its bytes or its arithmetic, whichever takes longer.

The roofline fraction (:func:`wtconv_cuda._bench.core.roofline_fraction`) prices
only the compulsory bytes. The layer also has compulsory arithmetic: every tap
of every depthwise convolution at every position of its grid, once for the
forward, and twice more for the backward (the adjoint convolutions that give
``dx``, and the correlations that give the weight gradients). The kernels
compute in float32 whatever the storage, so at 16-bit storage, where the bytes
halve, the multiply-adds can set the floor instead. The Haar butterflies and
the scale multiplies (a few adds per pixel against the ``K * K`` taps of each
grid) are left out, so the floor stays a lower bound.

The fp32 rate is the datasheet's: multiprocessors x 128 fp32 lanes x the
boost clock, for the cards the project runs on (a card not listed has no
arithmetic floor, and its floor is the bytes' alone).
"""

from __future__ import annotations

from typing import Sequence

from .core import floor_ms

__all__ = ["FP32_LANES_PER_SM", "CARDS", "conv_multiply_adds", "fp32_fma_rate",
           "time_floor_ms", "floor_fraction"]

#: fp32 multiply-add lanes per multiprocessor (sm_90).
FP32_LANES_PER_SM = 128
#: CUDA device name -> (multiprocessors, boost clock in Hz), from NVIDIA's datasheets.
CARDS = {
    "NVIDIA H100 80GB HBM3": (132, 1.98e9),  # H100 SXM5: 66.9 fp32 TFLOPS
    "NVIDIA H100 PCIe": (114, 1.755e9),      # 51.2 fp32 TFLOPS
    "NVIDIA H200": (132, 1.98e9),            # H200 SXM: 66.9 fp32 TFLOPS
}


def conv_multiply_adds(shape: Sequence[int], levels: int, kernel_size: int) -> dict:
    """Multiply-adds of the layer's convolutions (stride 1).

    The base convolution takes ``K * K`` per pixel, and level ``j`` takes
    ``K * K`` per coefficient of each of its four subbands, on grids of
    ``ceil(H / 2**j) x ceil(W / 2**j)``.

    Parameters
    ----------
    shape : sequence of int
        ``(B, C, H, W)`` of ``x``.
    levels : int
        ``L >= 0``.
    kernel_size : int
        Odd ``K``.

    Returns
    -------
    dict
        ``inference`` (the forward), ``backward`` (``dx`` and the weight
        gradients: twice the forward) and ``training`` (three times), ints.
    """
    b, c, h, w = (int(v) for v in shape)
    positions = h * w
    for _ in range(levels):
        h, w = -(-h // 2), -(-w // 2)
        positions += 4 * h * w
    forward = b * c * kernel_size ** 2 * positions
    return {"inference": forward, "backward": 2 * forward, "training": 3 * forward}


def fp32_fma_rate(device: str | None) -> float | None:
    """Datasheet fp32 multiply-adds per second of a card (`CARDS`), or None.

    Parameters
    ----------
    device : str or None
        The CUDA device name, e.g. ``"NVIDIA H200"``.

    Returns
    -------
    float or None
    """
    if device not in CARDS:
        return None
    sms, clock = CARDS[device]
    return sms * FP32_LANES_PER_SM * clock


def time_floor_ms(nbytes: float, bandwidth, multiply_adds: float, fma_rate) -> float | None:
    """The longer of the bytes' time at ``bandwidth`` and the multiply-adds' at
    ``fma_rate``, in milliseconds (a missing rate drops its term; both missing: None).

    Parameters
    ----------
    nbytes : float
        Compulsory bytes.
    bandwidth : float or None
        Bytes per second.
    multiply_adds : float
        Compulsory multiply-adds.
    fma_rate : float or None
        Multiply-adds per second.

    Returns
    -------
    float or None
    """
    terms = [floor_ms(n, rate) for n, rate in ((nbytes, bandwidth), (multiply_adds, fma_rate))
             if rate and rate > 0]
    return max(terms) if terms else None


def floor_fraction(row: dict, mode: str, name: str, bandwidth, fma_rate) -> float | None:
    """Fraction of its time floor that a measured call of a report row reached.

    Parameters
    ----------
    row : dict
        A measured row (:func:`wtconv_cuda._bench.measure.measure_config`);
        its multiply-adds are counted from its shape, levels and kernel size
        where it does not carry them (runs before 2026-12-08).
    mode : str
        ``"inference"`` or ``"training"``.
    name : str
        The implementation (``"ours"``, ``"cupy"``, ...).
    bandwidth, fma_rate : float or None
        The run's copy bandwidth and fp32 multiply-add rate.

    Returns
    -------
    float or None
        None where the row has no time for ``name`` or no floor.
    """
    ms = (row.get(f"{mode}_ms") or {}).get(name)
    counts = row.get("multiply_adds") or conv_multiply_adds(
        row["shape"], row["levels"], row["kernel_size"])
    floor = time_floor_ms(row["compulsory_bytes"][mode], bandwidth, counts[mode], fma_rate)
    if not ms or ms <= 0 or floor is None:
        return None
    return floor / ms
