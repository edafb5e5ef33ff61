"""``python -m wtconv_cuda.bench`` on a CPU, and the benchmark's pure helpers (no timing asserts)."""

import datetime
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wtconv_cuda import bench
from wtconv_cuda._bench import core, report
from wtconv_cuda._bench.core import Config

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------
# The command on a machine without CUDA
# ---------------------------------------------------------------------------


def run_bench(args, cwd):
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU-only even on a GPU machine
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                     else "")
    return subprocess.run([sys.executable, "-m", "wtconv_cuda.bench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_quick_run_on_cpu_prints_the_label_and_exits_0(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "demo.json"
    done = run_bench(["--quick", "--json", str(out)], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == bench.CPU_LABEL
    assert "correctness against the float64 oracle: OK" in done.stdout
    assert "materialising PyTorch" in done.stdout
    data = json.loads(out.read_text())
    assert data["mode"] == "cpu-demo" and data["ok"] is True
    assert set(data["rows"]) == {"ours", "materialising", "dw7"}
    for name in ("ours", "materialising"):
        row = data["rows"][name]
        assert row["ok"] and row["forward_ms"] > 0 and row["training_ms"] > 0
    assert data["materialising"].endswith("materialising.py")
    # nothing written into the working directory but the requested file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.json"]


def test_cpu_run_without_json_writes_no_file(tmp_path):
    pytest.importorskip("torch")
    done = run_bench(["--quick", "--shapes", "convnext", "--dtypes", "fp16"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert bench.CPU_LABEL in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_bad_dtype_is_a_usage_error(tmp_path):
    done = run_bench(["--dtypes", "int8"], cwd=tmp_path)
    assert done.returncode == 2
    assert "unknown dtype" in done.stderr


def test_cpu_demo_without_the_materialising_file(capsys):
    pytest.importorskip("torch")
    from wtconv_cuda._bench.cpu_demo import run_cpu_demo

    cls, origin = bench.find_materialising(ROOT / "benchmarks" / "no_such_file.py")
    assert cls is None and "not found" in origin
    result = run_cpu_demo(quick=True, materialising=None)
    assert result["ok"] and set(result["rows"]) == {"ours", "dw7"}
    assert "OK" in capsys.readouterr().out


# ---------------------------------------------------------------------------
# Grids and dtypes
# ---------------------------------------------------------------------------


def test_grids():
    assert [c.shape for c in core.CONVNEXT_T] == [(64, 96, 56, 56), (64, 192, 28, 28),
                                                  (64, 384, 14, 14), (64, 768, 7, 7)]
    assert [c.levels for c in core.CONVNEXT_T] == [5, 4, 3, 2]
    paper = core.paper_grid()
    assert len(paper) == 27
    assert {(c.batch, c.kernel_size) for c in paper} == {(8, 5)}
    assert {c.channels for c in paper} == {32, 64, 128}
    assert {c.height for c in paper} == {128, 256, 512} and all(c.height == c.width
                                                                for c in paper)
    assert {c.levels for c in paper} == {1, 3, 5}
    assert len(core.select_configs("all")) == 31
    assert len(core.select_configs("convnext", quick=True)) == 4
    quick = core.select_configs("paper", quick=True)
    assert len(quick) == 2 and set(quick) <= set(paper)
    with pytest.raises(ValueError):
        core.select_configs("imagenet")


def test_ordered_work_puts_convnext_first_then_small_to_large():
    configs = core.select_configs("all")
    work = core.ordered_work(configs, ["float32", "float16"])
    assert len(work) == 2 * 31
    assert all(c.grid == "convnext" for c, _ in work[:8])
    elements = [c.batch * c.channels * c.height * c.width for c, _ in work[8:]]
    assert elements == sorted(elements)
    assert work[8][1] == "float32" and work[9][1] == "float16"


def test_parse_dtypes():
    assert core.parse_dtypes(["fp32", "bf16,fp16"]) == ["float32", "bfloat16", "float16"]
    assert core.parse_dtypes(["float16", "half"]) == ["float16"]
    with pytest.raises(ValueError):
        core.parse_dtypes(["int8"])
    with pytest.raises(ValueError):
        core.parse_dtypes([","])


def test_config_label():
    assert Config(64, 96, 56, 56, 5).label == "64x96x56x56 L5"


# ---------------------------------------------------------------------------
# Bytes, roofline, speedups
# ---------------------------------------------------------------------------


def test_compulsory_bytes_stride_1_is_2x_and_5x_of_x():
    b = core.compulsory_bytes((64, 96, 56, 56), 4)
    x = 64 * 96 * 56 * 56 * 4
    assert b["x"] == x == 77_070_336
    assert b["inference"] == 2 * x
    assert b["backward"] == 3 * x
    assert b["training"] == 5 * x
    assert core.compulsory_bytes((1, 1, 3, 3), 2)["training"] == 5 * 18


def test_compulsory_bytes_with_stride():
    b = core.compulsory_bytes((1, 2, 5, 7), 4, stride=2)
    x, y = 1 * 2 * 5 * 7 * 4, 1 * 2 * 3 * 4 * 4
    assert (b["x"], b["y"]) == (x, y)
    assert b["inference"] == x + y and b["backward"] == 2 * x + y
    assert b["training"] == 3 * x + 2 * y


def test_itemsize_and_tensor_bytes():
    assert [core.itemsize_of(d) for d in core.DTYPES] == [4, 2, 2]
    assert core.tensor_bytes((2, 3, 4), 2) == 48


def test_floor_and_roofline():
    # the H200 numbers of benchmarks/NOTES.md: 154 MB at 4.07 TB/s is 37.9 us
    floor = core.floor_ms(2 * 77_070_336, 4.07e12)
    assert floor == pytest.approx(0.03787, rel=1e-3)
    assert core.roofline_fraction(2 * 77_070_336, 0.5296, 4.07e12) == pytest.approx(0.0715,
                                                                                    rel=1e-2)
    assert core.roofline_fraction(1000, 1.0, 1e6) == pytest.approx(1.0)
    assert core.roofline_fraction(1000, None, 1e6) is None
    assert core.roofline_fraction(1000, 1.0, None) is None
    assert core.roofline_fraction(1000, 0.0, 1e6) is None


def test_speedup():
    assert core.speedup(2.0, 0.5) == 4.0
    assert core.speedup(None, 1.0) is None and core.speedup(1.0, None) is None
    assert core.speedup(1.0, 0.0) is None


# ---------------------------------------------------------------------------
# The median timing loop with a fake timer
# ---------------------------------------------------------------------------


class FakeTimer:
    """A clock that only the benchmarked function advances."""

    def __init__(self):
        self.now = 0.0
        self.syncs = 0
        self.marks = 0

    def mark(self):
        self.marks += 1
        return self.now

    def sync(self):
        self.syncs += 1

    @staticmethod
    def elapsed_ms(start, stop):
        return stop - start


def test_time_median_times_only_the_repeats_and_rotates_inputs():
    timer = FakeTimer()
    calls = []
    durations = iter([100.0, 100.0, 100.0] + [5.0, 1.0, 3.0, 2.0, 4.0])

    def fn(tag):
        calls.append(tag)
        timer.now += next(durations)

    timing = core.time_median(fn, [("a",), ("b",), ("c",)], timer, repeat=5, warmup=3)
    assert calls == ["a", "b", "c", "a", "b", "c", "a", "b"]
    assert timing == core.Timing(median_ms=3.0, min_ms=1.0, max_ms=5.0, runs=5)
    assert timer.marks == 10 and timer.syncs >= 2


def test_time_median_even_count_and_no_warmup():
    timer = FakeTimer()
    durations = iter([1.0, 2.0, 3.0, 10.0])

    def fn():
        timer.now += next(durations)

    timing = core.time_median(fn, [()], timer, repeat=4, warmup=0)
    assert timing.median_ms == 2.5 and timing.runs == 4


def test_time_median_rejects_bad_arguments():
    with pytest.raises(ValueError):
        core.time_median(lambda: None, [()], FakeTimer(), repeat=0)
    with pytest.raises(ValueError):
        core.time_median(lambda: None, [()], FakeTimer(), warmup=-1)
    with pytest.raises(ValueError):
        core.time_median(lambda: None, [], FakeTimer())


def test_perf_counter_timer_with_a_fake_clock():
    ticks = iter([1.0, 1.25])
    synced = []
    timer = core.PerfCounterTimer(sync=lambda: synced.append(1), clock=lambda: next(ticks))
    a, b = timer.mark(), timer.mark()
    assert timer.elapsed_ms(a, b) == 250.0 and len(synced) == 2


def test_host_time_per_call():
    clock = {"t": 0.0}
    synced = []

    def fn():
        clock["t"] += 2e-6

    def sync():  # the device finishes 3 us after the last call returned
        synced.append(1)
        clock["t"] += 3e-6 * (len(synced) == 2)

    times = core.host_times_per_call(fn, calls=10, warmup=5, sync=sync, clock=lambda: clock["t"])
    assert times.queued_us == pytest.approx(2.0)
    assert times.wall_us == pytest.approx(2.3)
    assert len(synced) == 2
    synced.clear()
    us = core.host_time_per_call(fn, calls=10, warmup=5, sync=sync, clock=lambda: clock["t"])
    assert us == pytest.approx(2.3)  # the end-to-end time
    for timer in (core.host_time_per_call, core.host_times_per_call):
        with pytest.raises(ValueError):
            timer(fn, calls=0)


def test_budget_guard():
    now = {"t": 100.0}
    guard = core.BudgetGuard(60.0, clock=lambda: now["t"])
    assert guard.allows(1e12)  # nothing measured yet: no prediction
    now["t"] += 10.0
    guard.record(1000, 5.0)
    assert guard.predict(2000) == 10.0
    assert guard.allows(2000)  # 10 + 10 <= 60
    assert not guard.allows(20000)  # 10 + 100 > 60
    now["t"] += 55.0
    assert not guard.allows(1)
    assert core.BudgetGuard(0).allows(1e30) and core.BudgetGuard(None).allows(1e30)


def test_simple_progress_bar_logs_one_line_per_step():
    stream = io.StringIO()
    bar = core.SimpleProgress(3, "bench", stream=stream, width=6)
    bar.set_postfix_str("64x96x56x56 L5 float32")
    bar.update()
    bar.update(5)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("bench [##----] 1/3") and lines[0].endswith("L5 float32")
    assert "[######] 3/3" in lines[1]
    assert hasattr(core.progress_bar(2, enable=False), "update")


def test_names_and_paths():
    assert core.device_slug("NVIDIA H200") == "nvidia-h200"
    assert core.device_slug("  ") == "unknown"
    path = core.default_json_path("benchmarks/results", "NVIDIA H200", datetime.date(2026, 12, 1))
    assert path == Path("benchmarks/results/bench-nvidia-h200-2026-12-01.json")


# ---------------------------------------------------------------------------
# Tables, JSON and plot
# ---------------------------------------------------------------------------


def test_format_table():
    text = report.format_table(["config", "ms"], [["a", "1.000"], ["bbb", "10.000"]])
    assert text.splitlines() == ["config      ms", "------  ------", "a        1.000",
                                 "bbb     10.000"]
    with pytest.raises(ValueError):
        report.format_table(["a", "b"], [["1"]])
    assert (report.fmt_ms(None), report.fmt_times(2.5), report.fmt_pct(0.071),
            report.fmt_mib(3 * 2**20)) == ("-", "2.50x", "7.1%", "3")


def fake_row(label="64x96x56x56 L5", dtype="float32", skipped=False):
    row = {"label": label, "dtype": dtype, "grid": "convnext", "shape": [64, 96, 56, 56],
           "levels": 5, "kernel_size": 5,
           "compulsory_bytes": {"inference": 2 * 77070336, "training": 5 * 77070336}}
    if skipped:
        row["skipped"] = "time budget"
        return row
    row.update({
        "inference_ms": {"ours": 0.5, "cupy": 0.49, "materialising": 2.0, "dw7": 0.6},
        "training_ms": {"ours": 2.0, "cupy": 1.75, "materialising": 8.0, "dw7": 3.0},
        "training_peak_bytes": {"ours": 300 * 2**20, "materialising": 3000 * 2**20,
                                "dw7": 400 * 2**20},
        "speedup": {"inference_vs_dw7": 1.2, "inference_vs_materialising": 4.0,
                    "training_vs_dw7": 1.5, "training_vs_materialising": 4.0},
        "roofline": {"inference": {"ours": 0.07}, "training": {"ours": 0.04}},
        "check": {"y": 1e-7, "dx": 2e-7, "dweights": 3e-7, "ok": True},
        "errors": {},
    })
    return row


def fake_report():
    return {"device": "NVIDIA H200", "date": "2026-12-01T10:00:00", "copy_bandwidth": 4.07e12,
            "options": {"repeats": 30, "rotations": 3},
            "host_overhead": {"shape": [1, 8, 16, 16], "levels": 3, "calls": 500,
                              "us": {"ours": {"forward_us": 44.0, "training_us": 140.0},
                                     "cupy": {"forward_us": 30.0, "training_us": 95.5,
                                              "training_queued_us": 61.25,
                                              "training_rounds_us": [95.5, 60.25, 104.0]},
                                     "dw7": {"error": "RuntimeError: boom"}}},
            "rows": [fake_row(), fake_row(dtype="float16"),
                     fake_row("8x128x512x512 L5", skipped=True)]}


def test_render_report():
    text = report.render_report(fake_report())
    assert "copy bandwidth: 4.07 TB/s" in text
    assert "64x96x56x56 L5" in text and "4.00x" in text and "1.20x" in text
    assert "7.0%" in text and "ok 3e-07" in text
    assert "skipped (time budget)" in text
    assert "1 configurations skipped" in text
    assert "44.0" in text and "error" in text
    assert "1.750" in text and "95.5" in text  # the CuPy path's training step and its host cost
    assert "61.2" in text and "step queued us" in text  # a row without the queued time reads "-"
    host_rows = {line.split()[0]: line.split()
                 for line in text.split("Host overhead")[1].split("Targets")[0].splitlines()
                 if line.startswith(("ours", "cupy"))}
    # rows without rounds (runs before 2026-12-07) read "-"; with them, their range
    assert host_rows["ours"][-2:] == ["-", "-"]
    assert host_rows["cupy"][-2:] == ["61.2", "60.2-104.0"]
    assert "500 calls)" in text
    rounds = fake_report()
    rounds["host_overhead"]["rounds"] = 3
    assert "500 calls, median of 3 rounds)" in report.render_report(rounds)


def test_exit_status():
    data = fake_report()
    assert bench._exit_status(data) == 0
    data["rows"][1]["check"]["ok"] = False
    assert bench._exit_status(data) == 1
    data["rows"][1]["check"]["ok"] = True
    data["rows"][0]["errors"] = {"materialising/training": "OutOfMemoryError"}
    assert bench._exit_status(data) == 0
    data["rows"][0]["errors"] = {"ours/training": "CompileError"}
    assert bench._exit_status(data) == 1


def test_json_round_trip_and_replay(tmp_path, capsys):
    path = report.write_json(tmp_path / "sub" / "run.json", fake_report())
    assert report.read_json(path)["rows"][0]["label"] == "64x96x56x56 L5"
    assert [p.name for p in path.parent.iterdir()] == ["run.json"]  # no temporary left
    assert bench.main(["--from-json", str(path), "--no-plot"]) == 0
    assert "Training step" in capsys.readouterr().out


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = report.plot_speedups(fake_report(), tmp_path / "plot.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.plot_speedups({"rows": []}, tmp_path / "none.png") is None


# ---------------------------------------------------------------------------
# The device measurement code, run on CPU tensors
# ---------------------------------------------------------------------------


def test_measure_config_on_cpu_tensors():
    torch = pytest.importorskip("torch")
    from wtconv_cuda._bench import measure

    materialising, _ = bench.find_materialising()
    runtime = measure.Runtime(torch, "cpu")
    opts = measure.MeasureOptions(repeats=2, warmup=1, rotations=2, host_calls=2)
    row = measure.measure_config(Config(2, 3, 13, 11, 2), "float32", runtime, opts,
                                 materialising, bandwidth=1e10)
    assert row["errors"] == {}
    assert set(row["inference_ms"]) == {"ours", "materialising", "dw7"}
    assert set(row["training_ms"]) == {"ours", "materialising", "dw7"}
    assert row["check"]["ok"] and row["check"]["dweights"] < 1e-5
    assert row["compulsory_bytes"] == {"inference": 2 * 2 * 3 * 13 * 11 * 4,
                                       "training": 5 * 2 * 3 * 13 * 11 * 4}
    # 13 x 11, then 7 x 6 and 4 x 3 for each of four subbands, K 5
    forward = 2 * 3 * 25 * (13 * 11 + 4 * (7 * 6 + 4 * 3))
    assert row["multiply_adds"] == {"inference": forward, "backward": 2 * forward,
                                    "training": 3 * forward}
    assert row["training_peak_bytes"]["ours"] is None  # no memory statistics on the CPU
    assert set(row["speedup"]) == {"inference_vs_dw7", "inference_vs_materialising",
                                   "training_vs_dw7", "training_vs_materialising"}
    assert row["roofline"]["inference"]["ours"] > 0
    json.dumps(row)  # JSON-ready

    overhead = measure.host_overhead(runtime, opts._replace(host_rounds=3), materialising)
    assert set(overhead["us"]) == {"ours", "materialising", "dw7"}
    assert overhead["rounds"] == 3 and overhead["calls"] == 2
    for entry in overhead["us"].values():
        for mode in ("forward", "training"):
            measured = entry[f"{mode}_rounds_us"]
            assert len(measured) == 3 and min(measured) > 0
            assert entry[f"{mode}_us"] == sorted(measured)[1]  # the median round
            assert entry[f"{mode}_us"] >= entry[f"{mode}_queued_us"] > 0

    assert measure.copy_bandwidth(runtime, nbytes=1 << 16, repeats=2) > 0
    assert runtime.name == "cpu" and runtime.peak_bytes(lambda: 1) is None

    skipped = measure.skipped_row(Config(8, 32, 128, 128, 1, grid="paper"), "float16", "x")
    assert skipped["skipped"] == "x" and skipped["x_bytes"] == 8 * 32 * 128 * 128 * 2


def test_measure_config_records_failures_and_goes_on():
    torch = pytest.importorskip("torch")
    from wtconv_cuda._bench import measure

    class Broken:
        @classmethod
        def from_layer(cls, layer):
            class Module(torch.nn.Module):
                def forward(self, x):
                    raise RuntimeError("out of memory (simulated)")
            return Module()

    runtime = measure.Runtime(torch, "cpu")
    opts = measure.MeasureOptions(repeats=1, warmup=0, rotations=1)
    row = measure.measure_config(Config(1, 2, 8, 8, 1), "float32", runtime, opts, Broken)
    assert "materialising/inference" in row["errors"]
    assert "check" in row["errors"]
    assert row["inference_ms"]["ours"] > 0 and "materialising" not in row["inference_ms"]
    assert bench._exit_status({"rows": [row]}) == 0
    # the host row: the failing implementation's entry is its error, the others' rounds go on
    overhead = measure.host_overhead(runtime, opts._replace(host_calls=2, host_rounds=2), Broken)
    assert overhead["us"]["materialising"] == {
        "error": "RuntimeError: out of memory (simulated)"}
    assert len(overhead["us"]["ours"]["training_rounds_us"]) == 2
    assert len(overhead["us"]["dw7"]["forward_rounds_us"]) == 2


def test_gpu_orchestration_dry_run_on_cpu_tensors(monkeypatch, tmp_path, capsys):
    """The GPU entry point end to end, with CPU tensors standing in for the device."""
    import types

    torch = pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    from wtconv_cuda._bench import measure

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)  # restored afterwards
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(__version__="stand-in"))
    monkeypatch.setattr(bench, "select_configs", lambda shapes, quick: [
        Config(1, 2, 8, 8, 1), Config(1, 2, 9, 7, 2, grid="paper")])
    monkeypatch.setattr(measure, "copy_bandwidth", lambda runtime: 1e10)
    args = ["--device", "cpu", "--no-precompile", "--repeats", "2", "--warmup", "1",
            "--host-calls", "2", "--host-rounds", "2", "--dtypes", "fp32", "bf16",
            "--out", str(tmp_path)]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert "Inference (forward only)" in out and "Host overhead" in out
    files = sorted(p.name for p in tmp_path.iterdir())
    assert [f.rsplit(".", 1)[1] for f in files] == ["json", "md", "png"]
    assert files[0].startswith("bench-cpu-")
    summary = (tmp_path / files[1]).read_text()  # the README's form of the run
    assert "| 1, 2, 8, 8, L1, bf16 |" in summary and "- a (1, 8, 16, 16) training step" in summary
    data = json.loads((tmp_path / files[0]).read_text())
    assert data["complete"] and len(data["rows"]) == 4
    assert [(r["label"], r["dtype"]) for r in data["rows"]] == [
        ("1x2x8x8 L1", "float32"), ("1x2x8x8 L1", "bfloat16"),
        ("1x2x9x7 L2", "float32"), ("1x2x9x7 L2", "bfloat16")]
    assert all(r["check"]["ok"] for r in data["rows"])
    assert data["materialising"].endswith("materialising.py")
    assert data["options"]["repeats"] == 2

    # a budget already spent: every configuration is listed as skipped
    budget = str(tmp_path / "budget.json")
    assert bench.main(args + ["--time-budget", "1e-9", "--json", budget, "--no-plot"]) == 0
    data = json.loads(Path(budget).read_text())
    assert [r.get("skipped") for r in data["rows"]] == ["time budget"] * 4


def test_cupy_event_timer_drives_time_median():
    """The CuPy timer speaks the timer protocol (events recorded, elapsed read)."""
    import types

    from wtconv_cuda._bench.core import CupyEventTimer, time_median

    clock = iter(range(0, 1000, 2))

    class Event:
        def record(self):
            self.t = next(clock)

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Event=Event, Device=lambda: types.SimpleNamespace(synchronize=lambda: None),
        get_elapsed_time=lambda a, b: float(b.t - a.t)))
    timing = time_median(lambda: None, [()], CupyEventTimer(fake), repeat=5, warmup=1)
    assert timing.runs == 5 and timing.median_ms == 2.0


def test_event_timers_record_reserved_events():
    """time_median reserves its marks ahead: no event is created, and no stream looked up,
    inside a timed call."""
    import types

    from wtconv_cuda._bench.core import CudaEventTimer, CupyEventTimer, time_median

    created = []

    class Event:
        def __init__(self, **kwargs):
            created.append(self)

        def record(self, stream=None):
            self.t = len(created)

        def elapsed_time(self, other):
            return 1.0

    events_during_calls = []

    def fn():
        events_during_calls.append(len(created))

    stream_lookups = []
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Event=Event, current_stream=lambda device: stream_lookups.append(device),
        synchronize=lambda device: None))
    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Event=Event, Device=lambda: types.SimpleNamespace(synchronize=lambda: None),
        get_elapsed_time=lambda a, b: 1.0))
    for timer in (CudaEventTimer(fake_torch), CupyEventTimer(fake_cupy)):
        created.clear()
        events_during_calls.clear()
        timing = time_median(fn, [()], timer, repeat=7, warmup=2)
        assert timing.runs == 7
        assert len(created) == 14  # all made before the first timed call
        assert set(events_during_calls[2:]) == {14}
    assert len(stream_lookups) == 1  # when the torch timer was made, not per mark


