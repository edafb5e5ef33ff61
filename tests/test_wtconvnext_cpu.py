"""CPU tests of the WTConvNeXt end-to-end scripts (``benchmarks/wtconvnext.py``, ``ddp_check.py``).

Everything runs on the tiny stand-in network: the WTConv2d binding's CPU path
(the float64 oracle) is slow, so images are 32x32 and batches 2 to 4. The GPU
runs themselves (throughput on an H200, NCCL) are not exercised here.
"""

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import ddp_check  # noqa: E402
import wtconvnext as wn  # noqa: E402
from materialising import MaterialisingWTConv2d  # noqa: E402

from wtconv_cuda.bindings.torch import WTConv2d  # noqa: E402

#: Parameters of timm's convnext_tiny (1000 classes).
CONVNEXT_T_PARAMS = 28_589_128


def run_script(name, *args, timeout=120):
    """Run a benchmarks/ script on the CPU (CUDA hidden) and return the finished process."""
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                     else "")
    return subprocess.run([sys.executable, str(BENCH / name), *map(str, args)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def tiny_pair(dtype=torch.float32, layer_scale=1.0):
    """The tiny WTConvNeXt on WTConv2d and on the materialising layer, same weights.

    Layer scale 1.0 (not ConvNeXt's 1e-6) so that the WTConv layers shape the
    output and a difference between the implementations would show.
    """
    ours, other, source = wn.build_wtconv_pair(tiny=True, num_classes=10,
                                               ls_init_value=layer_scale)
    assert source == "tiny"
    return ours.to(dtype), other.to(dtype)


def normwise_rel(a, b):
    """``max|a - b| / max|b|``."""
    return float((a - b).abs().max() / b.abs().max())


# ---------------------------------------------------------------------------
# Building the networks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("net, layer_cls", [("wtconvnext", WTConv2d),
                                            ("materialising", MaterialisingWTConv2d)])
def test_every_block_gets_a_wtconv_layer_with_its_stage_levels(net, layer_cls):
    model, _ = wn.build_network(net, tiny=True, num_classes=10)
    sites = wn.dw_conv_sites(model)
    assert len(sites) == sum(wn.TINY["depths"])
    for name, stage, block in sites:
        layer = block.conv_dw
        assert type(layer) is layer_cls, name
        assert layer.wt_levels == wn.STAGE_LEVELS[stage], name
        assert layer.kernel_size == 5 and layer.stride == 1
        assert layer.in_channels == wn.TINY["dims"][stage]
        assert layer.base_conv.bias is not None
        assert len(layer.wavelet_convs) == wn.STAGE_LEVELS[stage]
    # no 7x7 depthwise convolution is left; stem and downsampling are untouched
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert not [m for m in convs if m.kernel_size == (7, 7)]
    assert type(model.stem[0]) is nn.Conv2d and model.stem[0].kernel_size == (4, 4)
    assert type(model.stages[1].downsample[1]) is nn.Conv2d


def test_replacement_names_levels_and_parameter_count():
    model, _ = wn.build_convnext(tiny=True, num_classes=10)
    before = sum(p.numel() for p in model.parameters())
    levels = (3, 2, 1, 0)
    names = wn.replace_dw_convs(model, WTConv2d, levels)
    assert names == ["stages.0.blocks.0.conv_dw", "stages.1.blocks.0.conv_dw",
                     "stages.2.blocks.0.conv_dw", "stages.2.blocks.1.conv_dw",
                     "stages.3.blocks.0.conv_dw"]
    after = sum(p.numel() for p in model.parameters())
    # per channel: 7x7 conv + bias -> 5x5 + bias + scale + L * (4 * 25 + 4)
    expected = before
    for (_, stage, _), c in zip(wn.dw_conv_sites(model), (8, 16, 24, 24, 32)):
        expected += c * (25 + 2 + levels[stage] * 104) - c * 50
    assert after == expected
    with pytest.raises(ValueError, match="one level count per stage"):
        wn.replace_dw_convs(model, WTConv2d, (5, 4, 3))


