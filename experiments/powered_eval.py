"""
The powered evaluation of experiments/power_grid.py: a held-out split of 500 prompts per family (the suite's
seven and data/worked_arithmetic.py), training sets drawn disjoint from it, per-prompt outcomes, and the
constant-answer baseline.

- powered_split() continues each suite family's held-out generator past its first 50 prompts, so the
  old split (nanomars.util.tasks.held_out_split(), 350 prompts) is the first 50 of every suite family, in
  order; later prompts are new, distinct ones. format has only 270 distinct prompts (31 words x 5
  counts, 10 topics x 7 counts, 3 categories x 3 bullets x 5 counts): it keeps 150 (144 distinct), so
  about half its prompts stay trainable.
- train_set(n, seed) cycles over the eight families like tasks.train_examples, skipping every prompt of
  the powered split. The default run (train.py without --data) and its split are untouched.
"""
import os
import random
import sys
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data import worked_arithmetic as worked  # noqa: E402
from nanomars.util import tasks  # noqa: E402

FAMILIES = [*tasks.FAMILIES, worked.NAME]
N_PER_FAMILY = 500
CAPS = {"format": 150}  # prompts a family can give without leaving training none (module docstring)


def make_example(family, rng):
    return worked.make_example(rng) if family == worked.NAME else tasks.make_example(family, rng)


def family_split(family, n):
    """The family's first n held-out prompts: the old split's draws first (duplicates kept, as there), then
    new distinct prompts from the same generator."""
    rng = random.Random(f"{tasks.TEST_SEED}-{family}")  # held_out_split's rng for a suite family
    old = tasks.TEST_PER_FAMILY if family in tasks.FAMILIES else 0
    items = [make_example(family, rng) for _ in range(min(n, old))]
    seen = {tasks.user_prompt(ex) for ex in items}
    while len(items) < n:
        ex = make_example(family, rng)
        if tasks.user_prompt(ex) not in seen:
            seen.add(tasks.user_prompt(ex))
            items.append(ex)
    return items


def powered_split(n_per_family=N_PER_FAMILY):
    """Family after family, n_per_family prompts each (format at most CAPS["format"]). With n_per_family <= 50
    its suite part is exactly tasks.held_out_split(n_per_family)."""
    return [ex for f in FAMILIES for ex in family_split(f, min(n_per_family, CAPS.get(f, n_per_family)))]


def subset_indices(examples, n_per_family):
    """Where the first n_per_family prompts of each family are (the sweep's prompts: a prefix of each family)."""
    seen = Counter()
    for i, ex in enumerate(examples):
        seen[ex["family"]] += 1
        if seen[ex["family"]] <= n_per_family:
            yield i


def subset(examples, n_per_family):
    return [examples[i] for i in subset_indices(examples, n_per_family)]


def train_set(n, seed, exclude):
    """n examples cycling over FAMILIES, none with a user prompt in `exclude`. The seed sets which examples."""
    rng = random.Random(f"power-{seed}")
    examples = []
    for i in range(n):
        ex = make_example(FAMILIES[i % len(FAMILIES)], rng)
        while tasks.user_prompt(ex) in exclude:
            ex = make_example(FAMILIES[i % len(FAMILIES)], rng)
        examples.append(ex)
    return examples


def check(example, response):
    if example.get("family") == worked.NAME:
        return worked.check(tasks.user_prompt(example), response.strip())
    return tasks.check(example, response)


def outcomes(examples, responses, tokens=None, forwards=None):
    """Per prompt (in the split's order): right ("1"/"0" per prompt, one string), tokens, forwards; and the
    aggregates: accuracy per family and "all", tokens per forward."""
    right = [check(ex, r) for ex, r in zip(examples, responses, strict=True)]
    acc = {}
    for key in [*dict.fromkeys(ex["family"] for ex in examples), "all"]:
        hits = [ok for ex, ok in zip(examples, right) if key in (ex["family"], "all")]
        acc[key] = sum(hits) / len(hits)
    out = {"accuracy": acc, "right": "".join("01"[ok] for ok in right)}
    if tokens is not None:
        out.update(tokens_per_forward=sum(tokens) / max(1, sum(forwards)), tokens=tokens, forwards=forwards)
    return out


def constant_answers(train):
    """Each family's most common training answer (ties: the first seen)."""
    answers = {}
    for ex in train:
        answers.setdefault(ex["family"], Counter())[ex["messages"][-1]["content"]] += 1
    return {f: c.most_common(1)[0][0] for f, c in answers.items()}


def constant_baseline(train, examples):
    """The outcomes of answering every prompt with its family's most common training answer."""
    answers = constant_answers(train)
    return {**outcomes(examples, [answers.get(ex["family"], "") for ex in examples]), "answers": answers}
