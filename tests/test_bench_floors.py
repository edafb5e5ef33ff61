"""The benchmark's time floors: the convolutions' multiply-adds against the bytes."""

import pytest

from wtconv_cuda._bench import report
from wtconv_cuda._bench.floors import (
    conv_multiply_adds, floor_fraction, fp32_fma_rate, time_floor_ms,
)

from .test_bench_cpu import fake_report, fake_row


@pytest.mark.parametrize("shape,levels,positions", [
    ((64, 96, 56, 56), 5, 56 * 56 + 4 * (28 * 28 + 14 * 14 + 7 * 7 + 4 * 4 + 2 * 2)),
    ((64, 768, 7, 7), 2, 7 * 7 + 4 * (4 * 4 + 2 * 2)),      # odd grids halve with ceil
    ((2, 3, 13, 11), 0, 13 * 11),                            # no levels: the base alone
    ((1, 1, 1, 1), 3, 1 + 4 * 3),                            # a pixel stays a pixel
])
def test_multiply_adds_count_every_tap_of_every_grid(shape, levels, positions):
    counts = conv_multiply_adds(shape, levels, 5)
    b, c = shape[:2]
    assert counts["inference"] == b * c * 25 * positions
    assert counts["backward"] == 2 * counts["inference"]
    assert counts["training"] == 3 * counts["inference"]


def test_the_56_x_56_plane_takes_183_300_multiply_adds():
    # the figure of benchmarks/NOTES.md's floor of the weights-only kernel
    assert conv_multiply_adds((1, 1, 56, 56), 5, 5)["inference"] == 183_300


def test_datasheet_rates():
    assert fp32_fma_rate("NVIDIA H200") == pytest.approx(33.45e12, rel=1e-3)
    assert fp32_fma_rate("NVIDIA H100 80GB HBM3") == fp32_fma_rate("NVIDIA H200")
    assert fp32_fma_rate("NVIDIA H100 PCIe") == pytest.approx(25.6e12, rel=1e-3)
    assert fp32_fma_rate("cpu") is None and fp32_fma_rate(None) is None


def test_the_floor_is_the_longer_term():
    assert time_floor_ms(4e9, 4e12, 1e9, 1e12) == 1.0             # bytes: 1 ms, math: 1 ms
    assert time_floor_ms(4e9, 4e12, 3e9, 1e12) == 3.0             # math sets it
    assert time_floor_ms(8e9, 4e12, 1e9, 1e12) == 2.0             # bytes set it
    assert time_floor_ms(8e9, None, 1e9, 1e12) == 1.0             # no bandwidth: math alone
    assert time_floor_ms(8e9, 4e12, 1e9, None) == 2.0
    assert time_floor_ms(8e9, None, 1e9, None) is None


def test_floor_fraction_of_a_row():
    row = fake_row()  # 64 x 96 x 56 x 56, L 5: inference 0.5 ms ours, 0.49 CuPy
    forward = conv_multiply_adds(row["shape"], 5, 5)["inference"]
    rate = forward / 1e-4  # the multiply-adds take 0.1 ms
    slow = 2 * 77070336 / 1e-4  # the bytes take 0.1 ms
    assert floor_fraction(row, "inference", "ours", slow, rate) == pytest.approx(0.2)
    assert floor_fraction(row, "inference", "ours", slow / 4, rate) == pytest.approx(0.8)
    assert floor_fraction(row, "inference", "ours", None, rate / 2) == pytest.approx(0.4)
    assert floor_fraction(row, "inference", "missing", slow, rate) is None
    assert floor_fraction(row, "inference", "ours", None, None) is None
    # a row that carries its counts is read, not recounted
    row["multiply_adds"] = {"inference": 2 * forward, "training": 0}
    assert floor_fraction(row, "inference", "ours", None, rate) == pytest.approx(0.4)


def test_the_report_prints_the_floor_column_and_rate():
    text = report.render_report(fake_report())  # an H200 at 4.07 TB/s
    assert "fp32 multiply-adds: 33.45 T/s (datasheet)" in text
    line = next(line for line in text.splitlines() if line.startswith("64x96x56x56 L5"))
    # bytes 2 x 77 MB at 4.07 TB/s: 37.9 us; 1.126 G multiply-adds: 33.7 us
    # the stored roofline of ours, then the CuPy path's 0.49 ms against its floor
    assert line.split()[9:11] == ["7.0%", "7.7%"]
    unknown = fake_report()
    unknown.update(device="cpu", copy_bandwidth=None)
    line = next(line for line in report.render_report(unknown).splitlines()
                if line.startswith("64x96x56x56 L5"))
    assert line.split()[9:11] == ["7.0%", "-"]  # the row's stored roofline; no floor