def test_builtin_convnext_t_has_the_parameters_of_timm_convnext_tiny():
    model, source = wn.build_convnext(arch="builtin")
    assert source == "builtin"
    assert sum(p.numel() for p in model.parameters()) == CONVNEXT_T_PARAMS
    assert [len(s.blocks) for s in model.stages] == [3, 3, 9, 3]
    wt, _ = wn.build_network("wtconvnext", arch="builtin")
    layers = [b.conv_dw for _, _, b in wn.dw_conv_sites(wt)]
    assert [layer.wt_levels for layer in layers] == [5] * 3 + [4] * 3 + [3] * 9 + [2] * 3


def test_builtin_convnext_t_matches_timm_state_dict():
    timm = pytest.importorskip("timm")
    ours, _ = wn.build_convnext(arch="builtin")
    theirs = timm.create_model("convnext_tiny", pretrained=False)
    mine = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert mine == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    names = wn.replace_dw_convs(theirs, WTConv2d)
    assert len(names) == 18 and isinstance(theirs.stages[2].blocks[8].conv_dw, WTConv2d)


def test_pair_starts_from_identical_state_dicts():
    ours, other = tiny_pair()
    a, b = ours.state_dict(), other.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # the two networks do not share tensors
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(ours.parameters(),
                                                            other.parameters()))


def test_conv_dw_receives_channels_last_strides_like_timm():
    assert wn.dw_input_is_channels_last(tiny=True) is True


