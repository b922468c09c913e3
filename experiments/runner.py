"""
Runners that share one queue of runs (resumable.py keeps their results file): each takes the first run that is
not done, not taken by a live runner (a claim file under --out holding its pid) and whose inputs are done;
a run that starts from another run's weights gets them through parent_weights, which retrains them where
this machine lacks them and goes on only if they are the recorded ones (their digest).
"""
import fcntl
import json
import os
import sys
import time

from experiments.resumable import core_seconds, done, record, weights_digest


def claim_run(out, name):
    """Takes `name` for this process (a claim file holding its pid); False if a live runner has it."""
    path = os.path.join(out, "claims", name.replace("/", "__"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for _ in range(2):
        try:
            with open(path, "x") as f:
                f.write(str(os.getpid()))
            return True
        except FileExistsError:
            try:
                os.kill(int(open(path).read() or 0), 0)
                return False  # its runner lives
            except (OSError, ValueError):
                os.remove(path)  # a stopped runner's claim
    return False


def run_queue(results, out, names, ready, run, meta, label, poll=60):
    """Runs `names` in order until all are in `results`: ready(name, finished) says whether a run's inputs are
    done, run(name) -> its record's fields (meta, core-seconds and wall seconds are added)."""
    while True:
        finished = done(results)
        pending = [k for k in names if k not in finished]
        if not pending:
            return print(f"{label}: all {len(names)} runs are in {results}", flush=True)
        name = next((k for k in pending if ready(k, finished) and claim_run(out, k)), None)
        if name is None:
            time.sleep(poll)  # what is left waits for another runner's parent
            continue
        print(f"{label}: {name} ({len(finished)} of {len(names)} done)", flush=True)
        try:
            c0, t0 = core_seconds(), time.time()
            row = run(name)
            record(results, {"name": name, **row, **meta, "core_seconds": core_seconds() - c0,
                             "wall_seconds": time.time() - t0})
        finally:
            os.remove(os.path.join(out, "claims", name.replace("/", "__")))


class Locked:
    """An exclusive lock on a file, so two runners never retrain the same parent at once."""
    def __init__(self, path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.f = open(path, "a")

    def __enter__(self):
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def recorded(results, name):
    with open(results) as f:
        return next(json.loads(line) for line in f if line.strip() and json.loads(line)["name"] == name)


def parent_weights(results, name, path, retrain, restart):
    """(path, digest) of the run `name`'s weights at `path`, retrain()ed where this machine lacks them; exits with
    `restart` (what the protocol says to do) if they differ from the recorded ones."""
    want = recorded(results, name)["digest"]
    with Locked(os.path.dirname(path) + ".lock"):
        if not (os.path.exists(path) and weights_digest(path) == want):  # missing, or a retraining cut short
            print(f"retraining {name} (this machine lacks it)", flush=True)
            retrain()
    got = weights_digest(path)
    if got != want:
        sys.exit(f"error: {name} on this machine has weights {got}, the recorded run {want}: the runs that start "
                 f"from it cannot be paired. {restart}")
    return path, got


def restart_seed(results, seed, keep_row=lambda row: False):
    """The protocol's way out when a seed's parent cannot be reproduced: its rows (less those keep_row(row) keeps)
    move to the superseded file, which no report reads."""
    with open(results) as f:
        lines = [line for line in f if line.strip()]
    keep = [line for line in lines if json.loads(line).get("seed") != seed or keep_row(json.loads(line)["row"])]
    gone = [line for line in lines if line not in keep]
    with open(results.replace(".jsonl", "_superseded.jsonl"), "a") as f:
        f.writelines(gone)
    with open(results + ".tmp", "w") as f:
        f.writelines(keep)
    os.replace(results + ".tmp", results)
    print(f"seed {seed}: {len(gone)} rows moved to {results.replace('.jsonl', '_superseded.jsonl')}")


def load(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
