"""Host-side helpers of the kernel compiler (no compilation here)."""

import pytest

from wtconv_cuda.kernels.compiler import parse_compute_capability


@pytest.mark.parametrize("text,expected", [("90", (9, 0)), ("86", (8, 6)), ("100", (10, 0)),
                                           ("120", (12, 0)), (90, (9, 0))])
def test_parse_compute_capability(text, expected):
    assert parse_compute_capability(text) == expected
