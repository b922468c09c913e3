"""Docs exact by test: every repository path, `module.name`, command-line flag and quoted keyword value in
README.md, docs/*.md and the docstrings of modules and tests resolves: the file exists, the name imports (a
module's top-level name, or a method or attribute of one of its classes), the flag is defined by the parser of
the command run on the same line (quoted alone: by some command of the repository), and in `cache="..."`-style
arguments the string is one the code knows. A cited section (`docs/mars.md, "The mask"`, `section 3`) exists in
the page it names; a measured number is stated in one results page and linked from the others; a notebook's
stated run time is its saved run's. A stale reference fails here, naming where it is."""
import ast
import glob
import importlib
import inspect
import io
import os
import re
import sys
import tokenize
from datetime import datetime

import nbformat
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
                       "experiments/sft_on_pretrained_superseded.jsonl"}


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


# ------------------------------------------------------------------------------------------ cited sections
PAGE = re.compile(r"(?<![\w/.-])(?:docs/)?([\w-]+\.md)\b")
LEAD = r"^[`'\]]*(?:\([^)]*\.md\))?[`']*(?:'s)?,?\s?\(?"  # what may stand between a page and its cited sections
TITLES = re.compile(LEAD + r'(?:section )?("[^"]+"(?:(?:,? and |, )"[^"]+")*)')
NUMBERS = re.compile(LEAD + r"(?:its )?sections? (\d+(?:(?:,? and |, |-)\d+)*)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def page_path(name):
    return "README.md" if name == "README.md" else f"docs/{name}"


def anchors(page):
    """What a citation of the page may name: each heading (its number apart) and each bold paragraph lead,
    lowercased; and the numbers of its numbered headings."""
    text = FENCE.sub("", open(os.path.join(ROOT, page)).read())
    titles = re.findall(r"^#+ (.+)$", text, re.M) + re.findall(r"(?:^|\n\n)\*\*([^*]+)\*\*", text)
    numbers = {m for t in titles for m in re.findall(r"^(\d+)\. ", t)}
    return [re.sub(r"^\d+\. ", "", t).strip().lower() for t in titles], numbers


def cited_sections(text):
    """(page, cited title or section number) for every citation of a page's section: `docs/mars.md, "The
    mask"`, `docs/mars.md ("Decoding", "Caches")`, `[mars.md](mars.md) sections 3 and 6`."""
    text = " ".join(text.split())
    found = []
    for m in PAGE.finditer(text):
        page = page_path(m.group(1))
        if not os.path.exists(os.path.join(ROOT, page)):
            continue  # not a page of the repository (a stale path is the path check's to report)
        tail = text[m.end():m.end() + 300]
        if titles := TITLES.match(tail):
            found += [(page, title) for title in re.findall(r'"([^"]+)"', titles.group(1))]
        if numbers := NUMBERS.match(tail):
            found += [(page, n) for n in re.findall(r"\d+", numbers.group(1))]
    return found


def missing_sections(text):
    bad = []
    for page, cited in cited_sections(text):
        titles, numbers = anchors(page)
        title = cited.lower()
        if not (cited in numbers if cited.isdigit() else
                any(t == title or t.startswith(title + ":") or t.startswith(title + " ") for t in titles)):
            bad.append(f"{page}: {cited!r}")
    return bad


def comments_and_docstrings(path):
    source = open(path).read()
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    nodes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))]
    return "\n\n".join([d for d in map(ast.get_docstring, nodes) if d] + comments)


def citing_texts():
    """(where, text) of everything that may cite a page's section: the pages, every docstring and comment of
    the code, and every notebook cell's source."""
    for path in ["README.md", *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]:
        yield os.path.relpath(os.path.join(ROOT, path), ROOT), open(os.path.join(ROOT, path)).read()
    for path in sorted(glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True)):
        yield os.path.relpath(path, ROOT), comments_and_docstrings(path)
    for path in sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb"))):
        yield os.path.relpath(path, ROOT), "\n\n".join(c.source for c in nbformat.read(path, as_version=4).cells)


CITING = list(citing_texts())


@pytest.mark.parametrize("where,text", CITING, ids=[w for w, _ in CITING])
def test_every_cited_section_exists_in_the_page_it_names(where, text):
    assert not missing_sections(text), f"{where} cites sections its page does not have: {missing_sections(text)}"


