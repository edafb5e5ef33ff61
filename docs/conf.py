"""Sphinx configuration of the wtconv_cuda documentation.

Build (from the repository root)::

    pip install -e ".[docs]"
    sphinx-build -W -b html docs docs/_build/html

The build needs no network. Cross-references to NumPy, CuPy, PyTorch, JAX and
Python are resolved through intersphinx only when ``WTCONV_DOCS_INTERSPHINX=1``
is set (their inventories are then downloaded at build time); without it those
names render as plain code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# Document the checkout this file belongs to, installed or not.
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

import wtconv_cuda  # noqa: E402

# -- Project -----------------------------------------------------------------

project = "wtconv_cuda"
author = "the wtconv_cuda developers"
copyright = "the wtconv_cuda developers"
release = wtconv_cuda.__version__
version = ".".join(release.split(".")[:2])

# -- General -----------------------------------------------------------------

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "numpydoc",
    "wtconv_docs",
]

templates_path = ["_templates"]
exclude_patterns = ["_build", "_generated", "examples", "figures", "Thumbs.db", ".DS_Store"]
root_doc = "index"
default_role = "code"
pygments_style = "sphinx"
nitpicky = False

# -- Intersphinx (opt-in: it needs the network) ------------------------------

_INVENTORIES = {
    "python": ("https://docs.python.org/3", None),
    "numpy": ("https://numpy.org/doc/stable", None),
    "cupy": ("https://docs.cupy.dev/en/stable", None),
    "torch": ("https://docs.pytorch.org/docs/stable", None),
    "jax": ("https://docs.jax.dev/en/latest", None),
}
intersphinx_mapping = _INVENTORIES if os.environ.get("WTCONV_DOCS_INTERSPHINX") == "1" else {}
intersphinx_timeout = 15

# -- autodoc / autosummary / numpydoc ----------------------------------------

autosummary_generate = True
autosummary_imported_members = False
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the numpydoc sections carry the types
autodoc_preserve_defaults = True

numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True
numpydoc_xref_param_type = True
numpydoc_xref_ignore = "all"
numpydoc_xref_aliases = {
    "WTConvWeights": "wtconv_cuda.WTConvWeights",
    "Saved": "wtconv_cuda.Saved",
    "Tape": "wtconv_cuda.Tape",
    "ndarray": "numpy.ndarray",
    "numpy.ndarray": "numpy.ndarray",
    "cupy.ndarray": "cupy.ndarray",
    "numpy.random.Generator": "numpy.random.Generator",
    "Problem": "wtconv_cuda.kernels.launch.Problem",
    "Weights": "wtconv_cuda.kernels.launch.Weights",
    "Tuning": "wtconv_cuda.kernels.launch.Tuning",
    "Launch": "wtconv_cuda.kernels.launch.Launch",
    "PlaneLayout": "wtconv_cuda.kernels.layout.PlaneLayout",
    "PlaneSpec": "wtconv_cuda.kernels.codegen.PlaneSpec",
    "FinalizeSpec": "wtconv_cuda.kernels.codegen.FinalizeSpec",
    "CupyBackend": "wtconv_cuda.kernels.launch.CupyBackend",
    "SimulatorBackend": "wtconv_cuda.kernels.launch.SimulatorBackend",
}

# -- HTML ----------------------------------------------------------------------

html_theme = "pydata_sphinx_theme"
html_title = f"wtconv_cuda {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 6,
    "secondary_sidebar_items": ["page-toc"],
}
# The guide pages are top-level (no section navigation to show); the API
# reference has sub-pages.
html_sidebars = {"*": [], "api/**": ["sidebar-nav-bs"]}
