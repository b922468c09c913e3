"""
MARS and its peers (docs/peers.md) on two more tasks: the fixed-template task
(data/template_task.py: every prompt the same length, answers that barely vary) and the copy task
(data/copy_task.py: the answer is a span of the prompt, prompt lookup's home ground).

    nohup python experiments/peers_tasks.py > out/peers_tasks.log 2>&1 &     # resumable: re-run to continue
    python experiments/peers_tasks.py --quick --results /tmp/q.jsonl --out /tmp/q   # tiny model, seconds (CI)

Run from a fixed commit in its own git worktree, so edits on main cannot change a running experiment.
For each task, in out/peers_tasks/<task>/ (--out), from its train.jsonl (each task script's default size:
template 3000 examples, as experiments/alignment.py trained on; copy 20000, as many as the suite's, so the
model learns to copy rather than to recall lists) and test.jsonl (200 held-out examples, the first 100
benchmarked), each step one train.py or tools/bench.py run:
    ar      python train.py --stage ar --data train.jsonl --out_dir <task>       default model (4 x 128)
    mars    python train.py --stage mars --data train.jsonl --out_dir <task>     stage 2 from ar.pt
    draft   python train.py --stage ar --data train.jsonl --n_layer 1 --n_embd 64 --n_head 4 --n_kv_head 2 \\
                --intermediate_size 176 --out_dir <task>/draft                   docs/peers.md's draft model
    medusa  python train.py --stage medusa --data train.jsonl --out_dir <task>   K = 3 heads on the frozen ar.pt
    bench   python tools/bench.py --ckpt <task>/mars.pt --data test.jsonl --check <the task's checker> \\
                --draft <task>/draft/ar.pt --medusa <task>/medusa.pt --n_prompts 100 --batch_sizes 1 16 \\
                --out experiments/peers_<task>                                   (beside --results)
Every training run takes train.py's defaults (1200 steps, batch 32, seed 1337), but for the copy task's
target model, which trains 4000 steps: in 1200 it learnt the format, not to copy (accuracy 0.00; that
run, from 7eb1f91, is in git history at cb5b0eb). MARS and the heads get the same examples and steps
(1200), as in docs/peers.md; the template task needed no more. Every finished step appends one
JSON line to experiments/peers_tasks.jsonl (--results) with the torch version, the thread count, the device
and the git commit, and is skipped when the runner starts again (a step stopped midway starts over); the
bench step's line holds tools/bench.py's whole table (its rows as in experiments/peers_<task>.json).

CPU time (one thread, measured on 2 cores at load ~2 over 15 steps of each run; the held-out loss
evaluations and checkpoints add a little): seconds per step, template / copy: AR 0.14 / 0.27, MARS 0.32 /
0.61, Medusa heads 0.08 / 0.11, draft model 0.03 / 0.07 (the copy task's examples are about twice as
long). Training: template 1200 x 0.58 s = 11.5 min, copy 4000 x 0.27 + 1200 x 0.79 s = 34 min. tools/bench.py: at
most 6 min a task (measured with models trained 16 steps, which never stop: 2.7 s a prompt at batch 1 and
0.8 s at batch 16 for all ~20 rows, 64 new tokens each), about half that with trained models whose answers
stop after 15-40 tokens. In all about an hour. (A slower machine, whose copy AR step took 1.13 s and MARS
step 2.77 s, needs about 2.5 hours.)
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data import copy_task, template_task  # noqa: E402
from experiments.power_grid import provenance  # noqa: E402
from experiments.resumable import done, record  # noqa: E402
from nanomars.util.progress import Progress  # noqa: E402
from nanomars.util.tasks import write_jsonl  # noqa: E402

# task: (its module, training examples, tools/bench.py's --check, stage-1 steps of the target model)
TASKS = {"template": (template_task, 3000, "suite", 1200),  # suite: exact match for examples without a family
         "copy": (copy_task, 20000, os.path.join(ROOT, "data", "copy_task.py") + ":check", 4000)}
STEPS = ("ar", "mars", "draft", "medusa", "bench")


def shape(layers, width, heads, kv_heads, mlp):
    return ["--n_layer", str(layers), "--n_embd", str(width), "--n_head", str(heads), "--n_kv_head", str(kv_heads),
            "--intermediate_size", str(mlp)]


# n_train None: the task's own (TASKS); model: train.py's flags for the target's shape ([]: its default)
FULL = dict(n_train=None, n_test=200, model=[], draft=shape(1, 64, 4, 2, 176), train=[],
            bench=["--n_prompts", "100", "--batch_sizes", "1", "16"])
QUICK = dict(n_train=64, n_test=4, model=shape(1, 32, 2, 1, 64), draft=shape(1, 16, 2, 1, 32),
             train=["--max_iters", "4", "--batch_size", "8", "--eval_interval", "2", "--eval_batches", "1"],
             bench=["--n_prompts", "4", "--batch_sizes", "1", "2", "--max_new_tokens", "8"])


def write_task(task, task_dir, cfg):
    """The task's train.jsonl and test.jsonl (deterministic: written again on every start)."""
    module, n_train = TASKS[task][:2]
    train, test = module.make_split(cfg["n_train"] or n_train, cfg["n_test"], seed=0)
    os.makedirs(task_dir, exist_ok=True)
    write_jsonl(os.path.join(task_dir, "train.jsonl"), train)
    write_jsonl(os.path.join(task_dir, "test.jsonl"), test)
    return len(train), len(test)