def test_the_section_check_finds_a_missing_title_and_number():
    # planted citations, the page named through {mars} so that this file cites no missing section itself
    text = ('({mars}, "Windows"); `{mars}` ("The mask", "The loss and how far each target is"); '
            '[mars.md](mars.md) sections 3 and 12; {mars}, "Decoding" and "Caches"; docs/paper.md\'s "what '
            'holds now" table; docs/long_runs.md, between its "runs" markers').replace("{mars}", "docs/mars.md")
    want = ["{mars}: 'Windows'", "{mars}: 'The loss and how far each target is'", "{mars}: '12'"]
    assert missing_sections(text) == [w.replace("{mars}", "docs/mars.md") for w in want]


# ---------------------------------------------------------------------------------------- notebook run times
WORDS = {"a": 1, "one": 1, "two": 2, "three": 3, "a few": 3}
DURATION = re.compile(r"\b(?:about|in|under|takes?) (\d+|a few|a|one|two|three) (seconds?|minutes?|s|min)\b"
                      r"(?: or (two|three|\d+))?")


def claimed_seconds(text):
    """(low, high) seconds of each run time the text states: "about 20 seconds", "in a minute or two"."""
    found = []
    for n, unit, upper in DURATION.findall(" ".join(text.split())):
        scale = 60 if unit.startswith("min") else 1
        low = (WORDS[n] if n in WORDS else int(n)) * scale
        found.append((low, (WORDS[upper] if upper in WORDS else int(upper)) * scale if upper else low))
    return found


def recorded_seconds(nb):
    """How long the saved run took: from the first code cell's start to the last one's end, as the kernel
    recorded them."""
    stamps = [c.metadata.get("execution", {}) for c in nb.cells if c.cell_type == "code"]
    start, end = stamps[0].get("iopub.execute_input"), stamps[-1].get("iopub.status.idle")
    assert start and end, "the saved notebook holds no execution times: execute it with nbclient (record_timing)"
    return (datetime.fromisoformat(end.rstrip("Z")) - datetime.fromisoformat(start.rstrip("Z"))).total_seconds()


def contradicted(claims, seconds, slack=1.5):
    """The claims a run of `seconds` contradicts: a stated time more than `slack` times off."""
    return [(low, high) for low, high in claims if high * slack < seconds or low > seconds * slack]


def notebook_time_claims():
    """(notebook, where, claims): each notebook's markdown, and each README or docs list item linking it."""
    for path in sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb"))):
        name = os.path.basename(path)
        cells = nbformat.read(path, as_version=4).cells
        yield name, name, claimed_seconds("\n".join(c.source for c in cells if c.cell_type == "markdown"))
        for page in ["README.md", *glob.glob(os.path.join(ROOT, "docs", "*.md"))]:
            for item in re.split(r"\n(?=\s*(?:\d+\. |- |\[\d\d\]\())|\n\n", open(os.path.join(ROOT, page)).read()):
                if name in item and len(set(re.findall(r"\d\d_\w+\.ipynb", item))) == 1:
                    yield name, os.path.relpath(os.path.join(ROOT, page), ROOT), claimed_seconds(item)


TIME_CLAIMS = [c for c in notebook_time_claims() if c[2]]


@pytest.mark.parametrize("name,where,claims", TIME_CLAIMS, ids=[f"{w}:{n}" for n, w, _ in TIME_CLAIMS])
def test_a_notebooks_stated_run_time_is_its_saved_runs(name, where, claims):
    seconds = recorded_seconds(nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4))
    assert not contradicted(claims, seconds), \
        f"{where} says {name} runs in {claims} seconds; its saved run took {seconds:.0f} s: say so, or drop the time"


def test_the_run_time_check_reads_each_form_and_sees_a_wrong_one():
    text = "Runs on a laptop CPU in about 20 seconds; (about 10 s); in a minute or two; about\n3 minutes; B = 4 s"
    assert claimed_seconds(text) == [(20, 20), (10, 10), (60, 120), (180, 180)]
    assert contradicted(claimed_seconds(text), 72) == [(20, 20), (10, 10), (180, 180)]


