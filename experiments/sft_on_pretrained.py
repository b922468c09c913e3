"""
Does MARS keep the quality that more AR epochs lose, when a pretrained model is fine-tuned on a small fixed set
(the paper's own setting)? A pilot that finds such a set, then a 5-seed grid in it.

    # from the protocol's commit, in its own worktree (docs/long_runs.md); re-run any command to resume
    nohup python experiments/sft_on_pretrained.py --pilot > out/sft_pilot_1.log 2>&1 &     # two share a queue
    python experiments/sft_on_pretrained.py --choose     # the pilot rule's answer
    nohup python experiments/sft_on_pretrained.py > out/sft_grid_1.log 2>&1 &              # the grid, likewise
    python experiments/sft_on_pretrained.py --report     # every claim: paired interval, rule, verdict
    python experiments/sft_on_pretrained.py --quick --results /tmp/s.jsonl --out /tmp/s   # tiny, every row (CI)

Each finished run appends one JSON line (experiments/sft_on_pretrained_pilot.jsonl, then
experiments/sft_on_pretrained.jsonl) with its commit, torch, threads, machine, core-seconds and seconds per step
(experiments/runner.py: runners on one machine share the queue; a stage-2 row records its parent's digest).

Protocol (committed before any run of it; nothing here changes after seeing results)
- Why: the paper's headline (0.5B: AR-SFT E 28.7, AR-SFT 2E 26.4, MARS 30.4; Table 2) is measured where
  fine-tuning a PRETRAINED instruct model on a fixed SFT set (Dolci-Instruct-SFT, 5 + 5 epochs) for twice the
  epochs costs quality on benchmarks that are not that set. Every nanoMARS grid so far trained from scratch and
  evaluated on held-out prompts of its own training distribution, where more epochs kept helping (the
  competent grid's premise, 2E - E, +4.7 [-2.3, +11.6] points), so its claim b could not ask the paper's
  question. Here the model is first pretrained on the broad mix, then fine-tuned on a small set that is
  narrower than what the evaluation measures, as the paper's SFT data is to its benchmarks.
- Base ("pretrained"), per seed s: the competent grid's ar_E recipe: train.py's 4 x 128 model, its seed's
  N 5000 file (runs.data_file: the eight families, the powered split held out), 32 epochs from scratch, batch
  32, lr 2e-3 (0.40-0.45 on the 3650 held-out prompts in the competent grid). Where this machine holds a
  checkpoint whose weights digest is the one experiments/competent_grid.jsonl records for ar_E/seed s
  (out/competent_grid/, or the committed experiments/competent_grid_parents/), that checkpoint IS the base
  (bit for bit the same run; its row says from_competent_grid); else the base is trained here. Each base row
  records its digest.
- SFT sets (sft_file), fixed per (kind, n, seed): n examples (+2% train.py holds out for its loss curve), none
  with a user prompt in the powered split or in the base's training file:
      mix   seven of the eight families, cycling (all but format, whose 270 prompts the split and the base
            file use up): the base's own mix, new examples of it; as broad as the evaluation, but small
      math  arithmetic and worked_arithmetic only (word problems and worked chains): a narrow set, two of the
            eight families the evaluation measures
  Evaluation is always all eight families, so fine-tuning on math can cost the other six (what the paper's
  premise is: more epochs on the SFT set cost quality measured elsewhere).
- Every fine-tuning run (AR-SFT from the base, MARS from AR-SFT E) uses lr 1e-3 (train.py's stage-2 default,
  one rate for both objectives so that b compares objectives, not rates), 20 warmup steps, cosine to 0.1x,
  batch 32, its own schedule over its epochs; the held-out loss (train.py's 2% of the SFT file) every epoch.
- Evaluation (every row): greedy on all 3650 powered prompts per prompt and family (BD3LM: its own sampler at
  tau 1); accuracy on the row's own SFT file (greedy; 98% of it trained on), so overfitting shows as the SFT set
  up and the held-out prompts down; the MARS rows a tau sweep at 1, 0.95, 0.9, 0.8, 0.7, 0.5 on the 800 sweep
  prompts (accuracy and tokens/forward = generated tokens up to and with the stop / forwards); the constant
  baseline: each family's most common answer in the base's training file.
- The pilot (seed 5, whose base is the competent grid's committed ar_E/seed5, digest bbef7f08; the grid never
  uses seed 5, so the setting it picks is not judged on the runs that picked it). Candidates (kind, n, E):
  mix and math at (500, 4), (500, 8), (500, 32), (2000, 8); rows per candidate: ar_E (base + E epochs of
  AR-SFT) and ar_2E (base + 2E, one schedule); plus the base and the constant. The pilot rule (choose()):
  a candidate passes when
    (i)  ar_2E - ar_E, greedy accuracy on the 3650 prompts, paired (experiments/paired.py, one seed: prompt
         noise only), has a 95% interval wholly below 0 (the premise, detected);
    (ii) ar_E's accuracy >= the constant's + 0.15 (well above the constant answer: the competent grid's
         floor-free regime had +0.26).
  Of those that pass, the smallest setting: fewest SFT examples seen by ar_2E (n x 2E), then the smaller n,
  then mix before math. If none passes, that is the result: the grid does not run, and the pages say so with
  every candidate's numbers (held-out and SFT-set accuracy, held-out loss by epoch).
- The grid (only after a pass), seeds 1, 2, 3, 4, 6, the chosen (kind, n, E). Rows per seed: constant, base,
      ar_E        base + E epochs of AR-SFT
      ar_2E       base + 2E epochs (the step-matched control of every stage-2 row)
      mars_B4     ar_E + E epochs of MARS B 4 as released (blocks from position 0)
      offsets_B4  the same with train.py's random block offsets
      bd3lm_B4    ar_E + E epochs of BD3LM as released (blocks from position 0)
- Claims and rules (CLAIMS; paired.py's interval over (seeds, prompts); verdicts as the competent grid's:
  directional "reproduced" if the 95% interval excludes 0 on the paper's side, "contradicted" if on the other,
  else "not detected" (with the smallest detectable effect); a measurement "detected above/below 0" or "not
  detected"). Each line also states where 0 and the paper's figure lie relative to the interval.
      premise   ar_2E - ar_E at tau 1 (paper -2.3, Table 2)                                       -1
      a         mars_B4 - ar_E (paper +1.7)                                                       +1
      b         mars_B4 - ar_2E, the step-matched control (paper +4.0)                            +1
      d_ar      bd3lm_B4 - ar_E (paper -5.9: 22.8 against 28.7)                                   -1
      d         bd3lm_B4 - mars_B4 (paper -7.6: 22.8 against 30.4)                                -1
      e         mars_B4 at tau 0.95 - tau 1 on the sweep prompts (paper -1.1..-1.6 at 1.46-1.49 tokens/forward,
                Table 4); its tokens/forward at 0.95 printed beside it                           -1
      g, g_tpf  offsets_B4 - mars_B4: accuracy at tau 1, tokens/forward at tau 0.95               measurement
  Verdicts need all 5 seeds; with fewer, each line is "interim (k seeds): no verdict".
- Parents: ar_E and ar_2E record the base's digest, the stage-2 rows ar_E's; the report pairs a row only with its
  own seed's recorded parent. A runner that lacks a parent's weights retrains it (same flags, seed, one
  thread) and goes on only if the digest is the recorded one; if not, the seed restarts
  (--restart_seed s moves its rows to experiments/sft_on_pretrained_superseded.jsonl, which no report reads).
- Smallest detectable effect at 5 seeds (80% power, two-sided 5%): prompt noise, from the competent grid, about
  1.0 point for two rows trained apart on 3650 prompts (less for MARS against its own parent), 2.1 on the 800
  sweep prompts; the seed term of this setting is unknown before the grid (the pilot has one seed): a per-seed
  spread s adds about 1.66 s (t with 4 degrees of freedom). The competent grid's b had 9.8, all of it seeds.
- Cost (one core, this machine's AR step 0.28-0.36 s, MARS 0.7-0.8 s at batch 32): a base 28 min where it is
  trained (seeds 1-4 reproduce the competent grid's recorded runs on the AMD EPYC family 25 model 17 that
  trained them; seed 6 is new); the pilot about 6,900 AR steps (~35 min) and 18 greedy evaluations (~6 min);
  a grid seed at n 500, E 8: ~1,000 steps (~8 min) and BD3LM's sampler on 3650 prompts (~6 min), at n 2000 or
  E 32 about 4x the steps. The grid: about 5 core-hours with every base trained, 3 with seeds 1-4's reused.
"""
import argparse
import os
import random
import shutil
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from experiments import paired, powered_eval, runner  # noqa: E402
from experiments.claims import (difference, line, paired_rows, paper_figure, reading,  # noqa: E402
                               tokens_per_forward_line, verdict_row)
