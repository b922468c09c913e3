"""The science pages say what the results files say: every number and verdict word of docs/paper.md's "what
holds now" tables, its B sweep table, its competent-pilot table and its competent grid's table is recomputed here
from experiments/*.jsonl by the protocols' own code (power_grid.claim and its CLAIMS/CONTROLS/INTERACTION,
paired.verdict, competent.choose, b_sweep's interval, competent_grid.report), so that editing the doc wrongly or
altering a result row fails. Nothing is trained.

A "what holds now" row names its evidence as code spans, each followed by the number it stands for:
    `power_grid mars_B4@1 - ar_E@1`: +0.8 [-0.1, +1.7] points, 5 seeds
    `power_grid tokens/forward mars_B16@0.95 - mars_B4@0.95`: -0.32 [-0.44, -0.20], 5 seeds
    `power_grid contrast`  `power_grid tokens/forward mars_B4@0.95` (mean +- sd)  `competent_pilot P4 2E - E`
    `paper_grid jacobi ar_E`  `paper_timing mars_B4 / ar_E`  `b_sweep D1 tokens/forward mars_B16 - mars_B4`
    `competent_grid a seed 1`: +3.9 [+2.6, +5.1] points, 1 seed   (`competent_grid a seeds 1-5` when all are in:
    the claim on the named seeds' records only, so rows appended later leave an interim line true; a "not
    detected" claim adds ", smallest detectable 9.8", what the design could have seen)
and its verdict cell opens with the first span's word in bold (**reproduced**, **contradicted**, **not
detected**; **measured** where no rule was fixed before the run; **one seed** for a single-seed number; the
competent grid's own words, **interim (1 seed): no verdict** before its 5 seeds are in).
"""
import json
import os
import re
import statistics
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from experiments import b_sweep, competent, competent_grid, paired, power_grid, sft_on_pretrained  # noqa: E402
from experiments.claims import paper_figure, reading  # noqa: E402

# Overridable so that a changed copy can be checked by hand: SCIENCE_DOC=/tmp/paper.md, SCIENCE_RESULTS=/tmp/results
DOC = os.environ.get("SCIENCE_DOC", os.path.join(ROOT, "docs", "paper.md"))
RESULTS = os.environ.get("SCIENCE_RESULTS", os.path.join(ROOT, "experiments"))
WORDS = ("reproduced", "contradicted", "not detected")