def run(script, flags, log):
    """Runs train.py or tools/bench.py (cwd: the repository), its output kept in `log`; returns stdout, seconds."""
    t0 = time.time()
    cmd = [sys.executable, os.path.join(ROOT, script), *flags]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    with open(log, "w") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"{script} {' '.join(flags)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout, time.time() - t0


def train(stage, out_dir, flags, device):
    """One train.py run -> its record's fields: seconds, held-out loss curve [(step, {name: loss})] and the
    mean seconds per step train.py logged last."""
    os.makedirs(out_dir, exist_ok=True)
    flags = ["--stage", stage, "--out_dir", out_dir, "--device", device, *flags]
    out, seconds = run("train.py", flags, os.path.join(out_dir, f"{stage}.log"))
    curve = [(int(m[1]), {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+)", m[2])})
             for m in re.finditer(r"^eval +(\d+) \| held-out (.*)$", out, re.M)]
    step_s = re.findall(r"\| ([\d.]+) s/step", out)
    return {"train_seconds": seconds, "held_out_loss": curve, "step_seconds": float(step_s[-1]), "flags": flags}


def step(task, name, task_dir, cfg, args, tables):
    """Runs one step (STEPS) of a task -> its record's fields."""
    data = ["--data", os.path.join(task_dir, "train.jsonl"), *cfg["train"]]
    if name == "ar":  # the task's own number of steps (not in --quick, whose steps are few for every run)
        steps = [] if args.quick else ["--max_iters", str(TASKS[task][3])]
        return train("ar", task_dir, [*data, *cfg["model"], *steps], args.device)
    if name in ("mars", "medusa"):  # from task_dir/ar.pt
        return train(name, task_dir, data, args.device)
    if name == "draft":
        return train("ar", os.path.join(task_dir, "draft"), [*data, *cfg["draft"]], args.device)
    flags = ["--ckpt", os.path.join(task_dir, "mars.pt"), "--data", os.path.join(task_dir, "test.jsonl"),
             "--check", TASKS[task][2], "--draft", os.path.join(task_dir, "draft", "ar.pt"),
             "--medusa", os.path.join(task_dir, "medusa.pt"), *cfg["bench"], "--out", tables,
             "--threads", str(args.threads), "--device", args.device]
    out, seconds = run("tools/bench.py", flags, os.path.join(task_dir, "bench.log"))
    with open(tables + ".json") as f:
        table = json.load(f)
    return {"bench_seconds": seconds, "flags": flags, "printed": out, "notes": table["notes"],
            "table": table["results"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tiny model, a few steps, 4 prompts: seconds (CI)")
    p.add_argument("--results", default=os.path.join(ROOT, "experiments", "peers_tasks.jsonl"),
                   help="one JSON line per finished step; bench tables are written beside it (peers_<task>.json)")
    p.add_argument("--out", default=os.path.join(ROOT, "out", "peers_tasks"), help="data, checkpoints and logs")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of every train.py and tools/bench.py run")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS), help="the tasks to run")
    args = p.parse_args()
    cfg = QUICK if args.quick else FULL
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # train.py's processes (tools/bench.py takes --threads)
    meta = provenance(args.threads, args.device)
    finished = done(args.results)
    progress = Progress(len({f"{t}/{s}" for t in args.tasks for s in STEPS} - finished), "peers_tasks")
    for task in args.tasks:
        task_dir = os.path.abspath(os.path.join(args.out, task))
        n_train, n_test = write_task(task, task_dir, cfg)
        tables = os.path.join(os.path.dirname(os.path.abspath(args.results)), f"peers_{task}")
        for name in STEPS:
            key = f"{task}/{name}"
            if key in finished:
                continue
            progress.update(what=key)
            fields = step(task, name, task_dir, cfg, args, tables)
            if name == "bench":
                progress.print(fields.pop("printed"))
            record(args.results, {"name": key, "task": task, "step": name, "n_train": n_train, "n_test": n_test,
                                  **meta, **fields}, progress.print)
            progress.update(1)
    progress.close()


if __name__ == "__main__":
    main()
