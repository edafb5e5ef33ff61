"""CPU tests of ``scripts/sweep_left.py``: which cases a cut GPU sweep still owes."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import sweep_left  # noqa: E402

LOG = """\
tests/gpu/test_gpu_kernels.py::test_matches_oracle[1x4x1x7-L0-K9-s1-float16]
[gw8] [  2%] PASSED tests/gpu/test_gpu_kernels.py::test_float64_rejected_on_gpu
[gw9] [  4%] PASSED tests/gpu/test_gpu_kernels.py::test_matches_oracle[1x4x1x7-L0-K9-s1-float16]
[gw1] [  5%] SKIPPED tests/gpu/test_gpu_kernels.py::test_register_backward_matches_oracle[NOTSET]
[gw2] [  6%] FAILED tests/gpu/test_gpu_kernels.py::test_without_bias[shape0]
tests/gpu/test_gpu_kernels.py::test_other_kernel_sizes[11] PASSED
"""


def test_finished_reads_both_xdist_orders_and_skips_failures():
    assert sweep_left.finished(LOG) == {
        "test_float64_rejected_on_gpu",
        "test_matches_oracle[1x4x1x7-L0-K9-s1-float16]",
        "test_register_backward_matches_oracle[NOTSET]",
        "test_other_kernel_sizes[11]",
    }


def test_left_keeps_the_collection_order_and_the_failures():
    collected = ["test_float64_rejected_on_gpu", "test_without_bias[shape0]",
                 "test_matches_oracle[1x4x1x7-L0-K9-s1-float16]", "test_without_bias[shape1]"]
    assert sweep_left.left(collected, [LOG]) == ["test_without_bias[shape0]",
                                                 "test_without_bias[shape1]"]
    assert sweep_left.left(collected, []) == collected


def test_collect_lists_the_sweep_of_the_given_kernel_size_on_a_cpu_machine():
    ids = sweep_left.collect("5")
    oracle = [node for node in ids if node.startswith("test_matches_oracle[")]
    assert oracle and all("-K5-" in node for node in oracle)
    assert len(ids) == len(set(ids))
