"""
One grid row, as every grid since the powered one runs it: its train.py flags (Row), its training file
(data_file), its training in a subprocess (train), its decoding and scoring on the powered split (decode,
evaluate) and what can change its numbers besides the seed (provenance). The protocol modules
(power_grid.py, competent_grid.py, sft_grid.py, ...) hold only their own rows, claims and rules.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from experiments import powered_eval  # noqa: E402
from experiments.resumable import core_seconds, weights_digest  # noqa: E402
from nanomars.batch_decode import batch_ar, batch_decode  # noqa: E402
from nanomars.compare.block_diffusion import block_diffusion_decode  # noqa: E402
from nanomars.util.checkpoint import load_model  # noqa: E402
from nanomars.util.tasks import prompt_messages, write_jsonl  # noqa: E402


def size(layers, width):
    return ["--n_layer", str(layers), "--n_embd", str(width), "--n_head", "4", "--n_kv_head", "2",
            "--intermediate_size", str(width * 11 // 4)]


class Row(NamedTuple):
    stage: str  # "ar" or "mars" (train.py's --stage)
    parent: str | None  # the run it starts from
    flags: list  # train.py flags, less --data
    B: int | None  # the decoding block size (None: an AR model)
    taus: tuple = ()  # the sweep (on the sweep prompts)
    adaptive: bool = False  # also decode with the adaptive window at those taus


def provenance(threads, device):
    """What can change a run's numbers besides its seed (float reduction order: threads, device, torch)."""
    def git(*cmd):
        return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True)
    head = git("rev-parse", "HEAD")
    commit = head.stdout.strip() if head.returncode == 0 else None
    if commit and git("diff", "--quiet", "HEAD", "--", "*.py").returncode:
        commit += "+edited"  # tracked code differs from the commit
    return {"torch": torch.__version__, "threads": threads, "device": device, "commit": commit}


def with_held_out(n):
    """The file size whose 98% (train.py holds out 2%, at least one) is n examples."""
    total = n
    while total - max(1, total // 50) < n:
        total += 1
    return total


def data_file(out, seed, n):
    """The seed's training set of n examples (+2% that train.py holds out), written once."""
    path = os.path.join(out, f"seed{seed}", f"train_{n}.jsonl")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        exclude = {ex["messages"][0]["content"] for ex in powered_eval.powered_split()}  # the full split, always
        tmp = f"{path}.{os.getpid()}.tmp"  # runners sharing out/ may write it at once: the same lines, one rename wins
        write_jsonl(tmp, powered_eval.train_set(with_held_out(n), seed, exclude))
        os.replace(tmp, path)
    return path


def training(path):
    """The examples of a training file (train.py trains on 98% of them: the constant baseline, which only
    counts answers, reads them all)."""
    with open(path) as f:
        return [json.loads(line) for line in f]


def train(stage, out_dir, flags, seed, cfg, interval):
    """Runs train.py; returns its held-out loss curve [(step, {name: loss})] and its logged seconds per step
    (each a running mean since the first step)."""
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--stage", stage, "--out_dir", out_dir, "--seed", str(seed),
           "--eval_interval", str(interval), "--batch_size", str(cfg["batch"]), "--device", "cpu", *cfg["model"], *flags]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    with open(os.path.join(out_dir, f"{stage}.log"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    curve = [(int(m[1]), {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+)", m[2])})
             for m in re.finditer(r"^eval +(\d+) \| held-out (.*)$", proc.stdout, re.M)]
    return curve, [float(s) for s in re.findall(r"\| ([\d.]+) s/step", proc.stdout)]


def decode(tok, examples, how, batch):
    """how(list of prompt ids) -> an object with .rows (each .tokens, .forwards) and maybe .windows."""
    responses, tokens, forwards, windows = [], [], [], []
    for i in range(0, len(examples), batch):
        out = how([tok.prompt_ids(prompt_messages(ex)) for ex in examples[i:i + batch]])
        for row in out.rows:
            responses.append(tok.decode([t for t in row.tokens if t not in tok.stop_ids]))
            tokens.append(len(row.tokens))
            forwards.append(row.forwards)
        windows += [w for row in (getattr(out, "windows", None) or []) for w in row]
    scored = powered_eval.outcomes(examples, responses, tokens, forwards)
    if windows:
        scored["window"] = sum(windows) / len(windows)  # proposals per forward: the compute a forward spends
    return scored


class Rows(NamedTuple):  # block_diffusion_decode decodes one prompt at a time
    rows: list


def evaluate(path, row, examples, cfg, device):
    """"all": tau 1 on every prompt (greedy; BD3LM its sampler); "sweep": each tau on the sweep prompts."""
    model, tok, _, _ = load_model(path, device)
    n, stop, mask, batch = cfg["max_new_tokens"], tok.stop_ids, tok.mask_id, cfg["decode_batch"]
    if "bd3lm" in row.flags:  # not an AR model: every point is its own sampler's
        at = lambda tau: lambda ps: Rows([block_diffusion_decode(model, p, n, mask, row.B, tau, stop) for p in ps])  # noqa: E731
        scores = {"all": decode(tok, examples, at(1.0), batch)}
    else:
        at = lambda tau: lambda ps: batch_decode(model, ps, n, mask, row.B, tau, stop)  # noqa: E731
        scores = {"all": decode(tok, examples, lambda ps: batch_ar(model, ps, n, stop), batch)}
    if row.taus:
        sweep = powered_eval.subset(examples, cfg["sweep_per_family"])
        scores["sweep"] = {f"{tau:g}": decode(tok, sweep, at(tau), batch) for tau in row.taus}
    return scores


def train_and_evaluate(run_dir, row, flags, seed, cfg, meta, examples, per_epoch):
    """Trains one row (train.py `flags`, the held-out loss every epoch) and evaluates it -> its record's fields."""
    os.makedirs(run_dir, exist_ok=True)
    c0, t0 = core_seconds(), time.time()
    curve, step_s = train(row.stage, run_dir, flags, seed, {**cfg, "model": [*cfg["model"], "--device", meta["device"]]},
                          per_epoch)
    c1, t1 = core_seconds(), time.time()
    path = os.path.join(run_dir, f"{row.stage}.pt")
    scores = evaluate(path, row, examples, cfg, meta["device"])
    return {"steps": curve[-1][0], "step_seconds": statistics.median(step_s), "train_seconds": t1 - t0,
            "train_core_seconds": c1 - c0, "eval_seconds": time.time() - t1, "held_out_loss": curve,
            "digest": weights_digest(path), **scores}