def load(name, results=RESULTS):
    with open(os.path.join(results, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def interval_text(iv, metric):
    if metric == "accuracy":  # points, as the docs quote accuracy
        return f"{100 * iv.estimate:+.1f} [{100 * iv.lo:+.1f}, {100 * iv.hi:+.1f}] points"
    return f"{iv.estimate:+.2f} [{iv.lo:+.2f}, {iv.hi:+.2f}]"


def mean_sd(values):
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def power_contrast(power):
    """The powered grid's (no-SFT B16 - B4) - (MARS B16 - B4) at tau 1: (paired interval, seeds)."""
    seeds, right = power_grid.greedy_right(power, power_grid.INTERACTION, power_grid.FULL)
    n16, n4, m16, m4 = (right[r] for r in power_grid.INTERACTION)
    return paired.interval((n16 - n4) - (m16 - m4)), seeds


SPEC = re.compile(r"^(?P<metric>tokens/forward )?(?P<a>\w+)@(?P<ta>[\w.:]+) - (?P<b>\w+)@(?P<tb>[\w.:]+)$")


# The grids whose report() gives each claim's row (claims.verdict_row), and their results files
REPORTS = {"competent_grid": (competent_grid, "competent_grid.jsonl"),
           "sft_on_pretrained": (sft_on_pretrained, "sft_on_pretrained.jsonl")}


def paper_claim(text):
    """A protocol line that is a claim of the paper: not the endless regime (the paper's claims are about a
    fixed data set) and not a direction with no sourced paper figure (the protocol's own assumption)."""
    return not text.startswith("endless") and "no sourced paper figure" not in text


def power_claim(a, b, metric, ta, tb):
    """(direction, claim text) the protocol's code judges a - b by, where a - b tests a claim of the paper: its
    claim's, or (with no text: the paper's figure is its claim's) the claim a step-matched control stands beside;
    (None, None), a measurement (interval, no verdict), otherwise."""
    for text, ca, cb, cm, cta, ctb, direction, *family in power_grid.CLAIMS:
        if (ca, cb, cm, cta, ctb) == (a, b, metric, ta, tb) and not family and direction is not None:
            return (direction, text) if paper_claim(text) else (None, None)
    for (ca, cb), control in power_grid.CONTROLS.items():
        if (ca, control) == (a, b):
            text, *_, direction = next(c[:7] for c in power_grid.CLAIMS if (c[1], c[2]) == (ca, cb) and c[6] is not None)
            return (direction, None) if paper_claim(text) else (None, None)
    return None, None


def named_seeds(named):
    """ "seed 1" -> [1]; "seeds 1-5" -> [1, 2, 3, 4, 5]; "seeds 1-4,6" -> [1, 2, 3, 4, 6]"""
    seeds = []
    for part in named.split(" ")[1].split(","):
        first, _, last = part.partition("-")
        seeds += range(int(first), int(last or first) + 1)
    return seeds


def seeds_named(seeds):
    """named_seeds' inverse: [1, 2, 3, 4, 6] -> "seeds 1-4,6"; [1] -> "seed 1"."""
    runs = []
    for s in sorted(seeds):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs]
    return f"seed{'s' if len(seeds) > 1 else ''} " + ",".join(parts)


class Evidence:
    """Each spec's text, seeds and verdict, from the results files (read once)."""

    def __init__(self, results=RESULTS):
        self.power = load("power_grid.jsonl", results)
        self.sweep = b_sweep.index(load("b_sweep.jsonl", results))
        self.pilot = load("competent_pilot.jsonl", results)
        self.first = load("paper_grid.jsonl", results)
        self.timing = load("paper_timing.jsonl", results)
        self.results = {grid: load(name, results) if os.path.exists(os.path.join(results, name)) else []
                        for grid, (_, name) in REPORTS.items()}
        self.grid = self.results["competent_grid"]
        self.sft_pilot = load("sft_on_pretrained_pilot.jsonl", results)
        self.claims = {}  # (grid, "seeds 1-5") -> the grid's report() rows on those seeds

    def __call__(self, spec):
        """-> (text the doc must show after the span, verdict word, reading: claims.reading of its interval, None
        where the span is not an interval)."""
        grid, _, rest = spec.partition(" ")
        if grid == "power_grid":
            return self.power_grid(rest)
        if grid == "b_sweep":
            cond, rest = rest.split(" ", 1)
            m = re.fullmatch(r"tokens/forward (\w+) - (\w+)(?: at tau ([\d.]+))?", rest)
            iv, seeds = b_sweep.tpf(self.sweep, cond, m[1], m[2], m[3] or b_sweep.DECIDE_TAU)
            return f"{interval_text(iv, 'tpf')}, {len(seeds)} seeds", "measured", reading(iv.lo, iv.hi, None)
        if grid == "competent_pilot":
            c = rest.split(" ")[0]
            lo_hi = competent.choose(self.pilot)["why"][c]["2E_minus_E"]
            return f"{interval_text(paired.Interval(*lo_hi, 0, 0), 'accuracy')}, one seed", "one seed", None
        if grid == "paper_grid":
            _, row = rest.split(" ")
            values = [r["jacobi_tokens_per_forward"] for r in self.first if r["row"] == row]
            if len(values) == 1:
                return f"{values[0]:.2f}, one seed", "one seed", None
            return f"{mean_sd(values)}, {len(values)} seeds", "measured", None
        if grid in REPORTS:
            return self.reported(grid, rest)
        if grid == "paper_timing":
            a, _, b = rest.split(" ")
            step = {r["row"]: r["step_seconds"] for r in self.timing}
            return f"{step[a] / step[b]:.2f}x, one seed", "one seed", None
        raise ValueError(f"unknown evidence: {spec}")

    def power_grid(self, rest):
        seeds_text = lambda seeds: f"{len(seeds)} seeds"  # noqa: E731
        if rest == "contrast":
            iv, seeds = power_contrast(self.power)
            return (f"{interval_text(iv, 'accuracy')}, {seeds_text(seeds)}", paired.verdict(iv.lo, iv.hi, -1),
                    power_grid.claim_reading(iv, -1, power_grid.INTERACTION_CLAIM))
        m = re.fullmatch(r"tokens/forward (\w+)@([\d.]+)", rest)
        if m:
            values = power_grid.tokens_per_forward(self.power, m[1], m[2])
            if len(values) == 1:
                return f"{values[0]:.2f}, one seed", "one seed", None
            return f"{mean_sd(values)}, {len(values)} seeds", "measured", None
        m = SPEC.match(rest)
        metric = "tokens_per_forward" if m["metric"] else "accuracy"
        iv, seeds = power_grid.claim(self.power, m["a"], m["b"], metric, m["ta"], m["tb"], power_grid.FULL)
        direction, text = power_claim(m["a"], m["b"], metric, m["ta"], m["tb"])
        says = "measured" if direction is None else paired.verdict(iv.lo, iv.hi, direction, power_grid.FLAT)
        return (f"{interval_text(iv, metric)}, {seeds_text(seeds)}", says,
                power_grid.claim_reading(iv, direction, text, metric))

    def grid_claims(self, grid, named):
        """REPORTS[grid].report()'s rows on the records of the seeds named ("seed 1", "seeds 1-5") only."""
        if (grid, named) not in self.claims:  # report() takes seconds, and the page names the same seeds many times
            seeds = named_seeds(named)
            module, _ = REPORTS[grid]
            self.claims[grid, named] = module.report([r for r in self.results[grid] if r.get("seed") in seeds],
                                                     module.FULL)[0]
        return self.claims[grid, named]

    def reported(self, grid, rest):
        """`GRID KEY seed 1` or `... seeds 1-5`: report()'s row for claim KEY on those seeds' records;
        `competent_grid long E128 - E80`: two chunks of the 128-epoch run, paired over the prompts (one seed)."""
        m = re.fullmatch(r"long E(\d+) - E(\d+)", rest)
        if m:
            chunks = long_chunks(self.grid)
            if int(m[1]) not in chunks or int(m[2]) not in chunks:
                return f"no chunks for {rest}", "no records", None
            a, b = ([[int(c) for c in chunks[int(e)]["all"]["right"]]] for e in m.groups())  # [1 seed][prompts]
            iv = paired.accuracy_difference(a, b)
            return f"{interval_text(iv, 'accuracy')}, one seed", "measured", reading(100 * iv.lo, 100 * iv.hi, None)
        m = re.fullmatch(r"tokens/forward (\w+)@([\d.]+) (seeds? [\d,-]+)", rest)
        if m:  # mean +- sd over the named seeds, on the sweep prompts
            values = [sum(r["sweep"][m[2]]["tokens"]) / sum(r["sweep"][m[2]]["forwards"]) for r in self.results[grid]
                      if r.get("row") == m[1] and r.get("seed") in named_seeds(m[3])]
            if len(values) == 1:
                return f"{values[0]:.2f}, one seed", "one seed", None
            return f"{mean_sd(values)}, {len(values)} seeds", "measured", None
        if rest.startswith("pilot "):  # `sft_on_pretrained pilot CANDIDATE`: its 2E - E, one seed
            why = sft_on_pretrained.choose(self.sft_pilot, sft_on_pretrained.FULL)["why"][rest.split(" ")[1]]
            iv = paired.Interval(*why["2E_minus_E"], 0, 0)
            lo, hi = 100 * iv.lo, 100 * iv.hi
            return (f"{interval_text(iv, 'accuracy')}, one seed", "one seed",
                    reading(lo, hi, -1, paper_figure(sft_on_pretrained.CLAIMS[0][1])))
        key, named = rest.split(" ", 1)
        r = next((r for r in self.grid_claims(grid, named) if r["key"] == key), None)
        if r is None:
            return f"no records of claim {key} on {named}", "no records", None
        iv = paired.Interval(r["estimate"], r["lo"], r["hi"], 0, r["df"])
        n = len(r["seeds"])
        metric = "tpf" if "tokens/forward" in r["claim"] else "accuracy"
        text = f"{interval_text(iv, metric)}, {n} seed{'s' if n > 1 else ''}"
        if r["verdict"] == "not detected":  # what the design could have seen, beside what it did not
            text += f", smallest detectable {100 * r['mde']:.1f}" if metric == "accuracy" else f", smallest detectable {r['mde']:.2f}"
        return text, r["verdict"], r["reading"]


def quoted(text, word, says):
    """How the page quotes a span's evidence after it: the numbers, the rule's word and, in brackets, the reading."""
    return f"{text}: {word}" + (f" ({says})" if says else "")


def tables(text):
    """Every markdown table under each heading: {heading: [[cells of a row], ...]} (header and rule left out)."""
    found, heading, rows = {}, None, None
    for line in text.splitlines():
        if line.startswith("#"):
            heading, rows = line.lstrip("#").strip(), None
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if rows is None:
                rows = found.setdefault(heading, [])
                rows.append(None)  # the header
            elif set("".join(cells)) <= set("-: "):
                continue
            else:
                rows.append(cells)
        else:
            rows = None
    return {h: [r for r in rs if r is not None] for h, rs in found.items()}


# The "what holds now" tables: a claim's row has one column per regime, each cell one span (its interval, word and
# reading) or one of these; the fine-tuning grid's cell says NO_RESULTS until its results file has rows
REGIMES = ("power_grid", "competent_grid", "sft_on_pretrained")
NOT_IN = "not in its protocol"
NO_RESULTS = "no results yet"
SFT_KEYS = {c[0] for c in sft_on_pretrained.CLAIMS} | {"tokens/forward"}  # its report prints tokens/forward at 0.95


def sections(text):
    """{heading: the text under it, up to the next heading}."""
    parts = re.split(r"^#+ (.*)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def holds_now_problems(text, evidence):
    """Every disagreement between the doc's "what holds now" tables and the results, and each table's stated
    length ("N rows") against its rows."""
    found = {h: rs for h, rs in tables(text).items() if h.lower().startswith("what holds now")}
    if not any(found.values()):
        return ["docs/paper.md has no table under a heading 'What holds now'"]
    problems = []
    for heading, rows in found.items():
        stated = re.findall(r"(\d+) rows", sections(text)[heading])
        if stated != [str(len(rows))]:
            problems.append(f"{heading!r}: its text states {stated} rows, the table has {len(rows)}")
        problems += [p for cells in rows if len(cells) == 2 + len(REGIMES) for p in regime_row_problems(cells, evidence)]
        problems += evidence_problems([cells for cells in rows if len(cells) != 2 + len(REGIMES)], evidence)
    return problems


def regime_row_problems(cells, evidence):
    """One claim's row: each regime's cell one span of that grid, quoted with its word and reading; the fine-tuning
    grid's cell NO_RESULTS (or, once it has results, a span) where its protocol has the competent grid's claim."""
    claim, problems, key = cells[0], [], None
    for grid, cell in zip(REGIMES, cells[2:]):
        parts = re.split(r"`([^`]+)`", cell)
        if len(parts) == 1:
            if grid == "sft_on_pretrained" and cell != (want := sft_cell(key, evidence)):
                problems.append(f"{claim!r}: the fine-tuning grid's cell should read {want!r}, it reads {cell!r}")
            elif cell not in (NOT_IN, NO_RESULTS):
                problems.append(f"{claim!r}, {grid}: a cell is one interval, {NOT_IN!r} or {NO_RESULTS!r}: {cell!r}")
            continue
        spec, after = parts[1], " ".join(parts[2].replace("**", "").split())
        if len(parts) != 3 or not spec.startswith(grid + " ") or parts[0]:
            problems.append(f"{claim!r}, {grid}: a cell opens with one span of {grid}, it reads {cell!r}")
            continue
        text, word, says = evidence(spec)
        if not after.startswith(": " + quoted(text, word, says)) or f"**{word}**" not in cell:
            problems.append(f"{claim!r}: `{spec}` should read ': {quoted(text, f'**{word}**', says)}', the doc has "
                            f"{parts[2].strip()!r}")
        if grid == "competent_grid":
            key = spec.split(" ")[1]
    return problems


def sft_named(rows):
    """The fine-tuning grid's seeds that have an AR-SFT E (a seed's claims start with it), named as the page names
    them ("seeds 1-4,6"); "" while there are none."""
    seeds = sorted({r["seed"] for r in rows if r.get("row") == "ar_E"})
    return seeds_named(seeds) if seeds else ""


def sft_cell(key, evidence):
    """What the fine-tuning grid's cell says where it has no span: the competent grid's claim `key` (None: none)
    is NOT_IN its protocol, NO_RESULTS while its report has no line for it, else it must be a span."""
    if key not in SFT_KEYS:
        return NOT_IN
    rows = evidence.results["sft_on_pretrained"]
    named = sft_named(rows)
    reported = {r["key"] for r in evidence.grid_claims("sft_on_pretrained", named)} if named else set()
    has_tpf = any(r.get("row") == "mars_B4" and "0.95" in r.get("sweep", {}) for r in rows)
    if key not in reported and not (key == "tokens/forward" and has_tpf):
        return NO_RESULTS
    return f"a `sft_on_pretrained {key} {named}` span"


def competent_grid_problems(text, evidence):
    """The competent grid's table: each row as a "what holds now" row, one set of seeds for every row, and a row
    for every claim report() gives on those seeds."""
    rows = [r for h, rs in tables(text).items() if "competent grid" in h.lower() for r in rs]
    if not rows:
        return ["docs/paper.md has no table under a heading naming the competent grid"]
    return claims_table_problems(rows, evidence, "competent_grid")


def claims_table_problems(rows, evidence, grid):
    """A grid's claims table: each row's span, word and reading against the results, one set of seeds for every
    row, and a row for every claim the grid's report() gives on those seeds."""
    problems = evidence_problems(rows, evidence)
    specs = [m for cells in rows for m in re.findall(rf"`{grid} (\w+) (seeds? [\d,-]+)`", cells[2])]
    named = {seeds for _, seeds in specs}
    if len(named) != 1:
        return problems + [f"the {grid} table names {sorted(named)}: one set of seeds for every row"]
    missing = [r["key"] for r in evidence.grid_claims(grid, named.pop()) if r["key"] not in {k for k, _ in specs}]
    return problems + [f"the {grid} table has no row for claim {k}" for k in missing]


def long_chunks(grid):
    """The 128-epoch measurement's finished chunks, {epoch it ends at: its record}."""
    return {r["epochs"]: r for r in grid if r.get("row") == "long"}


def long_run_problems(text, grid):
    """The 128-epoch measurement's table: exactly one row per finished chunk (epochs, accuracy on all prompts and
    on arithmetic, held-out loss at the chunk's end, the lowest held-out loss so far and its epoch)."""
    chunks = {str(e): r for e, r in long_chunks(grid).items()}
    rows = [r for h, rs in tables(text).items() if "128 epochs" in h for r in rs]
    if chunks and not rows:
        return ["docs/paper.md has no table under a heading naming 128 epochs, and the results have its chunks"]
    per_epoch = competent_grid.FULL["N"] // competent_grid.FULL["batch"]

    def want(r):
        curve = [point for c in chunks.values() if c["epochs"] <= r["epochs"] for point in c["held_out_loss"]]
        step, low = min(((s, v["ar"]) for s, v in curve), key=lambda x: x[1])
        return [str(r["epochs"]), f"{r['all']['accuracy']['all']:.3f}", f"{r['all']['accuracy']['arithmetic']:.3f}",
                f"{r['held_out_loss'][-1][1]['ar']:.3f}", f"{low:.3f} (epoch {step / per_epoch:.0f})"]
    problems = [f"128-epoch table: no row for the chunk ending at epoch {e}; add | {' | '.join(want(r))} |"
                for e, r in chunks.items() if e not in {cells[0] for cells in rows}]
    for cells in rows:
        r = chunks.get(cells[0])
        if r is None:
            problems.append(f"128-epoch table: no chunk ending at epoch {cells[0]} in the results")
        elif cells != (got := want(r)):
            problems.append(f"128-epoch table: the doc has {cells}, the results give {got}")
    return problems


def competent_grid_sentence_problems(text, evidence):
    """Every span of a grid in REPORTS (`competent_grid a seeds 1-5`, `competent_grid long E128 - E32`): in prose
    followed by its interval, its rule's word and its reading, in a table by its interval (the table's checks read
    its word and reading; a mean +- sd, not an interval, by its numbers); and the 128-epoch run's highest chunk."""
    chunks = long_chunks(evidence.grid)
    highest = max(chunks, key=lambda e: chunks[e]["all"]["accuracy"]["all"])
    problems = [f"the highest chunk is epoch {highest}, the doc says {e}"
                for e in re.findall(r"highest chunk, epoch (\d+)", text) if int(e) != highest]
    for m in re.finditer(rf"`((?:{'|'.join(REPORTS)}) [^`]+)`([^`]*)", text):
        text_, word, says = evidence(m[1])
        in_table = text[text.rfind("\n", 0, m.start()) + 1:].startswith("|")
        want = text_ if in_table or says is None else quoted(text_, word, says)  # a mean +- sd has no reading
        if not " ".join(m[2].replace("**", "").split()).startswith(": " + want):
            problems.append(f"`{m[1]}` should be followed by ': {want}', the doc has {m[2][:80]!r}")
    return problems


def evidence_problems(rows, evidence):
    """Each row's evidence spans and verdict cell against the results: the verdict cell opens with the first span's
    word in bold and, where it is an interval, its reading in brackets."""
    problems = []
    for cells in rows:
        claim, evidence_cell, verdict_cell = cells[0], cells[2], cells[3]
        parts = re.split(r"`([^`]+)`", evidence_cell)  # text, span, text, span, text, ...
        spans = parts[1::2]
        if not spans:
            problems.append(f"{claim!r}: no evidence span")
            continue
        for i, spec in enumerate(spans):
            after = parts[2 * i + 2]
            want, says, reads = evidence(spec)
            if want not in after:
                problems.append(f"{claim!r}: `{spec}` should read {want!r}, the doc has {after.strip()!r}")
            words = [w for w in WORDS if re.search(rf"\b{w}\b", after)]
            if words and says in WORDS and words != [says]:
                problems.append(f"{claim!r}: `{spec}` is {says!r} by its rule, the doc says {words}")
            if i == 0:
                head = quoted("", f"**{says}**", reads)[2:]
                if not verdict_cell.startswith(head):
                    problems.append(f"{claim!r}: the verdict cell must open with {head!r}, it reads {verdict_cell[:60]!r}")
            elif re.match(r"competent_grid (?!long)", spec) and f"**{says}**" not in verdict_cell:
                problems.append(f"{claim!r}: `{spec}` is {says!r} by the competent grid's rule; the verdict cell must "
                                f"show **{says}**")
    return problems


def yes_no(flag):
    return "yes" if flag else "no"


def pilot_problems(text, pilot):
    """Every cell of the competent pilot's table against competent.choose() on the results file. A candidate
    whose 2E run was not made (P6) is absent from choose()'s answer; its (a) and (b) are the same two
    comparisons on its E run, checked to agree with choose() where both exist."""
    runs = {r["name"]: r for r in pilot}
    why = competent.choose(pilot)["why"]
    constant = runs["pilot/constant"]["ar"]["accuracy"]["all"]

    def ab(e_run):
        acc = e_run["ar"]["accuracy"]
        return acc["arithmetic"] >= competent.ARITHMETIC, acc["all"] >= constant + competent.OVER_CONSTANT

    def loss(run):
        if run is None:
            return "not run"
        curve, per_epoch = run["held_out_loss"], competent.N // 32
        step, low = min(((s, v["ar"]) for s, v in curve), key=lambda x: x[1])
        return f"{low:.3f} (epoch {step // per_epoch}) -> {curve[-1][1]['ar']:.3f}"

    rows = [r for h, rs in tables(text).items() if "competent pilot" in h.lower() for r in rs]
    if not rows:
        return ["docs/paper.md has no table under a heading naming the competent pilot"]
    problems = []
    for c, (model, E) in competent.CANDIDATES.items():
        row = next((r for r in rows if r[0] == c), None)
        if row is None:
            problems.append(f"the pilot table has no row {c}")
            continue
        e, e2 = runs.get(competent.run_name(model, E)), runs.get(competent.run_name(model, 2 * E))
        a, b = ab(e)
        if c in why:
            assert (why[c]["a"], why[c]["b"]) == (a, b)  # the same comparisons as the rule's code
            d = interval_text(paired.Interval(*why[c]["2E_minus_E"], 0, 0), "accuracy")
            c_cell = yes_no(why[c]["c"])
        else:
            d = c_cell = "not run"
        want = [c, model.replace("x", " x "), f"{E} -> {2 * E}", f"{e['ar']['accuracy']['all']:.3f}",
                f"{e['ar']['accuracy']['arithmetic']:.3f}",
                f"{e2['ar']['accuracy']['all']:.3f}" if e2 else "not run", d, yes_no(a), yes_no(b), c_cell,
                f"{loss(e)} / {loss(e2)}"]
        for k, (got, expected) in enumerate(zip(row, want)):
            if got.replace("**", "") != expected:
                problems.append(f"pilot table, {c}, column {k + 1}: the doc has {got!r}, the results give {expected!r}")
        if len(row) != len(want):
            problems.append(f"pilot table, {c}: {len(row)} cells, expected {len(want)}")
    return problems


B_SWEEP_ROWS = {"B 16 - B 4, tau 0.95": ("mars_B16", "0.95", "sweep"), "B 16 - B 4, tau 0.5": ("mars_B16", "0.5", "sweep"),
                "B 8 - B 4, tau 0.95": ("mars_B8", "0.95", "sweep"),
                "B 16 model at window 4 - B 4, tau 0.95": ("mars_B16", "0.95", "window4")}


def b_sweep_problems(text, evidence):
    """The B sweep's table: each cell the paired tokens/forward difference to B 4 by b_sweep's own interval."""
    rows = [r for h, rs in tables(text).items() if "b sweep" in h.lower() for r in rs]
    problems = [f"the B sweep table has no row {k!r}" for k in B_SWEEP_ROWS if k not in [r[0] for r in rows]]
    for cells in rows:
        if cells[0] not in B_SWEEP_ROWS:
            continue
        a, tau, where = B_SWEEP_ROWS[cells[0]]
        for cond, got in zip(b_sweep.DATA_ORDER, cells[1:]):
            iv, _ = b_sweep.tpf(evidence.sweep, cond, a, "mars_B4", tau, where, "sweep")
            if got != interval_text(iv, "tpf"):
                problems.append(f"B sweep table, {cells[0]}, {cond}: the doc has {got!r}, the results give {interval_text(iv, 'tpf')!r}")
    return problems


POWER_TABLES = "The grid at A, claim by claim"
SIDE = re.compile(r"`(\w+)` (greedy|its sampler, tau 1|adaptive, tau ([\d.]+)|tau ([\d.]+))")


def power_side(m):
    """A side of the table's "a - b" cell -> (row, the tau power_grid.claim names it by)."""
    return m[1], f"adaptive:{m[3]}" if m[3] else m[4] or "1"


def power_grid_table_problems(text, evidence):
    """The powered grid's two tables: each claim line's interval from power_grid.claim on the rows and taus its
    "a - b" cell names (and its "seed term cut" note where the rule took the seed-clustered interval), its verdict
    cell opening with the rule's word and the reading, and each tokens/forward-by-B line's means and differences
    to B 4."""
    rows = tables(text).get(POWER_TABLES)
    if not rows:
        return [f"docs/paper.md has no table under {POWER_TABLES!r}"]
    problems = []
    for cells in rows:
        if re.fullmatch(r"[\d.]+", cells[0]):  # tau | B 4 | B 8 | B 16 | B 8 - B 4 | B 16 - B 4
            tau, blocks = cells[0], (4, 8, 16)
            spread = [power_grid.tokens_per_forward(evidence.power, f"mars_B{B}", tau) for B in blocks]
            want = [mean_sd(v) for v in spread]
            want += [interval_text(power_grid.claim(evidence.power, f"mars_B{B}", "mars_B4", "tokens_per_forward",
                                                    tau, tau, power_grid.FULL)[0], "tpf") for B in blocks[1:]]
            got = cells[1:]
        else:
            metric = "accuracy" if "points" in cells[4] else "tokens_per_forward"
            if cells[1].startswith("("):  # the contrast
                iv, _ = power_contrast(evidence.power)
                direction, claim = -1, power_grid.INTERACTION_CLAIM
            else:
                (a, ta), (b, tb) = (power_side(m) for m in SIDE.finditer(cells[1]))
                family = [power_grid.powered_eval.worked.NAME] if cells[0].startswith("long answers") else []
                iv, _ = power_grid.claim(evidence.power, a, b, metric, ta, tb, power_grid.FULL, *family)
                direction, claim = (None, None) if family else power_claim(a, b, metric, ta, tb)
            note = " (seed term cut: seed-clustered t(4))" if iv.method == "seed-clustered" else ""
            word = "measured" if direction is None else paired.verdict(iv.lo, iv.hi, direction, power_grid.FLAT)
            verdict = quoted("", word, power_grid.claim_reading(iv, direction, claim, metric))[2:]
            want, got = [interval_text(iv, metric) + note, verdict], [cells[4], cells[5].replace("**", "")[:len(verdict)]]
        problems += [f"{POWER_TABLES}, {cells[0]!r}: the doc has {g!r}, the results give {w!r}"
                     for g, w in zip(got, want) if g != w]
    return problems


@pytest.fixture(scope="module")
def doc():
    with open(DOC) as f:
        return f.read()


@pytest.fixture(scope="module")
def evidence():
    return Evidence()


def test_what_holds_now_matches_the_results(doc, evidence):
    assert not holds_now_problems(doc, evidence), "\n".join(holds_now_problems(doc, evidence))


def test_the_b_sweep_table_matches_the_results(doc, evidence):
    problems = b_sweep_problems(doc, evidence)
    assert not problems, "\n".join(problems)


def test_the_powered_grid_tables_match_the_results(doc, evidence):
    problems = power_grid_table_problems(doc, evidence)
    assert not problems, "\n".join(problems)


def test_the_competent_pilot_table_matches_the_rule(doc):
    problems = pilot_problems(doc, load("competent_pilot.jsonl"))
    assert not problems, "\n".join(problems)


def test_the_competent_grid_table_matches_the_results(doc, evidence):
    problems = competent_grid_problems(doc, evidence)
    assert not problems, "\n".join(problems)


def test_the_competent_grid_check_sees_a_wrong_cell_and_a_missing_row(doc, evidence):
    """A changed interval, another verdict word and a dropped claim row each fail."""
    row = next(line for line in doc.splitlines() if line.startswith("| a: ") and "`competent_grid" in line)
    number = re.search(r"`: (\S+) \[", row)[1]
    verdict = re.search(r"\| \*\*([^*]+)\*\*", row)[1]
    other = "contradicted" if verdict != "contradicted" else "reproduced"
    for altered in (row.replace(f"`: {number} [", "`: +9.9 [", 1), row.replace(f"**{verdict}**", f"**{other}**")):
        assert competent_grid_problems(doc.replace(row, altered), evidence), altered
    assert competent_grid_problems(doc.replace(row + "\n", ""), evidence)


def test_the_t_quantiles_the_page_quotes_are_students_t(doc):
    """"t(4) quantile is 2.78", "t(2)'s 4.30": each two-sided 95% quantile quoted is paired.t_quantile's."""
    quoted = re.findall(r"t\((\d+)\)(?: quantile is|'s) (\d+\.\d+)", doc)
    assert quoted, "docs/paper.md quotes no t quantile"
    for df, q in quoted:
        assert f"{paired.t_quantile(0.975, int(df)):.{len(q.split('.')[1])}f}" == q, f"t({df}) is not {q}"


def test_the_128_epoch_table_matches_the_results(doc, evidence):
    problems = long_run_problems(doc, evidence.grid)
    assert not problems, "\n".join(problems)


def test_the_128_epoch_check_sees_a_wrong_cell_and_a_missing_row(doc, evidence):
    """An accuracy changed in the table's first row fails, and so does the row left out."""
    row = next(line for line in doc.splitlines() if line.startswith("| 16 |"))
    cells = row.split(" | ")
    cells[1] = f"{float(cells[1]) + 0.001:.3f}"
    assert long_run_problems(doc.replace(row, " | ".join(cells)), evidence.grid)
    assert long_run_problems(doc.replace(row + "\n", ""), evidence.grid)


def test_the_competent_grid_sentences_match_the_results(doc, evidence):
    problems = competent_grid_sentence_problems(doc, evidence)
    assert not problems, "\n".join(problems)


def test_the_competent_grid_sentence_check_sees_a_wrong_interval_and_a_wrong_peak(doc, evidence):
    """Each estimate after a `competent_grid` span shifted by one fails, and so does another epoch named as the
    128-epoch run's highest chunk."""
    spans = re.findall(r"`competent_grid [^`]+`: ([+-]\d+\.\d+)", doc)
    peaks = re.findall(r"highest chunk, epoch \d+", doc)
    assert spans and peaks, "the page quotes the competent grid's intervals and the 128-epoch run's highest chunk"
    for value in spans:
        altered = doc.replace(f": {value} [", f": {float(value) + 1:+.2f} [", 1)
        assert competent_grid_sentence_problems(altered, evidence), value
    assert competent_grid_sentence_problems(doc.replace(peaks[0], "highest chunk, epoch 1"), evidence)


def test_an_altered_number_in_the_doc_fails(doc, evidence):
    """The check sees a wrong number: one interval's upper end changed in a copy of the doc."""
    altered = doc.replace("+0.8 [-0.1, +1.7] points", "+0.8 [-0.1, +1.9] points", 1)
    assert altered != doc and holds_now_problems(altered, evidence)


def test_an_altered_result_row_fails(doc, tmp_path):
    """The check sees a changed result: one powered-grid run's greedy outcomes altered in a copy."""
    for name in ("power_grid.jsonl", "b_sweep.jsonl", "competent_pilot.jsonl", "paper_grid.jsonl", "paper_timing.jsonl",
                 "competent_grid.jsonl", "sft_on_pretrained_pilot.jsonl", "sft_on_pretrained.jsonl"):
        rows = load(name)
        if name == "power_grid.jsonl":
            row = next(r for r in rows if r["row"] == "mars_B4" and r["seed"] == 1)
            row["ar"]["right"] = [1] * len(row["ar"]["right"])  # seed 1's MARS B 4 answers every prompt right
        with open(tmp_path / name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    assert holds_now_problems(doc, Evidence(str(tmp_path)))


def test_the_pilot_check_sees_a_flipped_cell(doc):
    """P6's rule (b) cell is "yes" (0.230 >= 0.163 + 0.05): writing "no" there fails."""
    row = next(line for line in doc.splitlines() if line.startswith("| P6 |"))
    cells = row.split(" | ")
    cells[8] = "no"
    assert pilot_problems(doc.replace(row, " | ".join(cells)), load("competent_pilot.jsonl"))


def test_no_statement_the_results_do_not_carry(doc):
    """Words stronger than an interval carries stay out of the science page."""
    for phrase in ("does not overfit", "the opposite of the paper", "explains D1", "level with", "the same at every size"):
        assert phrase not in doc.lower(), phrase


def test_the_no_sft_rows_are_below_their_parent_on_every_seed_where_the_page_says_so(doc, evidence):
    """The competent grid's reading says both no-SFT rows score below their AR-SFT parent on every seed."""
    assert "below the AR-SFT model they started from on every seed" in " ".join(doc.split())
    acc = competent_grid.accuracy_table(evidence.grid)
    for row in ("no_sft_B4", "no_sft_B16"):
        assert acc[row].keys() == acc["ar_E"].keys() and all(acc[row][s] < acc["ar_E"][s] for s in acc[row]), row


# The README's research lines, each with the spans whose word and reading it quotes (the intervals stay in paper.md)
README_LINES = (("power_grid mars_B4@1 - ar_E@1",), ("competent_grid a seeds 1-5", "competent_grid b seeds 1-5"),
                ("competent_grid d seeds 1-5", "competent_grid d_ar seeds 1-5"), ("competent_grid e seeds 1-5",),
                ("sft_on_pretrained premise seeds 1-4,6", "sft_on_pretrained b seeds 1-4,6"))


def readme_problems(readme, evidence):
    """The README's research section: at most 5 lines, each quoting its claims' words and readings (its numbers
    stay in docs/paper.md: tests/test_docs.py keeps them out of the README)."""
    science = readme[readme.index("## The paper at nano scale"):].splitlines()[1:]
    lines = [line for line in science if line.strip()]
    problems = [f"README's research section has {len(lines)} lines, at most 5"] if len(lines) > 5 else []
    for line, specs in zip(lines, README_LINES):
        for spec in specs:
            want = quoted("", *evidence(spec)[1:])[2:]
            if want not in line:
                problems.append(f"README line {line[:40]!r} should quote {spec} as {want!r}")
    return problems


def test_results_md_quotes_tau_095s_cost_as_the_competent_grid_reads_it(evidence):
    """docs/results.md's tau 0.95 sentence (one model, no interval) quotes the 5-seed competent grid's word and
    reading of claim e."""
    text = " ".join(open(os.path.join(ROOT, "docs", "results.md")).read().split())
    want = quoted("", *evidence("competent_grid e seeds 1-5")[1:])[2:]
    assert f"tau 0.95 costs accuracy: {want}" in text, want


def test_the_readme_science_lines_match_the_results(evidence):
    """The README's five science lines quote, in plain words and each claim's word and reading, the powered grid's
    headline claim, the competent grid's a, b, d, d_ar and e, and the fine-tuning grid's premise and b, each
    recomputed here."""
    problems = readme_problems(open(os.path.join(ROOT, "README.md")).read(), evidence)
    assert not problems, "\n".join(problems)


def test_the_competent_grids_measured_cost_matches_its_results():
    """paper.md's cost sentence quotes seed 1's ar_E and mars_B4 rows of experiments/competent_grid.jsonl, every
    CPU the grid ran on, and the core-hours of all its runs."""
    grid = load("competent_grid.jsonl")
    runs = {r["name"]: r for r in grid}
    text = " ".join(open(DOC).read().split())
    for cpu in {(r["machine"]["cpu_family"], r["machine"]["cpu_model"]) for r in grid}:
        assert "family {} model {}".format(*cpu) in text, cpu
    assert f"{sum(r['core_seconds'] for r in grid) / 3600:.1f} core-hours" in text
    for name in ("ar_E/seed1", "mars_B4/seed1"):
        r = runs[name]
        per_step = f"{r['train_core_seconds'] / r['steps']:.2f}"
        assert f"{r['steps']} steps" in text or name == "mars_B4/seed1"
        assert f"{r['train_core_seconds']:.0f} core-s" in text and per_step in text, (name, per_step)


def test_an_altered_reading_fails(doc, evidence):
    """Each place a reading is quoted sees it altered: a "what holds now" cell, the competent grid's verdict cell,
    its prose, the powered grid's table and the README."""
    a = evidence("competent_grid a seeds 1-5")[2]
    flat = evidence("power_grid mars_B16@1 - mars_B4@1")[2]
    wrong = "in direction and size, the paper's +1.7 inside the interval"
    holds, table, prose = (doc.index(marker) for marker in ("| MARS (E epochs", "| a: MARS B 4", "model it started from, `competent_grid a"))
    spaced = r"\s+".join(map(re.escape, a.split()))  # prose wraps a reading across lines
    for at, check in ((holds, holds_now_problems), (table, competent_grid_problems), (prose, competent_grid_sentence_problems)):
        altered = doc[:at] + re.sub(spaced, wrong, doc[at:], count=1)
        assert altered != doc and check(altered, evidence), check.__name__
    assert power_grid_table_problems(doc.replace(f"**reproduced** ({flat})", "**reproduced** (flat)"), evidence)
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert readme_problems(readme.replace(a, wrong), evidence)


def test_the_fine_tuning_grids_cells_wait_for_its_results(doc, evidence):
    """Its cells say it has no results while its report has no line for their claim; once it has, each must be its
    span: a grid whose every claim is in (here: the competent grid's records, renamed) flags every waiting cell."""
    later = Evidence()
    later.results["sft_on_pretrained"] = [r for r in later.results["competent_grid"] if r.get("seed") in (1, 2)]
    later.claims.clear()
    waiting = re.sub(r"`sft_on_pretrained [^|]*", NO_RESULTS + " ", doc)  # every fine-tuning cell back to waiting
    assert waiting != doc and any("fine-tuning grid's cell" in p for p in holds_now_problems(waiting, later))


def test_most_competent_claims_have_4_degrees_of_freedom(doc, evidence):
    """The competent section says most claims' t has 4 degrees of freedom."""
    assert "for most claims its t has 4 degrees of freedom" in " ".join(doc.split())
    dfs = [round(r["df"]) for r in evidence.grid_claims("competent_grid", "seeds 1-5")]
    assert dfs.count(4) > len(dfs) / 2, dfs


def test_the_note_under_what_holds_now_quotes_bs_reading(doc, evidence):
    """The note under the table reads claim b without its span: the words must be b's reading."""
    reads = evidence("competent_grid b seeds 1-5")[2]
    assert f"32 more of AR-SFT ({reads})" in " ".join(sections(doc)["What holds now"].split()), reads


def sft_pilot_problems(text, pilot):
    """The fine-tuning pilot's section: its table is sft_on_pretrained.pilot_rows on the pilot's results, the
    base's and the constant's accuracy are theirs, and the rule's answer is pilot_state's."""
    part = sections(text)["Its pilot (seed 5, one seed)"]
    cfg, runs = sft_on_pretrained.FULL, {r["name"]: r for r in pilot}
    s = cfg["pilot_seed"]
    problems = [] if tables(text)["Its pilot (seed 5, one seed)"] == sft_on_pretrained.pilot_rows(pilot, cfg) else \
        ["the pilot's table is not pilot_rows() of experiments/sft_on_pretrained_pilot.jsonl"]
    flat = " ".join(part.split())
    for name in (f"base/seed{s}", f"constant/seed{s}"):
        if f"{runs[name]['all']['accuracy']['all']:.3f}" not in flat:
            problems.append(f"the pilot's text should quote {name}'s accuracy")
    if sft_on_pretrained.pilot_state(sft_on_pretrained.choose(pilot, cfg)) not in flat:
        problems.append("the pilot's text should give the rule's answer as pilot_state() words it")
    return problems


def test_the_fine_tuning_pilot_section_is_its_rule_on_its_results(doc):
    assert not sft_pilot_problems(doc, load("sft_on_pretrained_pilot.jsonl"))


def test_the_fine_tuning_pilot_check_sees_a_changed_result(doc):
    pilot = load("sft_on_pretrained_pilot.jsonl")
    e = next(r for r in pilot if r["row"] == "ar_E")
    e["all"]["right"] = "1" * len(e["all"]["right"])  # one candidate's AR-SFT E answers every prompt right
    e["all"]["accuracy"]["all"] = 1.0
    assert sft_pilot_problems(doc, pilot)


SFT_ROWS, SFT_CLAIMS = "The fine-tuning grid's rows, seed by seed", "The fine-tuning grid's claims"


def sft_grid_problems(text, evidence):
    """The fine-tuning grid's two tables: its rows are grid_rows() of its results, with a column per seed; its
    claims table one row per claim report() gives on the seeds that have an AR-SFT E, each quoted as the results
    give it, and MARS B 4's tokens/forward at tau 0.95."""
    grid, found = evidence.results["sft_on_pretrained"], tables(text)
    problems = [] if found.get(SFT_ROWS) == sft_on_pretrained.grid_rows(grid) else \
        [f"{SFT_ROWS!r}: its table is not grid_rows() of experiments/sft_on_pretrained.jsonl"]
    seeds = sorted({r["seed"] for r in grid if "seed" in r})
    header = next(line for line in sections(text)[SFT_ROWS].splitlines() if line.startswith("|"))
    if header != "| row | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |":
        problems.append(f"{SFT_ROWS!r}: its header should name seeds {seeds}, it reads {header!r}")
    rows = found.get(SFT_CLAIMS, [])
    tpf = f"sft_on_pretrained tokens/forward mars_B4@0.95 {sft_named(grid)}"
    if not any(f"`{tpf}`" in cells[2] for cells in rows):
        problems.append(f"{SFT_CLAIMS!r}: no row quotes `{tpf}`")
    return problems + claims_table_problems(rows, evidence, "sft_on_pretrained")


def test_the_fine_tuning_grid_tables_match_the_results(doc, evidence):
    problems = sft_grid_problems(doc, evidence)
    assert not problems, "\n".join(problems)


def test_the_fine_tuning_grid_check_sees_a_changed_row_and_a_missing_claim(doc, evidence):
    """A seed's MARS row answering every prompt right changes the rows table and every MARS claim's cell; a claims
    table without its premise row is flagged."""
    later = Evidence()
    run = next(r for r in later.results["sft_on_pretrained"] if r.get("row") == "mars_B4")
    run["all"] = {**run["all"], "right": "1" * len(run["all"]["right"]),
                  "accuracy": {**run["all"]["accuracy"], "all": 1.0}}
    changed = sft_grid_problems(doc, later)
    assert any("grid_rows()" in p for p in changed) and any("`sft_on_pretrained a " in p for p in changed)
    premise = next(line for line in doc.splitlines() if line.startswith("| premise:") and "`sft_on_pretrained" in line)
    assert any("no row for claim premise" in p for p in sft_grid_problems(doc.replace(premise + "\n", ""), evidence))


def test_the_fine_tuning_grid_section_says_how_far_it_is(doc):
    """The grid's section gives grid_state()'s words on the results files: which of its runs are in."""
    grid = load("sft_on_pretrained.jsonl") if os.path.exists(os.path.join(RESULTS, "sft_on_pretrained.jsonl")) else []
    state = sft_on_pretrained.grid_state(grid, load("sft_on_pretrained_pilot.jsonl"), sft_on_pretrained.FULL)
    assert state in " ".join(sections(doc)["The grid"].split())
    complete = "so every claim has its rule's word" in state  # the what-holds-now intro says the same
    holds_now = " ".join(sections(doc)["What holds now"].split())
    assert ("whose grid is under way: its cells are interim" in holds_now) != complete
    assert ("its 5 seeds are all in" in holds_now) == complete


def test_the_fine_tuning_grids_measured_cost_matches_its_results(doc):
    """The grid's section quotes the core-hours of the pilot's and of the grid's runs, and every CPU they ran on."""
    text = " ".join(sections(doc)["The grid"].split())
    for name in ("sft_on_pretrained_pilot.jsonl", "sft_on_pretrained.jsonl"):
        runs = load(name)
        hours = f"{sum(r['core_seconds'] for r in runs) / 3600:.1f} core-hours ({len(runs)} runs"
        assert hours in text, (name, hours)
        for cpu in {(r["machine"]["cpu_family"], r["machine"]["cpu_model"]) for r in runs}:
            assert "family {} model {}".format(*cpu) in text, cpu


def sft_sentence_problems(text, grid, evidence):
    """The plain words around the fine-tuning grid's spans, each against the results: (phrase on the page, whether
    the results carry it)."""
    runs = {(r["row"], r["seed"]): r for r in grid if "seed" in r}
    seeds, named = sorted(s for row, s in runs if row == "ar_E"), sft_named(grid)
    sft = lambda row, s: next(iter(runs[row, s]["sft"].values()))["accuracy"]["all"]  # noqa: E731
    tpf = lambda r: sum(r["sweep"]["0.95"]["tokens"]) / sum(r["sweep"]["0.95"]["forwards"])  # noqa: E731
    word = lambda key: evidence(f"sft_on_pretrained {key} {named}")[1]  # noqa: E731
    below = lambda key: next(r for r in evidence.grid_claims("sft_on_pretrained", named) if r["key"] == key)["hi"] < 0  # noqa: E731
    mars = [runs["mars_B4", s] for s in seeds]
    facts = {
        "while its accuracy on its own SFT file rises from E to 2E on every seed":
            all(sft("ar_2E", s) > sft("ar_E", s) for s in seeds),
        "It is below its parent on its own SFT file too, on every seed": all(sft("mars_B4", s) < sft("ar_E", s) for s in seeds),
        "60 optimizer steps": all(r["steps"] == 60 for r in mars),
        "on every seed the noisy track's held-out loss was still falling at its last epoch":
            all(r["held_out_loss"][-1][1]["noisy"] < r["held_out_loss"][-2][1]["noisy"] for r in mars),
        "is below the paper's 1.46 on every seed": all(tpf(r) < 1.46 for r in mars),
        f"the premise is {word('premise')} and MARS falls below both AR controls": below("a") and below("b"),
        f"the paper's headline comparison, in its own setting, is {word('b')} here": True,
    }
    flat = " ".join(text.split())
    return [f"{phrase!r}: " + ("not on the page" if phrase not in flat else "the results do not carry it")
            for phrase, holds in facts.items() if phrase not in flat or not holds]


def test_the_fine_tuning_grids_plain_words_match_the_results(doc, evidence):
    problems = sft_sentence_problems(doc, evidence.results["sft_on_pretrained"], evidence)
    assert not problems, "\n".join(problems)


def test_the_fine_tuning_plain_words_check_sees_a_changed_result(doc, evidence):
    """A MARS row whose noisy loss rose at its last epoch, or whose SFT-file accuracy beat its parent's, is flagged."""
    grid = json.loads(json.dumps(evidence.results["sft_on_pretrained"]))
    mars = next(r for r in grid if r.get("row") == "mars_B4")
    mars["held_out_loss"][-1][1]["noisy"] = 9.0
    next(iter(mars["sft"].values()))["accuracy"]["all"] = 1.0
    problems = sft_sentence_problems(doc, grid, evidence)
    assert len(problems) == 2, problems
