"""The benchmark's Markdown summary (the README's form of a run)."""

import pytest

from wtconv_cuda import bench
from wtconv_cuda._bench import report
from wtconv_cuda._bench.markdown import markdown_summary

from .test_bench_cpu import fake_report, fake_row


def test_the_stage_table_ratios_and_targets():
    data = fake_report()  # 64 x 96 x 56 x 56 fp32 and fp16, and a skipped row
    data["git_commit"] = "0123456789abcdef"
    data["rows"].insert(1, fake_row("64x192x28x28 L4", "float32"))
    data["rows"][1]["shape"] = [64, 192, 28, 28]
    data["rows"][1]["levels"] = 4
    data["rows"][1]["inference_ms"]["cupy"] = 0.25
    text = markdown_summary(data)
    lines = text.splitlines()
    assert lines[0].startswith("NVIDIA H200, tree `0123456`, 2026-12-01, copy bandwidth 4.07 TB/s")
    # fp32 rows first, in grid order, then fp16; peak memory 300 / 400 MiB
    rows = [line for line in lines if line.startswith("| 64,")]
    assert rows == [
        "| 64, 96, 56, 56, L5, fp32 | 0.500 / 0.490 / 0.600 ms | "
        "2.000 / 1.750 / 8.000 / 3.000 ms | 0.750x |",
        "| 64, 192, 28, 28, L4, fp32 | 0.500 / 0.250 / 0.600 ms | "
        "2.000 / 1.750 / 8.000 / 3.000 ms | 0.750x |",
        "| 64, 96, 56, 56, L5, fp16 | 0.500 / 0.490 / 0.600 ms | "
        "2.000 / 1.750 / 8.000 / 3.000 ms | 0.750x |"]
    fp32 = next(line for line in lines if line.startswith("- fp32"))
    assert "at 56 / 28:" in fp32
    assert "training step 1.71x / 1.71x depthwise 7x7's speed" in fp32  # 3.0 / 1.75
    assert "4.6x / 4.6x the materialising layer's" in fp32               # 8.0 / 1.75
    assert "forward 1.22x / 2.40x depthwise 7x7's" in fp32               # 0.6 / 0.49, / 0.25
    assert not any(line.startswith("- bf16") for line in lines)          # none measured
    # the skipped row counts as a stage row not measured
    assert ("- training step >= 15x the materialising layer (ConvNeXt-T stages, fp32 and "
            "bf16): CuPy path missed: 4.57x at 64x192x28x28 L4 float32 (2 of 3 rows "
            "measured); WTConv2d missed: 4.00x at 64x192x28x28 L4 float32 (2 of 3 rows "
            "measured).") in lines
    assert "- a (1, 8, 16, 16) training step < 150 us of host time: CuPy path met: 95.5 us; " \
           "WTConv2d met: 140.0 us." in lines


def test_a_run_without_stage_rows_keeps_its_targets():
    data = fake_report()
    data["rows"] = data["rows"][2:]  # the skipped row alone
    text = markdown_summary(data)
    assert "| shape" not in text and "- fp32" not in text
    assert "memory roofline (paper grid's largest planes, fp32): CuPy path not measured" in text


def test_markdown_needs_a_saved_run(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--markdown"])
    assert "--markdown needs --from-json" in capsys.readouterr().err


def test_replay_prints_the_markdown(tmp_path, capsys):
    path = report.write_json(tmp_path / "run.json", fake_report())
    assert bench.main(["--from-json", str(path), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("NVIDIA H200") and "| 64, 96, 56, 56, L5, fp32 |" in out
    assert "Inference (forward only)" not in out  # the text tables are not printed
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # nothing drawn or written