def test_compile_only_runs_the_warmup_for_the_runs_variants(monkeypatch):
    """``--compile-only`` runs the warmup command of the selected grid and dtypes
    (float32 too, for the host-overhead row) without a time limit, imports no torch,
    and exits with the warmup's status."""
    runs = []

    def fake_run(cmd, env):
        runs.append(cmd)
        return subprocess.CompletedProcess(cmd, 3 if "--jobs" in cmd[-2:] and cmd[-1] == "1"
                                           else 0)

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    monkeypatch.setattr(bench, "_import_torch", lambda: pytest.fail("torch was imported"))
    assert bench.main(["--compile-only", "--shapes", "convnext", "--dtypes", "bf16",
                       "--jobs", "3"]) == 0
    cmd, = runs
    assert cmd[1:3] == ["-m", "wtconv_cuda.kernels.warmup"]
    at = cmd.index("--configs")
    assert cmd[at + 1:cmd.index("--jobs")] == ["14x14:3", "16x16:3", "28x28:4", "56x56:5",
                                               "7x7:2"]
    assert cmd[cmd.index("--storage") + 1:at] == ["bfloat16", "float32"]
    assert cmd[-2:] == ["--jobs", "3"]
    assert bench.main(["--compile-only", "--shapes", "convnext", "--jobs", "1"]) == 3