# ---------------------------------------------------------------------------
# Our layer against the materialising layer inside the network
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float64, 1e-10)])
def test_outputs_and_gradients_match_the_materialising_network(dtype, tol):
    ours, other = tiny_pair(dtype)
    x = torch.randn(2, 3, 32, 32, dtype=dtype, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([3, 7])
    outputs = []
    for model in (ours, other):
        out = model(x)
        nn.functional.cross_entropy(out, y).backward()
        outputs.append(out.detach())
    assert normwise_rel(outputs[0], outputs[1]) < tol
    for (name, p), (_, q) in zip(ours.named_parameters(), other.named_parameters()):
        assert normwise_rel(p.grad, q.grad) < tol, name
    # the WTConv layers' own gradients are among those compared, and not zero
    wavelet = ours.stages[0].blocks[0].conv_dw.wavelet_convs[4].weight.grad
    assert float(wavelet.abs().max()) > 0


def test_a_changed_wavelet_weight_changes_the_output():
    ours, other = tiny_pair(torch.float64)
    with torch.no_grad():
        other.stages[1].blocks[0].conv_dw.wavelet_convs[3].weight[5, 0, 2, 2] += 0.5
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        assert normwise_rel(ours(x), other(x)) > 1e-6


def sanity_args(**overrides):
    """Arguments of run_sanity for a few tiny steps."""
    args = dict(arch="auto", tiny=True, levels=list(wn.STAGE_LEVELS), seed=0,
                data="prototypes", num_images=8, label_noise=0.3, image_size=32,
                num_classes=10, steps=5, batch=2, lr=0.01, momentum=0.9, check_step=4,
                tolerance=1e-3, dtype="float32", device="cpu", layer_scale=1.0)
    args.update(overrides)
    return argparse.Namespace(**args)


# (float64 convolutions are slow on the CPU: 3 steps there, 18 s each on a CI core)
@pytest.mark.parametrize("dtype, tol, data, steps", [("float32", 1e-5, "prototypes", 5),
                                                    ("float64", 1e-12, "random", 3)])
def test_loss_curves_of_both_implementations_match(dtype, tol, data, steps):
    result = wn.run_sanity(sanity_args(dtype=dtype, data=data, steps=steps,
                                       check_step=steps - 1))
    ours, other = result["losses"]["wtconv2d"], result["losses"]["materialising"]
    assert len(ours) == len(other) == steps
    assert result["passed"] and result["rel_diff_at_check"] < tol
    assert result["max_rel_diff_overall"] < tol
    assert result["final_param_max_rel_diff"] < 100 * tol
    # it trained: the loss moved at every step (fresh or new batches, changed weights)
    assert len(set(ours)) == len(ours) and abs(ours[-1] - ours[0]) > 1e-3


@pytest.mark.parametrize("kind", wn.DATASETS)
def test_synthetic_batches_are_deterministic(kind):
    def make():
        return wn.SyntheticData(kind, 16, 10, 3, torch.float64, torch.device("cpu"),
                                num_images=8)

    a, b = make(), make()
    for step in range(5):
        xa, ya = a.batch(step, 4)
        xb, yb = b.batch(step, 4)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert xa.shape == (4, 3, 16, 16) and xa.dtype == torch.float64
        assert int(ya.min()) >= 0 and int(ya.max()) < 10
    assert not torch.equal(a.batch(0, 4)[0], a.batch(1, 4)[0])
    if kind == "random":  # 8 images, batches of 4: step 2 is step 0 again
        assert torch.equal(a.batch(0, 4)[0], a.batch(2, 4)[0])


def test_prototype_labels_follow_the_prototypes_up_to_label_noise():
    data = wn.SyntheticData("prototypes", 16, 10, 0, torch.float32, torch.device("cpu"),
                            label_noise=0.3)
    x, y = data.batch(0, 2000)
    # nearest prototype (the noise is independent of the class)
    flat = data.prototypes.reshape(10, -1)
    nearest = (x.reshape(len(x), -1) @ flat.T - 0.5 * (flat ** 2).sum(1)).argmax(1)
    agree = float((nearest == y).float().mean())
    assert 0.6 < agree < 0.85  # 0.7 + 0.3 / 10 expected
    with pytest.raises(ValueError):
        wn.SyntheticData("imagenet", 16, 10, 0, torch.float32, torch.device("cpu"))


def test_compare_curves():
    same = wn.compare_curves([2.0, 1.0, 0.5], [2.0, 1.0, 0.5], 2, 1e-3)
    assert same["passed"] and same["max_rel_diff_overall"] == 0.0
    off = wn.compare_curves([2.0, 1.0, 0.51], [2.0, 1.0, 0.5], 2, 1e-3)
    assert not off["passed"] and off["rel_diff_at_check"] == pytest.approx(0.02)
    late = wn.compare_curves([2.0, 1.0, 0.6], [2.0, 1.0, 0.5], 1, 1e-3)
    assert late["passed"] and late["max_rel_diff_overall"] == pytest.approx(0.2)
    nan = wn.compare_curves([2.0, float("nan")], [2.0, float("nan")], 1, 1e-3)
    assert not nan["passed"] and math.isinf(nan["rel_diff_at_check"])
    with pytest.raises(ValueError):
        wn.compare_curves([1.0], [1.0, 2.0], 0, 1e-3)
    with pytest.raises(ValueError):
        wn.compare_curves([1.0, 2.0], [1.0, 2.0], 2, 1e-3)


def test_sanity_command_writes_json_and_sets_its_exit_status(tmp_path):
    out = tmp_path / "sanity.json"
    common = ["sanity", "--tiny", "--steps", 4, "--check-step", 3, "--image-size", 32,
              "--batch", 2, "--num-images", 4, "--layer-scale", 1.0]
    done = run_script("wtconvnext.py", *common, "--json", out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sanity PASS" in done.stdout
    data = json.loads(out.read_text())
    assert data["passed"] and len(data["losses"]["wtconv2d"]) == 4
    assert data["numerics"]["cudnn_allow_tf32"] is False
    assert data["numerics"]["cudnn_deterministic"] is False  # benchmark mode: see the docstring
    # a tolerance no run can meet: the command must fail
    done = run_script("wtconvnext.py", *common, "--tolerance", 0)
    assert done.returncode == 1 and "sanity FAIL" in done.stdout, done.stdout + done.stderr


# ---------------------------------------------------------------------------
# Distributed check (gloo, two processes)
# ---------------------------------------------------------------------------


def test_ddp_check_on_two_gloo_processes_passes(tmp_path):
    out = tmp_path / "ddp.json"
    done = run_script("ddp_check.py", "--cpu", "--tiny", "--world-size", 2, "--json", out)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    assert data["passed"] and all(data["checks"].values())
    assert data["settings"]["world_size"] == 2 and data["settings"]["global_batch"] == 4
    grads = data["gradients"]
    assert grads["max_rel_diff"] < 1e-4
    # every parameter was compared, the WTConv layers' included
    assert any(".conv_dw.wavelet_convs.4.weight" in name for name in grads["per_tensor"])
    assert len(grads["per_tensor"]) == sum(1 for _ in wn.build_network(
        "wtconvnext", tiny=True, num_classes=10)[0].parameters())


def test_ddp_check_fails_on_an_injected_fault():
    done = run_script("ddp_check.py", "--cpu", "--tiny", "--world-size", 2, "--inject-fault")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ddp_check FAIL" in done.stdout


def test_compare_tensors_and_verdict():
    ref = {"a": torch.tensor([1.0, -2.0]), "b": torch.zeros(3)}
    same = ddp_check.compare_tensors({k: v.clone() for k, v in ref.items()}, ref)
    assert same["max_abs_diff"] == 0.0 and same["max_rel_diff"] == 0.0
    off = ddp_check.compare_tensors({"a": torch.tensor([1.0, -2.2]), "b": torch.zeros(3)}, ref)
    assert off["worst"] == "a" and off["max_rel_diff"] == pytest.approx(0.1, rel=1e-5)
    with pytest.raises(ValueError):
        ddp_check.compare_tensors({"a": ref["a"]}, ref)
    report = {"gradients": same, "params_after_step": same, "loss_rel_diff": 0.0,
              "cross_rank_max_abs_diff": 0.0}
    assert ddp_check.verdict(report, 1e-4)["passed"]
    assert not ddp_check.verdict(dict(report, gradients=off), 1e-4)["passed"]
    assert not ddp_check.verdict(dict(report, cross_rank_max_abs_diff=1e-9), 1e-4)["passed"]


def test_local_slices_concatenate_to_the_global_batch():
    x = torch.arange(12).reshape(6, 2)
    parts = [ddp_check.local_slice(x, r, 3) for r in range(3)]
    assert torch.equal(torch.cat(parts), x)


# ---------------------------------------------------------------------------
# Throughput command
# ---------------------------------------------------------------------------


def test_throughput_needs_cuda_without_tiny():
    done = run_script("wtconvnext.py", "throughput", "--modes", "eager")
    assert done.returncode == 2
    assert "CUDA is needed" in done.stderr


def test_throughput_cpu_smoke_with_tiny(tmp_path):
    out = tmp_path / "smoke.json"
    done = run_script("wtconvnext.py", "throughput", "--tiny", "--nets", "convnext",
                      "wtconvnext", "--dtypes", "fp32", "--json", out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CPU SMOKE TEST" in done.stdout and "torch.compile configurations are left out" \
        in done.stdout
    data = json.loads(out.read_text())
    assert "SMOKE" in data["label"]
    assert [(r["net"], r["dtype"], r["mode"]) for r in data["rows"]] == [
        ("convnext", "fp32", "eager"), ("wtconvnext", "fp32", "eager")]
    for row in data["rows"]:
        assert row["train"]["img_per_s"] > 0 and row["infer"]["img_per_s"] > 0
        assert row["train"]["runs"] == 3 and row["train"]["memory"] is None
    assert data["rows"][1]["params"] > data["rows"][0]["params"]
    assert data["summary"][0]["train_speedup_vs_convnext"] > 0
    assert data["settings"]["dw_input_channels_last"] is True
    assert "| wtconvnext | fp32 | eager |" in done.stdout


def test_plan_runs_defaults_and_selection():
    runs = wn.plan_runs(wn.NETS, ("fp32", "bf16"), ("eager", "compile"))
    labels = [r.label for r in runs]
    assert labels[:6] == ["convnext/fp32/eager", "wtconvnext/fp32/eager",
                          "materialising/fp32/eager", "convnext/bf16/eager",
                          "wtconvnext/bf16/eager", "materialising/bf16/eager"]
    assert labels[6:] == ["convnext/bf16/compile", "wtconvnext/bf16/compile"]
    eager = wn.plan_runs(wn.NETS, ("fp32", "bf16"), ("eager",))
    assert all(r.mode == "eager" for r in eager) and len(eager) == 6
    more = wn.plan_runs(["wtconvnext"], ["fp32", "bf16"], ["compile"],
                        compile_nets=["wtconvnext"], compile_dtypes=["fp32", "bf16"])
    assert [r.label for r in more] == ["wtconvnext/fp32/compile", "wtconvnext/bf16/compile"]


def _row(net, train, memory, mode="eager"):
    return {"net": net, "dtype": "bf16", "mode": mode,
            "train": {"img_per_s": train, "median_ms": 1.0, "first_call_s": 0.1,
                      "memory": {"peak_above_resident_mib": memory, "resident_mib": 100.0,
                                 "peak_mib": memory + 100.0}},
            "infer": None}


def test_summary_ratios_targets_and_table():
    rows = [_row("convnext", 100.0, 1000.0), _row("wtconvnext", 160.0, 1040.0),
            _row("materialising", 50.0, 3000.0),
            {"net": "convnext", "dtype": "bf16", "mode": "compile", "error": "boom"},
            {"net": "wtconvnext", "dtype": "bf16", "mode": "compile", "skipped": "budget"}]
    [summary] = wn.summarise(rows)
    assert summary["train_speedup_vs_convnext"] == pytest.approx(1.6)
    assert summary["train_speedup_vs_materialising"] == pytest.approx(3.2)
    assert summary["train_memory_vs_convnext"] == pytest.approx(1.04)
    assert summary["train_total_memory_vs_convnext"] == pytest.approx(1140 / 1100)
    assert summary["infer_speedup_vs_convnext"] is None
    assert summary["target_train_speedup_1.5x_met"] is True
    assert summary["target_train_memory_1.05x_met"] is True
    [slow] = wn.summarise([_row("convnext", 100.0, 1000.0), _row("wtconvnext", 90.0, 1100.0)])
    assert slow["target_train_speedup_1.5x_met"] is False
    assert slow["target_train_memory_1.05x_met"] is False
    table = wn.format_table(rows)
    assert "| wtconvnext | bf16 | eager | 160 |" in table and "boom" in table
    assert "skipped: budget" in table


def test_budget_skips_what_would_overrun():
    budget = wn.Budget(100.0, priors={"eager": 10.0, "compile": 60.0})
    assert budget.allows("eager") and budget.allows("compile")
    budget.start -= 50.0
    assert budget.allows("eager") and not budget.allows("compile")
    budget.record("eager", 60.0)
    assert not budget.allows("eager")
    assert wn.Budget(0).allows("compile")


def test_stage_planes_and_precompile_specs():
    assert wn.stage_planes(224) == [56, 28, 14, 7]
    assert wn.stage_planes(64) == [16, 8, 4, 2]
    specs = wn._precompile_specs([(56, 5), (28, 4)], ["float32"])
    # forward and backward (with and without the fused finalize) of each plane, plus one
    # finalize kernel, plus the 56 x 56 forward on one tile with its coarse levels inside
    # and the 28 x 28 split forward (the pre-pass, the coarse problem's forward, the
    # tiles: one plane a block, and four where B is a multiple of four), plus the
    # weights-only backward of each plane (both finalize choices: large batches take dx
    # from the forward kernels) and one wtconv_flip
    from wtconv_cuda.kernels.codegen import FinalizeSpec
    from wtconv_cuda.kernels.coarse import CoarseSpec
    from wtconv_cuda.kernels.flip import FlipSpec
    from wtconv_cuda.kernels.tiles import TileSpec
    assert len(specs) == 7 + 5 + 5 and len(set(specs)) == len(specs)
    kinds = [type(s) for s in specs]
    assert kinds.count(CoarseSpec) == kinds.count(FlipSpec) == kinds.count(FinalizeSpec) == 1
    tiles = sorted((s.tile, s.inner_levels, s.planes) for s in specs if isinstance(s, TileSpec))
    assert tiles == [(32, 0, 1), (32, 0, 4), (56, 3, 1)]
    assert sum(getattr(s, "fused_finalize", False) for s in specs) == 4
    assert sum(getattr(s, "weights_only", False) for s in specs) == 4
