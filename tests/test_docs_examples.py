"""The code shown in the documentation runs, and the API reference is complete.

Every Python example of the Sphinx site is a file under ``docs/examples/``
whose first line says how it is tested (``docs/_ext/example_markers.py``):
``run`` examples are executed here on the CPU path (NumPy arrays only),
``subprocess`` ones in a fresh interpreter, and ``not-executed`` ones (GPU,
PyTorch, JAX) are compiled only. The pages may not contain inline Python, so
nothing shown escapes these tests. The doctests of the public docstrings and
the README's example run too. None of this needs Sphinx.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import wtconv_cuda

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

from example_markers import EXAMPLES, example_files, read_marker  # noqa: E402

#: Pages written by hand (the generated API stubs and the build are excluded).
PAGES = sorted(
    p for p in DOCS.rglob("*.rst")
    if not {"_build", "generated", "_templates"} & set(p.relative_to(DOCS).parts)
)
INCLUDE = re.compile(r"^\s*\.\. (?:example|literalinclude)::\s*(\S+)\s*$", re.M)
INLINE_PYTHON = re.compile(
    r"^\s*(?:\.\. (?:code-block|code|sourcecode)::\s*(?:python|py|pycon|python3|ipython)\b"
    r"|\.\. (?:doctest|testcode|ipython|jupyter-execute)::"
    r"|>>> )",
    re.M,
)
#: Public modules whose docstring examples are doctests.
DOCTEST_MODULES = ["wtconv_cuda.api", "wtconv_cuda.weights", "wtconv_cuda.reference"]


def _examples(*modes):
    return [pytest.param(p, id=p.name) for p in example_files() if read_marker(p).mode in modes]


# ---------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------


def test_there_are_examples_of_every_kind():
    modes = {read_marker(p).mode for p in example_files()}
    assert modes == {"run", "subprocess", "not-executed"}


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in example_files()])
def test_example_has_a_valid_marker(path):
    read_marker(path)  # raises ValueError on a missing or malformed marker


@pytest.mark.parametrize("path", _examples("run"))
def test_cpu_example_runs(path, capsys):
    runpy.run_path(str(path), run_name="__main__")


@pytest.mark.parametrize("path", _examples("subprocess"))
def test_subprocess_example_runs(path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", _examples("not-executed"))
def test_not_executed_example_compiles(path):
    compile(path.read_text(encoding="utf-8"), str(path), "exec")


# ---------------------------------------------------------------------------
# Pages
# ---------------------------------------------------------------------------


def test_pages_are_found():
    names = {p.relative_to(DOCS).as_posix() for p in PAGES}
    assert {"index.rst", "quickstart.rst", "api/public.rst"} <= names


@pytest.mark.parametrize("page", [pytest.param(p, id=p.relative_to(DOCS).as_posix())
                                  for p in PAGES])
def test_page_has_no_untested_python(page):
    text = page.read_text(encoding="utf-8")
    hits = [m.group(0).strip() for m in INLINE_PYTHON.finditer(text)]
    assert not hits, f"inline Python in {page.name}: move it to docs/examples/ ({hits})"
    for target in INCLUDE.findall(text):
        name = target.removeprefix("/examples/")
        assert (EXAMPLES / name).is_file(), f"{page.name} includes missing example {target}"


def test_every_example_is_shown_somewhere():
    shown = set()
    for page in PAGES:
        shown |= {t.removeprefix("/examples/") for t in INCLUDE.findall(page.read_text())}
    unused = sorted(p.name for p in example_files() if p.name not in shown)
    assert not unused, f"examples not included in any page: {unused}"


def test_readme_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README.md has no python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})


@pytest.mark.parametrize("name", DOCTEST_MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(module, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0
    if name != "wtconv_cuda.reference":
        assert result.attempted > 0, f"{name} has no docstring examples"


# ---------------------------------------------------------------------------
# API reference
# ---------------------------------------------------------------------------


def _api_text() -> str:
    return "\n".join(p.read_text() for p in PAGES if p.parent.name == "api")


@pytest.mark.parametrize("name", wtconv_cuda.__all__)
def test_public_name_has_an_api_entry(name):
    text = _api_text()
    obj = getattr(wtconv_cuda, name)
    if inspect.ismodule(obj):
        assert re.search(rf"\.\. automodule:: {re.escape(obj.__name__)}\s*$", text, re.M)
    elif name.startswith("__"):
        assert re.search(rf"\.\. py:data:: {re.escape(name)}\s*$", text, re.M)
    else:  # listed in an autosummary with a generated page
        assert re.search(rf"^   {re.escape(name)}\s*$", text, re.M), f"{name} not in api/*.rst"


def _sections(doc: str) -> dict[str, list[str]]:
    """numpydoc sections of a dedented docstring: title -> body lines."""
    lines = doc.splitlines()
    sections, current = {}, None
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and re.fullmatch(r"-{3,}", lines[i + 1].strip()) and line.strip():
            current = line.strip()
            sections[current] = []
        elif current is not None and not re.fullmatch(r"-{3,}", line.strip()):
            sections[current].append(line)
    return sections


def _documented_names(body: list[str]) -> set[str]:
    names = set()
    for line in body:
        if line and not line[0].isspace():
            names |= {n.strip() for n in line.split(" : ")[0].split(",")}
    return names


def _public_callables():
    for name in wtconv_cuda.__all__:
        obj = getattr(wtconv_cuda, name)
        if inspect.isfunction(obj):
            yield pytest.param(obj, id=name)
        elif inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if inspect.isfunction(member) and not attr.startswith("_"):
                    yield pytest.param(member, id=f"{name}.{attr}")


def _binding_callables():
    for module_name in ("wtconv_cuda.bindings.torch", "wtconv_cuda.bindings.jax"):
        try:
            module = importlib.import_module(module_name)
        except Exception:  # not written yet, or its framework is missing
            continue
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                yield pytest.param(obj, id=f"{module_name}.{name}")


def _returns_a_value(func) -> bool:
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        return True
    return re.search(r"^\s+return\s+(?!None\b)\S", source, re.M) is not None


ARRAY_TYPE = re.compile(r"\b(?:ndarray|array|Tensor)\b")
CONTAINER_TYPE = re.compile(r"\b(?:mapping|dict|sequence|list|tuple)\b")


def _check_array_entries(func, title, body):
    for line in body:
        if line and not line[0].isspace() and " : " in line:
            kind = line.split(" : ", 1)[1]
            if ARRAY_TYPE.search(kind) and not CONTAINER_TYPE.search(kind):
                assert "shape" in kind, f"{func.__qualname__}: {title} without a shape: {line}"


@pytest.mark.parametrize("func", [*_public_callables(), *_binding_callables()])
def test_public_function_docstring_is_complete(func):
    """Parameters (each with a shape if it is an array), Returns and Raises."""
    sections = _sections(inspect.getdoc(func) or "")
    params = [p for p in inspect.signature(func).parameters if p not in ("self", "cls")]
    if _returns_a_value(func):
        assert sections.get("Returns"), f"{func.__qualname__}: no Returns section"
    if params:
        assert sections.get("Raises"), f"{func.__qualname__}: no Raises section"
        documented = _documented_names(sections.get("Parameters", []))
        missing = [p for p in params if p not in documented]
        assert not missing, f"{func.__qualname__}: parameters {missing} not documented"
    for title in ("Parameters", "Returns"):
        _check_array_entries(func, title, sections.get(title, []))


@pytest.mark.parametrize("name", [n for n in wtconv_cuda.__all__
                                  if inspect.isclass(getattr(wtconv_cuda, n))])
def test_public_class_documents_its_fields(name):
    cls = getattr(wtconv_cuda, name)
    documented = _documented_names(_sections(inspect.getdoc(cls)).get("Attributes", []))
    fields = getattr(cls, "_fields", None) or getattr(cls, "__slots__", ())
    public = {field for field in fields if not field.startswith("_")}  # private slots aside
    assert public and public <= documented, f"{name}: fields {fields} vs {documented}"
