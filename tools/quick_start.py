"""
The README's quick start, timed from a fresh clone, one commit's recipe beside another's:
  python tools/quick_start.py a8381c4 6695120 0c57f0a --threads 2 --out docs/quick_start.json   # docs/results.md's
For each commit, in a fresh clone of this repository (that commit checked out, nothing trained, no bytecode):
`python train.py --stage ar`, `python train.py --stage mars` and `python sample.py --compare_ar`, each
timed in wall clock with --threads torch threads (OMP_NUM_THREADS). All the timings come first, commit after
commit, so that the machine can be kept idle for them alone: --timed FILE is created when they end. Then
this checkout's tools/bench.py decodes the held-out suite with each commit's model (one thread, batch 1; no
draft model or Medusa rows), so both models are judged by the same code: tokens/forward of MARS at tau 0.95
(per-request cache) and the accuracy of MARS and of greedy AR; and each clone's sample.py decodes its
prompt at several tau. Writes the timings, the bench rows, the samples and the machine (CPU model, torch,
load averages before and after the timings) as JSON; docs/results.md quotes it ("Training"),
and tests/test_quick_start.py checks the quotes.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {"ar": ["train.py", "--stage", "ar"], "mars": ["train.py", "--stage", "mars"],
            "sample": ["sample.py", "--compare_ar"]}
BENCH_ROWS = {"AR+cache": "ar", "MARS per-request": "mars"}  # bench.py's row -> this file's name for it


def cpu_model():
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.machine())


def time_quick_start(commit, folder, env):
    """Clones this repository at `commit` into folder and times the README's three commands there."""
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", ROOT, folder], check=True)
    subprocess.run(["git", "checkout", "--quiet", commit], cwd=folder, check=True)
    record = {"commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=folder, check=True,
                                       capture_output=True, text=True).stdout.strip(), "seconds": {}, "loop": {}}
    for name, command in COMMANDS.items():
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, *command], cwd=folder, env=env, capture_output=True, text=True)
        record["seconds"][name] = round(time.perf_counter() - t0, 1)
        if proc.returncode:
            sys.exit(f"{commit}: {' '.join(command)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        print(f"{commit}: {' '.join(command)}: {record['seconds'][name]} s", flush=True)
        if name == "sample":
            record["sample"] = proc.stdout
        else:  # train.py's own count: the steps and the seconds of its loop (evaluations and checkpoints included)
            steps, seconds = re.search(r"done: (\d+) steps in ([\d.]+) s", proc.stdout).groups()
            record["loop"][name] = {"steps": int(steps), "seconds": float(seconds)}
    record["seconds"]["total"] = round(sum(record["seconds"].values()), 1)
    return record


def bench(folder, env):
    """tools/bench.py (this checkout's) on the clone's model: {ar: {...}, mars: {...}}; and the clone's
    sample.py at several tau (docs/results.md, "The sample at several tau")."""
    taus = subprocess.run([sys.executable, "sample.py", "--taus", "1", "0.95", "0.7", "0.3"], cwd=folder, env=env,
                          check=True, capture_output=True, text=True).stdout
    out = os.path.join(folder, "out", "bench")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench.py"), "--ckpt", "out/mars.pt", "--draft",
                    "none", "--medusa", "none", "--batch_sizes", "1", "--threads", "1", "--out", out], cwd=folder,
                   check=True, capture_output=True)
    with open(out + ".json") as f:
        rows = json.load(f)["results"]
    keys = ("tokens_per_forward", "accuracy", "same_as_ar")
    return taus, {BENCH_ROWS[r["strategy"]]: {k: round(r[k], 3) for k in keys}
                  for r in rows if r["strategy"] in BENCH_ROWS}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("commits", nargs="+", help="the commits whose recipes are timed, in this order")
    p.add_argument("--threads", type=int, default=2, help="torch threads of every command (OMP_NUM_THREADS)")
    p.add_argument("--out", default="out/quick_start.json")
    p.add_argument("--timed", default=None, help="a file to create when the timings end (the benches follow)")
    args = p.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONDONTWRITEBYTECODE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        load_before = os.getloadavg()
        runs = [time_quick_start(c, os.path.join(tmp, str(i)), env) for i, c in enumerate(args.commits)]
        load_after = os.getloadavg()
        if args.timed:
            open(args.timed, "w").close()
        for i, run in enumerate(runs):
            run["taus"], run["bench"] = bench(os.path.join(tmp, str(i)), env)
            print(f"{run['commit']}: {run['bench']}", flush=True)
    import torch
    machine = dict(cpu=cpu_model(), cores=os.cpu_count(), torch=torch.__version__, threads=args.threads,
                   load_before=[round(x, 2) for x in load_before], load_after=[round(x, 2) for x in load_after])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(dict(machine=machine, runs=runs), f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
