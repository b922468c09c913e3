"""The layout is the first documentation: nanomars/ holds the method, read in order, and imports none of its
subpackages (compare/, scale/, util/) in any import form; util/, the plumbing, imports nothing above it (no
compare/, no scale/); every subpackage says who reads it; the method's code and train.py name no peer or
baseline."""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READING_ORDER = ["masks", "model", "dual_track", "decode", "engine", "strategies", "batch_decode"]
SUBPACKAGES = ["compare", "scale", "util"]
PEER = re.compile(r"paper_|medusa|bd3lm|diffusion", re.IGNORECASE)  # the released sampler, Medusa, block diffusion
NO_PEER = [f"nanomars/{name}.py" for name in READING_ORDER] + ["train.py"]


def imported_modules(source, package):
    """Every module a source names in an import, absolute, whatever the form: `import a.b`, `from a.b import
    c` (a.b and a.b.c: c may be a module), `from . import c`, `from ..a import b`. package: the dotted
    package the source's file sits in, for relative imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[:len(parts) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def core_imports(name):
    with open(os.path.join(ROOT, "nanomars", f"{name}.py")) as f:
        return imported_modules(f.read(), "nanomars")


def names_under(modules, prefix):
    return {m for m in modules if m == prefix or m.startswith(prefix + ".")}


@pytest.mark.parametrize("source, package, expected", [
    ("import nanomars.compare.tree", "nanomars", "nanomars.compare"),
    ("import nanomars.compare.tree as t", "nanomars", "nanomars.compare"),
    ("from nanomars.compare import tree", "nanomars", "nanomars.compare"),
    ("from nanomars import compare", "nanomars", "nanomars.compare"),
    ("from . import compare", "nanomars", "nanomars.compare"),
    ("from .compare.tree import best_tree", "nanomars", "nanomars.compare"),
    ("from ..compare import tree", "nanomars.util", "nanomars.compare"),
    ("def f():\n    from .scale import qwen", "nanomars", "nanomars.scale"),
    ("from .engine import splice", "nanomars", "nanomars.engine"),
])
def test_the_import_reader_sees_every_form(source, package, expected):
    assert names_under(imported_modules(source, package), expected)


def test_the_core_imports_no_subpackage():
    for name in READING_ORDER:
        for sub in SUBPACKAGES:
            assert not names_under(core_imports(name), f"nanomars.{sub}"), (name, sub)


def test_the_reading_path_never_imports_forward():
    for i, name in enumerate(READING_ORDER):
        for later in READING_ORDER[i + 1:]:
            assert not names_under(core_imports(name), f"nanomars.{later}"), (name, later)


def above_util(source):
    """What a util/ source imports from the subpackages above it (compare/, scale/)."""
    found = imported_modules(source, "nanomars.util")
    return sorted(set().union(*(names_under(found, f"nanomars.{sub}") for sub in ("compare", "scale"))))


def test_util_imports_nothing_above_it():
    folder = os.path.join(ROOT, "nanomars", "util")
    for name in sorted(f for f in os.listdir(folder) if f.endswith(".py")):
        with open(os.path.join(folder, name)) as f:
            assert not above_util(f.read()), name


def test_the_util_check_sees_the_arrow_that_was_there():
    """checkpoint.py once read Hugging Face folders through scale/qwen.py, imported inside load_model."""
    assert above_util("def load_model(path):\n    from ..scale.qwen import load_qwen") == \
        ["nanomars.scale.qwen", "nanomars.scale.qwen.load_qwen"]
    assert not above_util("from .qwen import load_qwen\nfrom ..model import Decoder")


def test_the_core_is_the_reading_order_and_each_subpackage_says_who_reads_it():
    core = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "nanomars")) if f.endswith(".py"))
    assert core == sorted(READING_ORDER + ["__init__"])
    for sub in SUBPACKAGES:
        with open(os.path.join(ROOT, "nanomars", sub, "__init__.py")) as f:
            doc = ast.get_docstring(ast.parse(f.read()))
        assert doc and "read" in doc, sub  # who reads it, in words


def identifiers(source):
    """Every name the code itself spells (not its strings, comments or docstrings): variables, attributes,
    functions, classes, arguments, keywords, imported modules and names."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg
        elif isinstance(node, ast.alias):
            yield from (node.name, node.asname or "")
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_the_identifier_reader_sees_every_form():
    source = ("import nanomars.compare.medusa as m\nfrom .x import bd3lm_mask\ndef f(diffusion_t, *, k=1):\n"
              "    return g(paper_step=o.medusa_heads, tau=diffusion_t)\nclass Medusa: pass")
    found = set(identifiers(source))
    assert {"nanomars.compare.medusa", "bd3lm_mask", "diffusion_t", "paper_step", "medusa_heads", "Medusa"} <= found
    assert not any(PEER.search(i) for i in identifiers('"""Medusa, bd3lm, diffusion"""\nx = "paper_"  # medusa'))


@pytest.mark.parametrize("path", NO_PEER)
def test_the_method_and_train_py_name_no_peer_or_baseline(path):
    """They live in nanomars/compare/ and plug in: the engine through its Strategy interface and cache
    policies, train.py by finding their objectives by name (dual_track.OBJECTIVES), the losses by taking
    their masks as arguments."""
    with open(os.path.join(ROOT, path)) as f:
        named = sorted({i for i in identifiers(f.read()) if PEER.search(i)})
    assert not named, (path, named)
