"""The benchmark's judgement of the performance targets, on hand-made reports."""

from wtconv_cuda._bench import report
from wtconv_cuda._bench.targets import TARGETS, judge, targets_lines

from .test_bench_cpu import fake_report

TRAIN_MAT, TRAIN_DW7, FORWARD_DW7, ROOFLINE, MEMORY, HOST = TARGETS


def row(label, dtype="float32", grid="convnext", edge=56, *, train=None, forward=None,
        roofline=None, peak=None, skipped=False):
    """A measured row: ``train`` / ``forward`` map an implementation to its time (ms),
    ``roofline`` a path to its forward fraction, ``peak`` an implementation to bytes."""
    out = {"label": label, "dtype": dtype, "grid": grid, "shape": [8, 32, edge, edge]}
    if skipped:
        return {**out, "skipped": "time budget"}
    return {**out, "training_ms": train or {}, "inference_ms": forward or {},
            "roofline": {"inference": roofline or {}},
            "training_peak_bytes": peak or {}}


def stage(label, dtype, cupy, ours, mat=15.0, dw7=3.0):
    """A ConvNeXt-T row whose training steps take ``cupy`` and ``ours`` ms."""
    return row(label, dtype, train={"cupy": cupy, "ours": ours, "materialising": mat,
                                    "dw7": dw7})


def test_a_speedup_target_reads_the_least_row_of_its_dtypes():
    rows = [stage("56", "float32", cupy=0.5, ours=1.0),   # 30x / 15x the materialising layer
            stage("28", "bfloat16", cupy=0.75, ours=1.2),  # 20x / 12.5x
            stage("14", "float16", cupy=5.0, ours=5.0)]    # fp16: not a dtype of the target
    cupy = judge(TRAIN_MAT, {"rows": rows}, "cupy")
    assert cupy.status == "met" and cupy.where == "28 bfloat16" and cupy.value == 20.0
    assert (cupy.measured, cupy.rows) == (2, 2)
    ours = judge(TRAIN_MAT, {"rows": rows}, "ours")
    assert ours.status == "missed" and ours.where == "28 bfloat16" and ours.value == 12.5
    # exactly the bound holds
    assert judge(TRAIN_MAT, {"rows": rows[:1]}, "ours").status == "met"


def test_other_grids_rows_do_not_count_and_missing_rows_are_said():
    rows = [stage("56", "float32", cupy=0.5, ours=1.0),
            row("paper", grid="paper", edge=512, train={"cupy": 9.0, "materialising": 10.0}),
            row("28", "bfloat16", skipped=True)]
    verdict = judge(TRAIN_MAT, {"rows": rows}, "cupy")
    assert verdict.status == "met" and (verdict.measured, verdict.rows) == (1, 2)
    assert "(1 of 2 rows measured)" in "\n".join(targets_lines({"rows": rows}))
    none = judge(TRAIN_MAT, {"rows": rows[1:]}, "cupy")
    assert none.status == "not measured" and none.value is None and none.rows == 1


def test_the_forward_target_covers_every_dtype():
    rows = [row("28", "float16", forward={"cupy": 0.2, "dw7": 0.5}),   # 2.5x
            row("56", "float32", forward={"cupy": 0.1, "dw7": 0.5})]   # 5x
    verdict = judge(FORWARD_DW7, {"rows": rows}, "cupy")
    assert verdict.status == "missed" and verdict.value == 2.5 and verdict.where == "28 float16"


def test_the_roofline_target_reads_the_largest_planes_in_fp32():
    rows = [row("512 L1", grid="paper", edge=512, roofline={"cupy": 0.55}),
            row("512 L3", grid="paper", edge=512, roofline={"cupy": 0.51}),
            row("128 L5", grid="paper", edge=128, roofline={"cupy": 0.10}),
            row("512 bf16", "bfloat16", grid="paper", edge=512, roofline={"cupy": 0.2})]
    verdict = judge(ROOFLINE, {"rows": rows}, "cupy")
    assert verdict.status == "met" and verdict.where == "512 L3 float32"
    assert (verdict.measured, verdict.rows) == (2, 2)
    rows[1]["roofline"]["inference"]["cupy"] = 0.49
    assert judge(ROOFLINE, {"rows": rows}, "cupy").status == "missed"


def test_the_memory_target_reads_the_most_of_every_row_on_the_module_path():
    rows = [row("a", peak={"ours": 110, "dw7": 100}),
            row("b", "bfloat16", grid="paper", edge=512, peak={"ours": 105, "dw7": 100})]
    verdict = judge(MEMORY, {"rows": rows}, "ours")
    assert verdict.status == "met" and verdict.where == "a float32"  # 1.1x holds
    rows[1]["training_peak_bytes"]["ours"] = 111
    assert judge(MEMORY, {"rows": rows}, "ours").status == "missed"
    lines = targets_lines({"rows": rows})
    at = lines.index(MEMORY.name)
    assert lines[at + 1].split()[0] == "WTConv2d" and lines[at + 2] == HOST.name


def test_the_host_target_is_strict():
    def host(us):
        return {"host_overhead": {"us": {"cupy": {"training_us": us}, "ours": {"error": "x"}}}}

    assert judge(HOST, host(149.9), "cupy").status == "met"
    assert judge(HOST, host(150.0), "cupy").status == "missed"
    assert judge(HOST, host(10.0), "ours").status == "not measured"


def test_the_report_prints_the_targets():
    text = report.render_report(fake_report())  # fp32 and fp16 rows of the 56 x 56 stage
    assert "Targets (stated for an H200" in text
    assert "  CuPy path  missed: 4.57x at 64x96x56x56 L5 float32" in text  # 8.0 / 1.75 ms
    assert "  WTConv2d   missed: 4.00x at 64x96x56x56 L5 float32" in text
    assert "  CuPy path  met: 95.5 us" in text