from experiments.resumable import machine, weights_digest  # noqa: E402
from experiments.runs import (Row, data_file, evaluate, provenance, size, train, train_and_evaluate,  # noqa: E402
                              training, with_held_out)
from nanomars.util.tasks import user_prompt, write_jsonl  # noqa: E402

TAUS = (1.0, 0.95, 0.9, 0.8, 0.7, 0.5)
KINDS = {"mix": [f for f in powered_eval.FAMILIES if f != "format"], "math": ["arithmetic", "worked_arithmetic"]}
CANDIDATES = {f"{kind}{n}_E{E}": (kind, n, E) for n, E in ((500, 4), (500, 8), (500, 32), (2000, 8)) for kind in KINDS}
TINY = ["--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--n_kv_head", "1", "--intermediate_size", "64"]
FULL = dict(seeds=(1, 2, 3, 4, 6), pilot_seed=5, N=5000, base_epochs=32, model=size(4, 128), batch=32, lr=1e-3,
            n_per_family=500, sweep_per_family=100, taus=TAUS, max_new_tokens=72, decode_batch=100,
            candidates=CANDIDATES, competent=os.path.join(ROOT, "experiments", "competent_grid.jsonl"),
            competent_dirs=(os.path.join(ROOT, "out", "competent_grid"),
                            os.path.join(ROOT, "experiments", "competent_grid_parents")))
