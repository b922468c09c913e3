"""Docs exact by test: every repository path, `module.name`, command-line flag and quoted keyword value in
README.md, docs/*.md and the docstrings of modules and tests resolves: the file exists, the name imports (a
module's top-level name, or a method or attribute of one of its classes), the flag is defined by the parser of
the command run on the same line (quoted alone: by some command of the repository), and in `cache="..."`-style
arguments the string is one the code knows. A stale reference fails here, naming where it is."""
import ast
import glob
import importlib
import inspect
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TOP = ("nanomars", "experiments", "tests", "tools", "docs", "notebooks", "data", "config", ".ci")
PATH = re.compile(r"(?<![\w./<-])((?:%s)/[\w./<>*-]*|(?:train|sample)\.py|README\.md|requirements(?:-test)?\.txt)"
                  % "|".join(re.escape(t) for t in TOP))
LINK = re.compile(r"\]\(([^)#\s]+)")
DOTTED = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
SCRIPT = re.compile(r"\bpython3? ((?:[\w.-]+/)*[\w-]+\.py)\b")  # a command run: python <script>
KEYWORD = re.compile(r"\b([a-z_]+)=\"([\w-]+)\"")  # cache="request"
EXTENSIONS = {"py", "md", "jsonl", "json", "ipynb", "sh", "txt", "png", "pt", "safetensors", "tiktoken", "log"}
EXTERNAL = re.compile(r"\b(torchrun|pytest|pip|git|jupyter|nbconvert|huggingface-cli|hf)\b")
WRITTEN_WHEN_NEEDED = {"experiments/competent_grid_superseded.jsonl",  # a runner writes these only to set rows aside
                       "experiments/sft_on_pretrained_superseded.jsonl",
                       "experiments/sft_on_pretrained.jsonl"}  # written once the pilot has chosen a setting


def texts():
    """(where, text) of every doc page and every module's and test's docstring."""
    for path in ["README.md", *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]:
        path = os.path.relpath(os.path.join(ROOT, path), ROOT)
        yield path, open(os.path.join(ROOT, path)).read()
    for path in sorted(glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, ROOT)
        if not rel.startswith(TOP[:-1] + ("train.py", "sample.py")):
            continue
        tree = ast.parse(open(path).read())
        nodes = [tree] + ([n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
                          if rel.startswith("tests/") else [])
        for node in nodes:
            doc = ast.get_docstring(node)
            if doc:
                yield f"{rel}:{getattr(node, 'lineno', 1)}", doc


# ------------------------------------------------------------------------------------------------- paths
def stale_paths(where, text):
    bad = []
    folder = os.path.dirname(where.split(":")[0]) if where.endswith(".md") else ""
    for path in PATH.findall(text):
        path = path.rstrip(".,:;)")
        if "*" in path or "<" in path or path in WRITTEN_WHEN_NEEDED:
            continue  # a pattern or a placeholder, not one file
        if not os.path.exists(os.path.join(ROOT, path)) and not module_attribute(path):
            bad.append(path)
    if where.endswith(".md"):
        for link in LINK.findall(text):
            if not link.startswith(("http:", "https:", "mailto:")) and not os.path.exists(os.path.join(ROOT, folder, link)):
                bad.append(link)
    return bad


def module_attribute(path):
    """experiments/powered_eval.train_set: a name in a module quoted by its path."""
    head, _, name = path.rpartition(".")
    return bool(head) and os.path.exists(os.path.join(ROOT, head + ".py")) and \
        resolves(".".join([*head.split("/"), name]))


# ----------------------------------------------------------------------------------------- module.name
def repo_modules():
    """basename -> [importable module names], for every module and package of the repository's code."""
    found = {}
    for path in glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True):
        rel = os.path.relpath(path, ROOT)
        if not rel.startswith(("nanomars/", "experiments/", "tools/", "data/")):
            continue
        name = rel[:-3].replace(os.sep, ".").removesuffix(".__init__")
        for part in range(len(name.split("."))):
            found.setdefault(name.split(".")[part], set()).add(".".join(name.split(".")[:part + 1]))
    return {k: sorted(v) for k, v in found.items()}


MODULES = repo_modules()


