"""Host-side helpers of the kernel compiler (no compilation here)."""

import pytest

from wtconv_cuda.kernels.compiler import parse_compute_capability


@pytest.mark.parametrize("text,expected", [("90", (9, 0)), ("86", (8, 6)), ("100", (10, 0)),
                                           ("120", (12, 0)), (90, (9, 0))])
def test_parse_compute_capability(text, expected):
    assert parse_compute_capability(text) == expected


def test_distinct_tells_spec_types_apart():
    """Specs are named tuples: two of different types with the same fields compare equal,
    so de-duplication (warmup, ptxas reports, the kernel caches) goes by type and value."""
    from typing import NamedTuple

    from wtconv_cuda.kernels.codegen import FinalizeSpec
    from wtconv_cuda.kernels.compiler import distinct
    from wtconv_cuda.kernels.flip import FlipSpec

    class Lookalike(NamedTuple):
        kernel_size: int
        storage: str
        threads: int = 128

    finalize, lookalike = FinalizeSpec(5, "float32"), Lookalike(5, "float32")
    assert finalize == lookalike
    assert distinct([finalize, lookalike, finalize, lookalike]) == [finalize, lookalike]
    assert type(distinct([lookalike, finalize])[1]) is FinalizeSpec
    assert FlipSpec("float32", 5) != FinalizeSpec(5, "float32")