# ----------------------------------------------------------------------------------- results in one place
# A measured result is stated once, where a test checks it against its source (docs/paper.md against
# experiments/*.jsonl, tests/test_science_pages.py) or beside the command that printed it (docs/results.md;
# docs/peers.md for the peers' own tasks); paper_history.md is paper.md's record of superseded grids. Every
# other page links there, and no row of numbers stands in two of them.
RESULT_PAGES = {"docs/results.md", "docs/paper.md", "docs/paper_history.md", "docs/peers.md"}
RESULT = re.compile(r"\[[-+]?\d+(?:\.\d+)?, [-+]?\d+(?:\.\d+)?\]"  # an interval
                    r"|\b\d+\.\d+x\b"  # a ratio
                    r"|\b\d\.\d{3}\b"  # an accuracy or seconds, to 3 places
                    r"|\b\d+\.\d+%"  # a share, to a decimal
                    r"|\b\d+\.\d+(?= tokens?(?:/| per )forward)|(?<=per forward \()\d+\.\d+")  # tokens/forward
PAPERS = re.compile(r"\bthe paper\b|\bpaper's\b|\bTable \d+")  # the paper's own figures, quoted as its


def restated_results(text):
    """Each measured number of nanoMARS's a page states, sentence by sentence (a table row is one): a number
    after the paper is named, with no nanoMARS between, is the paper's. Code blocks are sample output."""
    found = []
    for block in FENCE.sub("", text).split("\n\n"):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        prose = " ".join(line for line in block.splitlines() if not line.startswith("|"))
        for sentence in rows + re.split(r"(?<=[.;])\s+", prose):
            for m in RESULT.finditer(sentence):
                before = sentence[:m.start()]
                named = [p.end() for p in PAPERS.finditer(before)]
                if not named or "nanoMARS" in before[named[-1]:]:
                    found.append(m.group(0))
    return found


PAGES = [(w, t) for w, t in SOURCES if w.endswith(".md") and w not in RESULT_PAGES]


@pytest.mark.parametrize("where,text", PAGES, ids=[w for w, _ in PAGES])
def test_a_result_is_stated_in_one_place(where, text):
    assert not restated_results(text), \
        f"{where} restates results {restated_results(text)}: link to docs/results.md or docs/paper.md instead"


def test_the_one_place_check_finds_a_restated_result_and_spares_the_papers():
    text = ("the paper's 0.5B model took 15 -> 33 GPU-hours (2.2x); nanoMARS's default run measures **2.0x**. "
            "In short: +0.8 [-0.1, +1.7] points against AR-SFT, where the paper has +1.7. Fewer than one token per "
            "forward (0.83 at B = 4). 0.403 vs 0.394 (one seed), 3.84 tokens/forward.\n\n"
            "| alpha = 0: the paper's 1/B | 25% | 12.5% |\n| alpha = 0: nanoMARS, exact | 11.5% | 9.6% |\n\n"
            "Wall clock (its Table 5): 1.71x at batch 4, 1.60x at 8.\n\n```\n3.25x fewer forwards\n```")
    assert restated_results(text) == ["2.0x", "[-0.1, +1.7]", "0.83", "0.403", "0.394", "3.84", "11.5%", "9.6%"]


def result_rows(text):
    """The measured numbers of each table row that holds at least three."""
    rows = [tuple(RESULT.findall(line)) for line in text.splitlines() if line.startswith("|")]
    return {row for row in rows if len(row) >= 3}


def test_no_row_of_results_stands_in_two_result_pages():
    rows = {page: result_rows(open(os.path.join(ROOT, page)).read()) for page in sorted(RESULT_PAGES)}
    twice = [(a, b, sorted(rows[a] & rows[b])[:3]) for a in rows for b in rows if a < b and rows[a] & rows[b]]
    assert not twice, f"rows stated in two pages (keep one, link to it): {twice}"


def test_the_row_check_sees_a_copied_row():
    row = "| prompt lookup | 1.23 | 0.352 | 1.000 | 0 | 0.90x | 0.89x | 0.83x | 0.73x |"
    assert result_rows(row) == {("0.352", "1.000", "0.90x", "0.89x", "0.83x", "0.73x")}
    assert not result_rows("| AR + KV cache (tokens/s) | 1.00 | 1.00 | 866 | 6493 |")
