"""Local Sphinx extension of the wtconv_cuda documentation.

* ``.. example:: NAME.py`` shows ``docs/examples/NAME.py`` (without its marker
  line, see :mod:`example_markers`) with a caption, and adds a note when the
  test suite does not execute it.
* ``.. if-importable:: MODULE`` parses its content only when ``MODULE`` can be
  imported in the build environment (``:not:`` inverts the test). It keeps
  autodoc entries of optional modules (the framework bindings) out of builds
  where they would fail to import. Unlike ``.. only::``, the content of a
  false branch is never parsed.
* ``.. automodule-if-importable:: MODULE`` documents ``MODULE`` with its
  members when it imports, and otherwise shows the directive's content.
* The figures are drawn by ``docs/figures/make_figures.py`` into
  ``docs/_generated/`` when the build starts.
* numpydoc's default type links that need intersphinx are dropped when the
  inventories are not loaded (see :func:`_trim_xref_aliases`).
* NamedTuple field accessors ("Alias for field number N") are left out of
  autodoc (the classes document their fields in an Attributes section), and
  so are re-exports of the public API in other modules (documented once, in
  the public API pages).
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.directives.code import LiteralInclude
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

from example_markers import EXAMPLES, read_marker

logger = logging.getLogger(__name__)

_import_results: dict[str, bool] = {}


def importable(module: str) -> bool:
    """Whether ``module`` imports without error (cached for the build)."""
    if module not in _import_results:
        try:
            importlib.import_module(module)
        except Exception as exc:  # ImportError, or a broken optional dependency
            logger.info("wtconv_docs: %s is not importable (%s: %s)", module,
                        type(exc).__name__, exc)
            _import_results[module] = False
        else:
            _import_results[module] = True
    return _import_results[module]


class IfImportable(SphinxDirective):
    """Parse the content only if the module in the argument imports."""

    required_arguments = 1
    has_content = True
    option_spec = {"not": directives.flag}

    def run(self):
        wanted = "not" not in self.options
        if importable(self.arguments[0]) != wanted:
            return []
        container = nodes.container()
        nested_parse_with_titles(self.state, self.content, container, self.content_offset)
        return container.children


class AutomoduleIfImportable(SphinxDirective):
    """``automodule`` with ``:members:`` if the module imports, else the content.

    The ``automodule`` line is generated here rather than written in the page:
    autosummary scans every page for ``automodule`` lines and imports those
    modules, which would fail (with a warning) for an optional module.
    """

    required_arguments = 1
    has_content = True

    def run(self):
        module = self.arguments[0]
        if importable(module):
            lines = [f".. automodule:: {module}", "   :members:"]
            content = StringList(lines, source=f"<automodule-if-importable {module}>")
        else:
            content = self.content
        container = nodes.container()
        nested_parse_with_titles(self.state, content, container, self.content_offset)
        return container.children


class Example(LiteralInclude):
    """``literalinclude`` of an example file, aware of its execution marker."""

    option_spec = dict(LiteralInclude.option_spec)

    def run(self):
        name = self.arguments[0]
        path = EXAMPLES / name
        try:
            marker = read_marker(path)
        except (OSError, ValueError) as exc:
            return [self.state.document.reporter.warning(
                f"example {name!r}: {exc}", line=self.lineno)]
        self.arguments[0] = f"/examples/{name}"
        self.options.setdefault("language", "python")
        self.options.setdefault("lines", f"{marker.body_start}-")
        tag = "tested" if marker.mode != "not-executed" else "not executed"
        self.options.setdefault("caption", f"docs/examples/{name} ({tag})")
        result = super().run()
        if marker.mode == "not-executed":
            note = nodes.note()
            note += nodes.paragraph(
                text=f"Shown, not executed by the test suite: {marker.reason}.")
            result.insert(0, note)
        return result


def _skip_member(app, what, name, obj, skip, options):
    doc = getattr(obj, "__doc__", None) or ""
    if doc.startswith("Alias for field number"):
        return True
    # A module that re-exports a public class or function (``Tape = api.Tape``)
    # would document it a second time under the same canonical name.
    import wtconv_cuda

    if what == "module" and any(obj is getattr(wtconv_cuda, public, None)
                                for public in wtconv_cuda.__all__):
        return True
    return None


def _trim_xref_aliases(app, config):
    """Drop numpydoc's default type links that cannot work in this build.

    In these docstrings "array" means an array of any supported library, not
    ``numpy.ndarray``. Without intersphinx inventories, numpydoc's explicit-role
    links into the Python and NumPy docs cannot resolve: the ``:ref:`` and
    ``:term:`` ones (``bool``, ``array_like``, ...) would be reported as
    warnings, and the others would render with their ``python:`` prefix.
    """
    aliases = config.numpydoc_xref_aliases_complete
    aliases.pop("array", None)
    if not config.intersphinx_mapping:
        for key, value in list(aliases.items()):
            if value.startswith(":"):
                del aliases[key]


def _make_figures(app):
    script = Path(app.srcdir) / "figures" / "make_figures.py"
    spec = importlib.util.spec_from_file_location("wtconv_docs_figures", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = module.main(Path(app.srcdir) / "_generated")
    logger.info("wtconv_docs: figures %s", ", ".join(p.name for p in written))


def setup(app):
    app.add_directive("example", Example)
    app.add_directive("if-importable", IfImportable)
    app.add_directive("automodule-if-importable", AutomoduleIfImportable)
    app.connect("autodoc-skip-member", _skip_member)
    app.connect("config-inited", _trim_xref_aliases, priority=900)  # after numpydoc's
    app.connect("builder-inited", _make_figures)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
