"""How a file under ``docs/examples/`` says whether the test suite runs it.

The first line of every example is a marker comment, one of::

    # docs-example: run
    # docs-example: subprocess
    # docs-example: not-executed (why: what it needs)

``run`` examples are executed in-process by ``tests/test_docs_examples.py``;
``subprocess`` examples in a fresh interpreter (for those that must set an
environment variable before an import); ``not-executed`` examples (GPU, PyTorch,
JAX) are only compiled, and the documentation shows them with a note that
gives the reason in parentheses. This module imports nothing from Sphinx so that
the tests can use it without the docs dependencies.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

PREFIX = "# docs-example:"
MODES = ("run", "subprocess", "not-executed")
_PATTERN = re.compile(r"^# docs-example: (?P<mode>[a-z-]+)(?: \((?P<reason>[^()]+)\))?$")

#: Folder of the example files.
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


class Marker(NamedTuple):
    """The parsed marker of one example file.

    Attributes
    ----------
    mode : str
        One of :data:`MODES`.
    reason : str
        Why a ``not-executed`` example is not run (empty for the others).
    body_start : int
        1-based number of the first line shown in the documentation (the
        marker and the blank lines after it are hidden).
    """

    mode: str
    reason: str
    body_start: int


def read_marker(path) -> Marker:
    """Parse the marker line of the example at ``path``.

    Parameters
    ----------
    path : str or pathlib.Path
        An example file.

    Returns
    -------
    Marker

    Raises
    ------
    ValueError
        The first line is not a valid marker, a ``not-executed`` example gives
        no reason, or another mode gives one.
    """
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    match = _PATTERN.match(lines[0]) if lines else None
    if match is None or match["mode"] not in MODES:
        raise ValueError(
            f"{path}: the first line must be '{PREFIX} MODE' with MODE one of {MODES}"
            " ('not-executed' followed by the reason in parentheses)"
        )
    mode, reason = match["mode"], (match["reason"] or "").strip()
    if (mode == "not-executed") != bool(reason):
        raise ValueError(f"{path}: only 'not-executed' examples give a reason, and they must")
    start = 2
    while start <= len(lines) and not lines[start - 1].strip():
        start += 1
    return Marker(mode, reason, start)


def example_files() -> list[Path]:
    """Every example file, sorted by name.

    Returns
    -------
    list of pathlib.Path
    """
    return sorted(EXAMPLES.glob("*.py"))