def resolves(dotted):
    """Whether a.b.c names something: the longest importable prefix, then attributes (or a class's method)."""
    first, *rest = dotted.split(".")
    for base in MODULES.get(first, [first]):
        parts = base.split(".") + rest
        for cut in range(len(parts), len(base.split(".")) - 1, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            names = parts[cut:]
            if all_attrs(obj, names):
                return True
            break
    return False


def all_attrs(obj, names):
    for i, name in enumerate(names):
        if hasattr(obj, name):
            obj = getattr(obj, name)
            continue
        if inspect.ismodule(obj) and i == len(names) - 1:  # engine.step, model.lm_head: one of its classes'
            classes = [c for _, c in inspect.getmembers(obj, inspect.isclass) if c.__module__ == obj.__name__]
            return any(hasattr(c, name) or f"self.{name} =" in inspect.getsource(c) for c in classes)
        return False
    return True


def stale_names(text):
    bad = []
    for dotted in DOTTED.findall(text):
        first, last = dotted.split(".")[0], dotted.split(".")[-1]
        if first in MODULES and last not in EXTENSIONS and not resolves(dotted):
            bad.append(dotted)
    return bad


# ------------------------------------------------------------------------------------------------- flags
def defined_flags(script):
    """Every flag the script's parser defines: add_argument strings in the script and in the repository's
    modules it imports (train.py's flags live in nanomars/util/train_args.py); each switch's negative form too."""
    seen, todo, flags = set(), [os.path.join(ROOT, script)], set()
    while todo:
        path = todo.pop()
        if path in seen or not os.path.exists(path):
            continue
        seen.add(path)
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo.append(os.path.join(ROOT, *node.module.split(".")) + ".py")
    return flags | {"--no-" + f[2:] for f in flags} | {"--help"}


SCRIPTS = [os.path.relpath(p, ROOT) for p in [*glob.glob(os.path.join(ROOT, "*.py")),
                                               *glob.glob(os.path.join(ROOT, "tools", "*.py")),
                                               *glob.glob(os.path.join(ROOT, "experiments", "*.py"))]]
ANY_FLAG = set().union(*(defined_flags(s) for s in SCRIPTS))


def stale_flags(text):
    bad = []
    for line in text.splitlines():
        for m in FLAG.finditer(line):
            before = line[:m.start()]
            if EXTERNAL.search(before):
                continue  # another program's flag (torchrun, pytest, pip, git, jupyter)
            scripts = [s for s in SCRIPT.findall(before) if os.path.exists(os.path.join(ROOT, s))
                       or os.path.exists(os.path.join(ROOT, "tools", s))]
            script = scripts[-1] if scripts else None
            if script and not os.path.exists(os.path.join(ROOT, script)):
                script = os.path.join("tools", script)
            flags = defined_flags(script) if script else ANY_FLAG
            if m.group(1) not in flags:
                bad.append(f"{m.group(1)}" + (f" (of {script})" if script else ""))
    return bad


def code_strings():
    """Every string constant in the code a user calls (nanomars/, tools/, train.py, sample.py)."""
    found = set()
    for path in [*glob.glob(os.path.join(ROOT, "nanomars", "**", "*.py"), recursive=True),
                 *glob.glob(os.path.join(ROOT, "tools", "*.py")), *glob.glob(os.path.join(ROOT, "*.py"))]:
        found |= {n.value for n in ast.walk(ast.parse(open(path).read()))
                  if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return found


CODE_STRINGS = code_strings()


def stale_values(text):
    return [f'{k}="{v}"' for k, v in KEYWORD.findall(text) if v not in CODE_STRINGS]


SOURCES = list(texts())


@pytest.mark.parametrize("where,text", SOURCES, ids=[w for w, _ in SOURCES])
def test_every_quoted_path_name_and_flag_resolves(where, text):
    stale = {"paths": stale_paths(where, text), "module.names": stale_names(text), "flags": stale_flags(text),
             "keyword values": stale_values(text)}
    assert not any(stale.values()), f"{where}: stale references {stale}"


def test_the_checker_finds_a_stale_reference_of_each_kind():
    text = ("see nanomars/windows.py and [the page](nowhere.md); strategies.NoSuchWindow; "
            "python train.py --no_such_flag; python tools/bench.py --stage ar; cache=\"paper_block\"")
    assert stale_paths("docs/x.md", text) == ["nanomars/windows.py", "nowhere.md"]
    assert stale_names(text) == ["strategies.NoSuchWindow"]
    assert stale_flags(text) == ["--no_such_flag (of train.py)", "--stage (of tools/bench.py)"]
    assert stale_values(text) == ['cache="paper_block"']
    fine = ("nanomars/strategies.py, strategies.AdaptiveWindow, engine.step, python train.py --no-random_offsets "
            "--epochs 4, torchrun --standalone train.py, cache=\"request\", experiments/powered_eval.train_set")
    assert (stale_paths("docs/x.md", fine), stale_names(fine), stale_flags(fine), stale_values(fine)) == ([],) * 4


ISSUE = re.compile(r"\bissues? ?#?\d+", re.I)


def test_no_issue_numbers_in_file_names_docs_docstrings_or_notebooks():
    """An issue number means nothing to a reader of the repository: name each thing by what it is or asks
    (results files keep their rows as they are)."""
    import subprocess
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    named = [f for f in files if ISSUE.search(f.replace("_", " ")) or re.search(r"issue\d", f, re.I)]
    notebooks = [(f, ISSUE.findall(open(os.path.join(ROOT, f)).read())) for f in files if f.endswith(".ipynb")]
    found = [(w, ISSUE.findall(t)) for w, t in SOURCES] + notebooks
    assert not named and not [(w, hits) for w, hits in found if hits]
