"""bench.py and evaluate.py on a Hugging Face folder (its own tokenizer) with the user's JSONL data and
checker: what a GPU user runs on a released MARS checkpoint, here on a tiny random Qwen2 folder."""
import json
import os
import subprocess
import sys

import pytest

from tests.tiny_qwen import tiny_hf_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_tools")
    tiny_hf_folder(str(d / "model"))
    rows = [{"messages": [{"role": "user", "content": f"say {w}"}, {"role": "assistant", "content": w}]}
            for w in ("yes", "no", "maybe")]
    rows.append({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                              {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"},
                              {"role": "assistant", "content": "bye"}]})  # multi-turn: answers the last
    (d / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # a user's checker: right iff the reference is "no", whatever the response (exactly 1 of 4); exact
    # match would score a random model 0
    (d / "checks.py").write_text("def only_no(example, response):\n"
                                 "    return example['messages'][-1]['content'] == 'no'\n")
    return d


def run(*args):
    r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout, r.stderr


def test_evaluate_on_a_folder_with_a_users_checker(setup):
    d = setup
    rc, out, err = run("evaluate.py", "--ckpt", str(d / "model"), "--data", str(d / "data.jsonl"), "--ar",
                       "--taus", "1", "0.5", "--max_new_tokens", "6", "--check", f"{d / 'checks.py'}:only_no")
    assert rc == 0, err
    assert "4 prompts from" in out
    table = {line.split()[0] + (line.split()[1] if line.startswith("MARS") else ""): line.split()
             for line in out.splitlines()[2:]}
    assert set(table) == {"AR", "MARSt=1", "MARSt=0.5"}
    for cells in table.values():  # accuracy ("all", then tok/fwd, seconds): the checker passes 1 of 4
        assert float(cells[-3]) == 0.25
    assert float(table["MARSt=1"][-2]) == 1.0  # tau 1 accepts one token per forward


def test_bench_on_a_folder_with_jsonl(setup):
    d = setup
    rc, out, err = run("bench.py", "--ckpt", str(d / "model"), "--data", str(d / "data.jsonl"), "--batch_sizes",
                       "1", "2", "--max_new_tokens", "6", "--out", str(d / "bench"))
    assert rc == 0, err
    assert "4 prompts from" in out
    results = json.load(open(d / "bench.json"))["results"]
    ar = [r for r in results if r["strategy"] == "AR+cache"]
    assert [r["batch_size"] for r in ar] == [1, 2] and all(r["tokens_per_forward"] == 1.0 for r in ar)
    lossless = [r for r in results if r["strategy"] == "Lossless MARS"]
    for a, b in zip(ar, lossless):  # exact match with the reference: lossless answers exactly as AR
        assert a["accuracy"] == b["accuracy"]


@pytest.mark.parametrize("spec, says", [("nope", "expected 'suite'"), ("missing_file.py:f", "cannot load"),
                                        ("nanomars.tasks:no_such_function", "has no function")])
def test_bad_checker_is_one_line(setup, spec, says):
    rc, out, err = run("evaluate.py", "--ckpt", str(setup / "model"), "--data", str(setup / "data.jsonl"),
                       "--taus", "1", "--check", spec)
    assert rc != 0 and err.startswith("error:") and says in err and "Traceback" not in err
