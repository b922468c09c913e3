"""
Does MARS's block alignment cost quality, and does training with random block offsets fix it?

    python experiments/alignment.py              # resumable: finished runs in experiments/alignment.jsonl are skipped
    nohup python experiments/alignment.py > out/alignment.log 2>&1 &

Protocol (fixed before the first run): two task sets, each trained with train.py's defaults (B = 4, 1200 AR
steps then 1200 MARS steps, seed 1337), once as released (blocks counted from position 0) and once with
--random_offsets (since made train.py's default for stage mars, because of these results); one seed (the CPU budget), so differences of a point or two are within noise.
- "suite": the default task suite; held-out split of 350 prompts (50 per family), family checkers.
- "template": data/template_task.py, 3000 training prompts of one token length, 200 test prompts,
  exact match.
Each MARS model is evaluated on its test prompts (64 new tokens max) by greedy AR, MARS at tau 1 and 0.95
(plain window), plus nanomars.compare.diagnose.gate_errors at tau 0.95 (confident proposals that differ from
greedy AR, by window start c mod B); then, once all four are trained, by MARS at 0.95 with windows that
never cross a training block boundary (the engine's align=True; added after the first run, so a separate
pass). Every finished step appends one JSON line to the results file.
"""
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools.evaluate import evaluate  # noqa: E402
from experiments.resumable import done, record  # noqa: E402
from nanomars.util.checkpoint import load_model  # noqa: E402
from nanomars.compare.diagnose import format_gate_errors, gate_errors  # noqa: E402
from nanomars.util.progress import Progress  # noqa: E402
from nanomars.util.tasks import held_out_split, read_jsonl  # noqa: E402

RESULTS = os.path.join(ROOT, "experiments", "alignment.jsonl")
OUT = os.path.join(ROOT, "out", "alignment")


def train(stage, out_dir, extra):
    t0 = time.time()
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--stage", stage, "--out_dir", out_dir, *extra]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=open(os.path.join(out_dir, f"{stage}.log"), "w"))
    return time.time() - t0


def main():
    torch.set_num_threads(1)
    template = os.path.join(OUT, "template")
    os.makedirs(template, exist_ok=True)
    subprocess.run([sys.executable, os.path.join(ROOT, "data", "template_task.py"), "--out", template], check=True)
    tasks = {"suite": ([], held_out_split()),
             "template": (["--data", os.path.join(template, "train.jsonl")], read_jsonl(os.path.join(template, "test.jsonl")))}
    variants = {"as_released": ["--no-random_offsets"], "random_offsets": ["--random_offsets"]}
    finished = done(RESULTS)
    runs = ["ar", *variants, *(f"{variant}/aligned_windows" for variant in variants)]
    progress = Progress(len({f"{task}/{run}" for task in tasks for run in runs} - finished), "alignment")
    for variant, flags in variants.items():
        for task, (data_args, examples) in tasks.items():
            task_dir = os.path.join(OUT, task)
            os.makedirs(task_dir, exist_ok=True)
            if f"{task}/ar" not in finished:
                progress.update(what=f"training {task}/ar")
                seconds = train("ar", task_dir, data_args)
                record(RESULTS, {"name": f"{task}/ar", "train_seconds": seconds}, progress.print)
                finished.add(f"{task}/ar")
                progress.update(1, f"finished {task}/ar")
            name = f"{task}/{variant}"
            if name in finished:
                continue
            progress.update(what=f"training {name}")
            run_dir = os.path.join(task_dir, variant)
            os.makedirs(run_dir, exist_ok=True)
            seconds = train("mars", run_dir, [*data_args, "--init_from", os.path.join(task_dir, "ar.pt"), *flags])
            progress.update(what=f"evaluating {name}")
            model, tok, B, _ = load_model(os.path.join(run_dir, "mars.pt"))
            rows = {"AR": evaluate(model, tok, examples)}
            for tau in (1.0, 0.95):
                rows[f"MARS t={tau:g}"] = evaluate(model, tok, examples, tau, B)
            prompts = [tok.prompt_ids(ex["messages"][:1]) for ex in examples]
            counts = gate_errors(model, prompts, tok.mask_id, B, 0.95, tok.stop_ids)
            progress.print(format_gate_errors(counts))
            scores = {k: {"accuracy": v["accuracy"]["all"], "tokens_per_forward": v["tokens_per_forward"]}
                      for k, v in rows.items()}
            record(RESULTS, {"name": name, "train_seconds": seconds, "block_size": B, "eval": scores,
                             "gate_errors": {k: v.tolist() for k, v in counts.items()}}, progress.print)
            progress.update(1, f"finished {name}")
    # the decode-side alternative, on every MARS model: windows that never cross a training block boundary
    for variant in variants:
        for task, (_, examples) in tasks.items():
            name = f"{task}/{variant}/aligned_windows"
            if name in finished:
                continue
            progress.update(what=f"evaluating {name}")
            model, tok, B, _ = load_model(os.path.join(OUT, task, variant, "mars.pt"))
            r = evaluate(model, tok, examples, 0.95, B, align=True, cache="request")
            scores = {"accuracy": r["accuracy"]["all"], "tokens_per_forward": r["tokens_per_forward"]}
            record(RESULTS, {"name": name, "eval": {"MARS t=0.95 aligned": scores}}, progress.print)
            progress.update(1, f"finished {name}")
    progress.close()


if __name__ == "__main__":
    main()