QUICK = dict(seeds=(1,), pilot_seed=2, N=64, base_epochs=1, model=TINY, batch=8, lr=1e-3, n_per_family=2,
             sweep_per_family=1, taus=(1.0, 0.95), max_new_tokens=12, decode_batch=100,
             candidates={"mix16_E1": ("mix", 16, 1), "math16_E1": ("math", 16, 1)}, competent=None, competent_dirs=())
OVER_CONSTANT = 0.15  # pilot rule (ii)


def rows(cfg, E):
    """A seed's rows at E fine-tuning epochs: name -> Row (stage, parent, train.py flags less --data, B, taus)."""
    tune = lambda epochs: ["--epochs", str(epochs), "--lr", f"{cfg['lr']:g}"]  # noqa: E731
    stage2 = lambda *flags: Row("mars", "ar_E", [*tune(E), "--block_size", "4", *flags], 4, cfg["taus"])  # noqa: E731
    return {"base": Row("ar", None, ["--epochs", str(cfg["base_epochs"])], None),
            "ar_E": Row("ar", "base", tune(E), None),
            "ar_2E": Row("ar", "base", tune(2 * E), None),
            "mars_B4": stage2("--no-random_offsets"),
            "offsets_B4": stage2("--random_offsets"),
            "bd3lm_B4": Row("mars", "ar_E", [*tune(E), "--block_size", "4", "--no-random_offsets", "--objective",
                                             "bd3lm"], 4, ())}


