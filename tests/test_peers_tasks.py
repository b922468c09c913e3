"""experiments/peers_tasks.py --quick: the runner's own code on a tiny model, every step of both tasks, every
peer row in bench's table, resumable."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from experiments.peers_tasks import STEPS, TASKS  # noqa: E402

PEERS = {"AR+cache", "MARS per-request", "Lossless MARS", "Prompt lookup", "Draft model", "Medusa verified",
         "Medusa tau gate"}


def run(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "peers_tasks.py"), "--quick",
           "--results", str(tmp_path / "results.jsonl"), "--out", str(tmp_path / "runs")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [json.loads(line) for line in open(tmp_path / "results.jsonl")]


@pytest.mark.slow
def test_quick_runs_every_step_of_both_tasks_and_resumes(tmp_path):
    results = run(tmp_path)
    assert [r["name"] for r in results] == [f"{task}/{step}" for task in TASKS for step in STEPS]
    for r in results:
        assert r["torch"] and r["threads"] == 1 and r["device"] == "cpu" and "commit" in r
        if r["step"] != "bench":
            assert r["held_out_loss"] and r["step_seconds"] > 0 and r["train_seconds"] > 0
    for task in TASKS:
        bench = next(r for r in results if r["name"] == f"{task}/bench")
        test = str(tmp_path / "runs" / task / "test.jsonl")
        assert bench["flags"][bench["flags"].index("--data") + 1] == test  # the task's held-out prompts
        assert not [n for n in bench["notes"] if "skipped" in n]  # the draft model and the heads were found
        rows = {(row["strategy"], row["batch_size"]) for row in bench["table"]}
        assert {(s, b) for s in PEERS for b in (1, 2)} <= rows
        with open(tmp_path / f"peers_{task}.json") as f:  # bench's own file, beside the results
            assert json.load(f)["results"] == bench["table"]
    check = next(r for r in results if r["name"] == "copy/bench")["flags"]
    assert check[check.index("--check") + 1].endswith("copy_task.py:check")

    assert run(tmp_path) == results  # a second sitting finds every step done and adds nothing
    with open(tmp_path / "results.jsonl", "w") as f:  # stopped before its last step: only that one runs again
        f.writelines(json.dumps(r) + "\n" for r in results[:-1])
    again = run(tmp_path)
    assert again[:-1] == results[:-1] and again[-1]["name"] == "copy/bench"