# ------------------------------------------------------------------------------------------------ data
def sft_file(out, seed, kind, n, N):
    """The seed's SFT set: n examples (+2% held out) of KINDS[kind], cycling, none with a user prompt in the powered
    split or the base's training file; written once."""
    path = os.path.join(out, f"seed{seed}", f"sft_{kind}_{n}.jsonl")
    if not os.path.exists(path):
        exclude = {ex["messages"][0]["content"] for ex in powered_eval.powered_split()}
        exclude |= {ex["messages"][0]["content"] for ex in training(data_file(out, seed, N))}
        rng, families, examples = random.Random(f"sft-{kind}-{seed}"), KINDS[kind], []
        for i in range(with_held_out(n)):
            ex = powered_eval.make_example(families[i % len(families)], rng)
            while user_prompt(ex) in exclude:
                ex = powered_eval.make_example(families[i % len(families)], rng)
            exclude.add(user_prompt(ex))
            examples.append(ex)
        tmp = f"{path}.{os.getpid()}.tmp"
        write_jsonl(tmp, examples)
        os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------------- runs
class Plan:
    """One results file's runs: the pilot's (every candidate at the pilot seed) or the grid's (the chosen one at
    every seed). A run's name is [candidate/]row/seedS; setting(name) -> (kind, n, E)."""
    def __init__(self, cfg, results, out, meta, pilot, choice=None):
        self.cfg, self.results, self.out, self.meta, self.pilot = cfg, results, out, meta, pilot
        self.settings = cfg["candidates"] if pilot else {choice: cfg["candidates"][choice]}
        self.examples = powered_eval.powered_split(cfg["n_per_family"])

    def names(self):
        fine = ["ar_E", "ar_2E"] if self.pilot else ["ar_E", "ar_2E", "mars_B4", "offsets_B4", "bd3lm_B4"]
        seeds = [self.cfg["pilot_seed"]] if self.pilot else self.cfg["seeds"]
        return [n for s in seeds for n in [f"constant/seed{s}", f"base/seed{s}",
                                           *(f"{c}/{row}/seed{s}" for c in self.settings for row in fine)]]

    def parse(self, name):
        *c, row, seed = name.split("/")
        c = c[0] if c else next(iter(self.settings))
        return c, row, int(seed[4:])

    def parent_name(self, name):
        c, row, s = self.parse(name)
        parent = rows(self.cfg, self.settings[c][2])[row].parent if row in rows(self.cfg, 1) else None
        return None if parent is None else f"base/seed{s}" if parent == "base" else f"{c}/{parent}/seed{s}"

    def ready(self, name, finished):
        parent = self.parent_name(name)
        return parent is None or parent in finished

    def run_dir(self, name):
        c, row, s = self.parse(name)
        return os.path.join(self.out, f"seed{s}", "base" if row == "base" else f"{c}/{row}")

    def data(self, name):
        c, row, s = self.parse(name)
        kind, n, _ = self.settings[c]
        return (data_file(self.out, s, self.cfg["N"]) if row in ("base", "constant")
                else sft_file(self.out, s, kind, n, self.cfg["N"]))

    def flags(self, name):
        """(Row, train.py flags) of a run, its parent's weights (retrained where missing) first."""
        c, row, s = self.parse(name)
        spec = rows(self.cfg, self.settings[c][2])[row]
        init = ["--init_from", self.weights(self.parent_name(name))[0]] if spec.parent else []
        return spec, [*init, "--data", self.data(name), *spec.flags]

    def per_epoch(self, name):
        c, row, _ = self.parse(name)
        return max(1, (self.cfg["N"] if row == "base" else self.settings[c][1]) // self.cfg["batch"])

    def base_from_competent(self, name):
        """The competent grid's ar_E weights of this seed, where this machine has them: (path, digest) or None."""
        s = self.parse(name)[2]
        recorded = runner.load(self.cfg["competent"] or "")
        want = next((r["digest"] for r in recorded if r["name"] == f"ar_E/seed{s}"), None)
        for d in self.cfg["competent_dirs"]:
            for path in (os.path.join(d, f"seed{s}", "ar_E", "ar.pt"), os.path.join(d, f"ar_E_seed{s}.pt")):
                if want and os.path.exists(path) and weights_digest(path) == want:
                    return path, want
        return None

    def train_only(self, name):
        spec, flags = self.flags(name)
        found = self.base_from_competent(name) if self.parse(name)[1] == "base" else None
        os.makedirs(self.run_dir(name), exist_ok=True)
        if found:  # the same run, bit for bit: copied, not retrained
            path = os.path.join(self.run_dir(name), "ar.pt")
            shutil.copyfile(found[0], path + ".tmp")
            return os.replace(path + ".tmp", path)
        train(spec.stage, self.run_dir(name), flags, self.parse(name)[2], self.model(), 10**9)

    def model(self):
        return {**self.cfg, "model": [*self.cfg["model"], "--device", self.meta["device"]]}

    def weights(self, name):
        """(path, digest) of a finished run's weights, retrained where this machine lacks them."""
        stage = rows(self.cfg, 1)[self.parse(name)[1]].stage
        return runner.parent_weights(self.results, name, os.path.join(self.run_dir(name), f"{stage}.pt"),
                                     lambda: self.train_only(name),
                                     f"By the protocol the seed restarts: python experiments/sft_on_pretrained.py "
                                     f"--restart_seed {self.parse(name)[2]}, then run again")

    def run(self, name):
        c, row, s = self.parse(name)
        kind, n, E = self.settings[c]
        base = {"row": row, "seed": s, "n_base": self.cfg["N"]}
        if row == "constant":
            return {**base, "all": powered_eval.constant_baseline(training(self.data(name)), self.examples)}
        spec, flags = self.flags(name)
        if spec.parent:
            base.update(candidate=c, kind=kind, n_sft=n, E=E, parent_digest=self.weights(self.parent_name(name))[1])
        if row == "base" and self.base_from_competent(name):
            self.train_only(name)
            path = os.path.join(self.run_dir(name), "ar.pt")
            fields = {"from_competent_grid": True, "digest": weights_digest(path),
                      **evaluate(path, spec, self.examples, self.cfg, self.meta["device"])}
        else:
            fields = train_and_evaluate(self.run_dir(name), spec, flags, s, self.model(), self.meta, self.examples,
                                        self.per_epoch(name))
        fields["sft"] = self.sft_accuracy(name, spec)
        return {**base, "model": self.cfg["model"], "flags": spec.flags, "block_size": spec.B, **fields}

    def sft_accuracy(self, name, spec):
        """Greedy (BD3LM: its sampler) accuracy on SFT files, by kind and size ("math500"): the row's own, or for the
        base every setting's."""
        path = os.path.join(self.run_dir(name), f"{spec.stage}.pt")
        c, row, s = self.parse(name)
        files = {f"{kind}{n}": sft_file(self.out, s, kind, n, self.cfg["N"])
                 for k, (kind, n, _) in self.settings.items() if row == "base" or k == c}
        got = {}
        for key, f in files.items():
            scores = evaluate(path, spec._replace(taus=()), training(f), self.cfg, self.meta["device"])["all"]
            got[key] = {"accuracy": scores["accuracy"], "right": scores["right"]}
        return got


def run_plan(plan, poll):
    runner.run_queue(plan.results, plan.out, plan.names(), plan.ready, plan.run, plan.meta,
                     "sft pilot" if plan.pilot else "sft grid", poll)


# --------------------------------------------------------------------------------------------- pilot
def choose(pilot, cfg):
    """The pilot rule -> {"candidate", "passed", "why": per finished candidate, its numbers and conditions}."""
    runs = {r["name"]: r for r in pilot}
    s = cfg["pilot_seed"]
    constant = runs.get(f"constant/seed{s}")
    why = {}
    for c, (kind, n, E) in cfg["candidates"].items():
        e, e2 = runs.get(f"{c}/ar_E/seed{s}"), runs.get(f"{c}/ar_2E/seed{s}")
        if not (e and e2 and constant):
            continue
        iv = paired.accuracy_difference([list(map(int, e2["all"]["right"]))], [list(map(int, e["all"]["right"]))])
        acc_e, floor = e["all"]["accuracy"]["all"], constant["all"]["accuracy"]["all"]
        sft_acc = lambda r: r["sft"][f"{kind}{n}"]["accuracy"]["all"]  # noqa: E731
        why[c] = {"kind": kind, "n": n, "E": E, "accuracy_E": acc_e, "accuracy_2E": e2["all"]["accuracy"]["all"],
                  "sft_E": sft_acc(e), "sft_2E": sft_acc(e2),
                  "constant": floor, "2E_minus_E": [iv.estimate, iv.lo, iv.hi],
                  "i": iv.hi < 0, "ii": acc_e >= floor + OVER_CONSTANT}
    passed = [c for c, w in why.items() if w["i"] and w["ii"]]
    order = lambda c: (why[c]["n"] * 2 * why[c]["E"], why[c]["n"], list(KINDS).index(why[c]["kind"]))  # noqa: E731
    return {"candidate": min(passed, key=order) if passed else None, "passed": bool(passed),
            "complete": len(why) == len(cfg["candidates"]), "why": why}


# -------------------------------------------------------------------------------------------- report
# (key, claim, row a, row b, metric, tau a, tau b, direction: +1 / -1 the paper's sign of a - b, None a
# measurement); tau "1" is a row's "all" evaluation, any other its sweep's
CLAIMS = [
    ("premise", "AR-SFT 2E - E (paper -2.3, Table 2)", "ar_2E", "ar_E", "accuracy", "1", "1", -1),
    ("a", "MARS B 4 - AR-SFT E (paper +1.7, Table 2)", "mars_B4", "ar_E", "accuracy", "1", "1", +1),
    ("b", "MARS B 4 - AR-SFT 2E, the step-matched control (paper +4.0, Table 2)", "mars_B4", "ar_2E", "accuracy",
     "1", "1", +1),
    ("d_ar", "BD3LM B 4 - AR-SFT E (paper -5.9: 22.8 against 28.7, Table 2)", "bd3lm_B4", "ar_E", "accuracy", "1",
     "1", -1),
    ("d", "BD3LM B 4 - MARS B 4 (paper -7.6: 22.8 against 30.4, Table 2)", "bd3lm_B4", "mars_B4", "accuracy", "1",
     "1", -1),
    ("e", "MARS B 4 tau 0.95 - tau 1 (paper -1.1..-1.6, Table 4)", "mars_B4", "mars_B4", "accuracy", "0.95", "1", -1),
    ("g", "random offsets - released, B 4, accuracy at tau 1", "offsets_B4", "mars_B4", "accuracy", "1", "1", None),
    ("g_tpf", "random offsets - released, B 4, tokens/forward at tau 0.95", "offsets_B4", "mars_B4",
     "tokens_per_forward", "0.95", "0.95", None),
]
PARENT = {"ar_E": "base", "ar_2E": "base"}  # every other fine-tuned row starts from ar_E


def report(results, cfg):
    """Every claim: {"key", "claim", "estimate", "lo", "hi", "seeds", "df", "method", "mde", "verdict", "reading"}
    (claims.verdict_row); and the names of the rows left out (their parent is not their seed's recorded one)."""
    results, unpaired = paired_rows(results, lambda row: PARENT.get(row, "ar_E"))
    out, swept = [], {"1", *(f"{t:g}" for t in cfg["taus"])}
    for key, text, a, b, metric, tau_a, tau_b, direction in CLAIMS:
        got = difference(results, a, b, metric, tau_a, tau_b, cfg) if {tau_a, tau_b} <= swept else None
        if got:
            out.append(verdict_row(key, text, *got, direction, cfg, scale=100 if metric == "accuracy" else 1))
    return out, unpaired


def accuracy_table(results):
    """row -> seed -> (accuracy on all held-out prompts, accuracy on its SFT file or None)."""
    table = {}
    for r in sorted(results, key=lambda r: (r.get("seed", 0), r["name"])):
        sft = r["sft"][f"{r['kind']}{r['n_sft']}"] if "kind" in r else None
        table.setdefault(r["name"].rsplit("/", 1)[0], {})[r["seed"]] = (
            r["all"]["accuracy"]["all"], sft and sft["accuracy"]["all"])
    return table


def print_table(results):
    print("accuracy at tau 1 on all held-out prompts (and on the row's own SFT file), per seed:")
    for row, per_seed in accuracy_table(results).items():
        print(f"  {row:<22} " + "  ".join(f"s{s} {a:.3f}" + (f" (sft {t:.3f})" if t is not None else "")
                                          for s, (a, t) in per_seed.items()))


def print_report(results, cfg):
    seeds = sorted({r["seed"] for r in results if "seed" in r})
    print("accuracy at tau 1 on all held-out prompts (and on the seed's SFT file), per seed, and the held-out mean:")
    print("| row | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |")
    for row in grid_rows(results):
        print("| " + " | ".join(row) + " |")
    claims, unpaired = report(results, cfg)
    for r in claims:
        print(line(r))
    if tokens_per_forward_line(results):
        print(tokens_per_forward_line(results))
    if unpaired:
        print("left out (parent digest is not the seed's recorded parent): " + ", ".join(unpaired))


def pilot_rows(pilot, cfg):
    """The pilot's table, one row per finished candidate (docs/paper.md quotes it; tests check it): held-out and
    SFT-set accuracy at E and 2E, the held-out loss (train.py's 2% of the SFT file) at the end of each, 2E - E with
    its reading, and the rule's two conditions."""
    got, runs = choose(pilot, cfg), {r["name"]: r for r in pilot}
    out = []
    for c, w in got["why"].items():
        d, lo, hi = (100 * v for v in w["2E_minus_E"])
        loss = lambda row: runs[f"{c}/{row}/seed{cfg['pilot_seed']}"]["held_out_loss"][-1][1]["ar"]  # noqa: E731
        out.append([f"{w['kind']}, {w['n']}, E {w['E']}", f"{w['accuracy_E']:.3f}", f"{w['accuracy_2E']:.3f}",
                    f"{w['sft_E']:.3f} -> {w['sft_2E']:.3f}", f"{loss('ar_E'):.3f} -> {loss('ar_2E'):.3f}",
                    f"{d:+.1f} [{lo:+.1f}, {hi:+.1f}] ({reading(lo, hi, -1, paper_figure(CLAIMS[0][1]))})",
                    "yes" if w["i"] else "no", "yes" if w["ii"] else "no",
                    "**chosen**" if c == got["candidate"] and got["complete"] else
                    "passes" if w["i"] and w["ii"] else "fails"])
    return out


def pilot_state(got):
    """The pilot rule's answer in words, for docs/paper.md (tests check it against choose())."""
    if not got["complete"]:
        return f"Not every candidate is in yet ({len(got['why'])} of {len(CANDIDATES)}): the rule has not chosen."
    if not got["passed"]:
        return "All eight candidates are in and none passes: by the protocol the grid does not run."
    kind, n, E = CANDIDATES[got["candidate"]]
    return (f"All eight candidates are in. By the rule the grid's setting is **{kind}, {n}, E {E}**: of those that "
            f"pass, the one whose AR-SFT 2E sees the fewest SFT examples ({n} x {2 * E}).")


def grid_state(grid, pilot, cfg):
    """How far the grid is, in words, for docs/paper.md (tests check it against the results files)."""
    got = choose(pilot, cfg)
    if not (got["complete"] and got["passed"]):
        return "Its runs start from a40b30e once the pilot has chosen a setting; no row of it is in yet."
    names = Plan(cfg, "", "", {}, pilot=False, choice=got["candidate"]).names()
    done = [n for n in names if n in {r["name"] for r in grid}]
    if len(done) == len(names):
        return (f"From a40b30e, in the pilot's setting, seed by seed: all {len(names)} of its runs are in (seeds "
                f"{', '.join(map(str, cfg['seeds']))}), so every claim has its rule's word.")
    return (f"From a40b30e, in the pilot's setting, seed by seed: {len(done)} of its {len(names)} runs are in "
            f"({', '.join(done) or 'none'}). With fewer than its 5 seeds no line is a verdict: the claims table "
            "below and the fine-tuning column of the tables above quote each claim that has rows as interim, and "
            "`python experiments/sft_on_pretrained.py --report` prints them all.")


GRID_ROWS = ("constant", "base", "ar_E", "ar_2E", "mars_B4", "offsets_B4", "bd3lm_B4")


def grid_rows(grid):
    """The grid's accuracy table (docs/paper.md quotes it; tests check it): per row, each seed's greedy accuracy on
    the 3650 held-out prompts and, in brackets, on the seed's SFT file (the base's too: where fine-tuning starts),
    then the held-out mean over the seeds that have the row."""
    runs = {(r["row"], r["seed"]): r for r in grid if "seed" in r}
    seeds = sorted({s for _, s in runs})
    def cell(r):
        sft = next(iter(r["sft"].values()))["accuracy"]["all"] if r.get("sft") else None
        return f"{r['all']['accuracy']['all']:.3f}" + (f" ({sft:.3f})" if sft is not None else "")
    out = []
    for row in GRID_ROWS:
        have = [runs[row, s] for s in seeds if (row, s) in runs]
        if have:
            mean = sum(r["all"]["accuracy"]["all"] for r in have) / len(have)
            out.append([row] + [cell(runs[row, s]) if (row, s) in runs else "" for s in seeds] + [f"{mean:.3f}"])
    return out


PILOT_HEAD = ["SFT set (kind, n, E)", "AR-SFT E", "AR-SFT 2E", "SFT set E -> 2E", "held-out loss E -> 2E",
              "2E - E, points (reading)", "(i)", "(ii)", "rule"]


def print_pilot(pilot, cfg):
    print_table(pilot)
    print("| " + " | ".join(PILOT_HEAD) + " |\n|" + " --- |" * len(PILOT_HEAD))
    for row in pilot_rows(pilot, cfg):
        print("| " + " | ".join(row) + " |")
    got = choose(pilot, cfg)
    state = "" if got["complete"] else " (not every candidate is in)"
    print(f"pilot rule{state}: " + (f"{got['candidate']} passes" if got["passed"] else "no candidate passes"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pilot", action="store_true", help="the pilot's runs (every candidate, the pilot seed)")
    p.add_argument("--choose", action="store_true", help="the pilot's numbers and its rule's answer")
    p.add_argument("--report", action="store_true", help="every claim's paired interval and verdict")
    p.add_argument("--quick", action="store_true", help="a tiny model and data: the pilot, then every grid row (CI)")
    p.add_argument("--restart_seed", type=int, default=None, help="move a seed's rows to the superseded file")
    p.add_argument("--device", default="cpu", help="cpu or cuda (train.py trains in bf16 there)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of every process (recorded)")
    p.add_argument("--results", default=os.path.join(ROOT, "experiments", "sft_on_pretrained.jsonl"),
                   help="the grid's results; the pilot's are beside it, *_pilot.jsonl")
    p.add_argument("--out", default=os.path.join(ROOT, "out", "sft_on_pretrained"), help="checkpoints, data, claims")
    args = p.parse_args()
    cfg = QUICK if args.quick else FULL
    pilot_results = args.results.replace(".jsonl", "_pilot.jsonl")
    if args.report:
        return print_report(runner.load(args.results), cfg)
    if args.choose:
        return print_pilot(runner.load(pilot_results), cfg)
    if args.restart_seed is not None:
        return runner.restart_seed(args.results, args.restart_seed)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # train.py's processes
    torch.set_num_threads(args.threads)  # this one's decoding
    meta = {**provenance(args.threads, args.device), "machine": machine()}
    poll = 1 if args.quick else 60
    if args.pilot or args.quick:
        run_plan(Plan(cfg, pilot_results, args.out, meta, pilot=True), poll)
        if args.pilot:
            return
    got = choose(runner.load(pilot_results), cfg)
    choice = got["candidate"] or (next(iter(cfg["candidates"])) if args.quick else None)  # CI runs every row
    if not got["complete"] or choice is None:
        sys.exit("error: the pilot " + ("is not finished: run --pilot first" if not got["complete"] else
                                        "found no setting where more AR epochs lose quality: by the protocol the "
                                        "grid does not run (--choose shows every candidate)"))
    run_plan(Plan(cfg, args.results, args.out, meta, pilot=False, choice=choice), poll)


if __name__ == "__main__":
    main()
