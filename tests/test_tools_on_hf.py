"""tools/bench.py and tools/evaluate.py on a Hugging Face folder (its own tokenizer) with the user's JSONL data and
checker: what a GPU user runs on a released MARS checkpoint, here on a tiny random Qwen2 folder."""
import json
import os
import subprocess
import sys

import pytest

from nanomars.util.checkpoint import load_model
from nanomars.decode import ar_decode, mars_decode
from nanomars.scale.tiny_qwen import tiny_hf_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def answers(model, tok, conversations, tau=None):
    """The responses the tools check: greedy AR's (tau None) or MARS's at tau, 6 new tokens, stop token cut."""
    decode = (lambda p: ar_decode(model, p, 6, stop_ids=tok.stop_ids)) if tau is None else (
        lambda p: mars_decode(model, p, 6, tok.mask_id, 4, tau, tok.stop_ids))
    return [tok.decode([t for t in decode(tok.prompt_ids(c)).tokens if t not in tok.stop_ids]) for c in conversations]


CONVERSATIONS = [[{"role": "user", "content": f"say {w}"}] for w in ("yes", "no", "maybe")] + [
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},  # multi-turn: answers the last
     {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]]
SAME_LENGTH = ("def same_length(example, response):\n"
               "    return len(response) == len(example['messages'][-1]['content'])\n")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_tools")
    tiny_hf_folder(str(d / "model"))
    # the references, from greedy AR's answers decoded here: the first two are them, the third is another
    # answer of the same length, the fourth one character longer. Exact match: right on 2 of 4; a user's
    # checker that compares lengths (a format check, like the suite's "exactly n words"): 3 of 4
    ar = answers(*load_model(str(d / "model"))[:2], CONVERSATIONS)
    references = [ar[0], ar[1], "x" * len(ar[2]), ar[3] + "x"]
    assert references[2] != ar[2]
    rows = [{"messages": c + [{"role": "assistant", "content": r}]} for c, r in zip(CONVERSATIONS, references)]
    (d / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "checks.py").write_text(SAME_LENGTH)
    return d


def run(*args):
    r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout, r.stderr


@pytest.mark.slow
def test_evaluate_on_a_folder_with_a_users_checker(setup):
    d = setup
    rc, out, err = run("tools/evaluate.py", "--ckpt", str(d / "model"), "--data", str(d / "data.jsonl"), "--ar",
                       "--taus", "1", "0.5", "--max_new_tokens", "6", "--check", f"{d / 'checks.py'}:same_length")
    assert rc == 0, err
    assert "4 prompts from" in out
    table = {line.split()[0] + (line.split()[1] if line.startswith("MARS") else ""): line.split()
             for line in out.splitlines()[2:]}
    assert set(table) == {"AR", "MARSt=1", "MARSt=0.5"}
    # accuracy ("all", then tok/fwd, seconds): the user's checker on each response, which is AR's at tau 1
    assert float(table["AR"][-3]) == float(table["MARSt=1"][-3]) == 0.75
    model, tok, _, _ = load_model(str(d / "model"))
    references = [json.loads(line)["messages"][-1]["content"] for line in open(d / "data.jsonl")]
    mars = answers(model, tok, CONVERSATIONS, tau=0.5)
    assert float(table["MARSt=0.5"][-3]) == sum(len(m) == len(r) for m, r in zip(mars, references)) / 4
    assert float(table["MARSt=1"][-2]) == 1.0  # tau 1 accepts one token per forward


@pytest.mark.slow
def test_bench_on_a_folder_with_jsonl(setup):
    d = setup
    rc, out, err = run("tools/bench.py", "--ckpt", str(d / "model"), "--data", str(d / "data.jsonl"), "--batch_sizes",
                       "1", "2", "--max_new_tokens", "6", "--out", str(d / "bench"))
    assert rc == 0, err
    assert "4 prompts from" in out
    results = json.load(open(d / "bench.json"))["results"]
    ar = [r for r in results if r["strategy"] == "AR+cache"]
    assert [r["batch_size"] for r in ar] == [1, 2] and all(r["tokens_per_forward"] == 1.0 for r in ar)
    lossless = [r for r in results if r["strategy"] == "Lossless MARS"]
    for a, b in zip(ar, lossless):  # exact match with the reference (2 of 4): lossless answers exactly as AR
        assert a["accuracy"] == b["accuracy"] == 0.5


@pytest.mark.parametrize("spec, says", [("nope", "expected 'suite'"), ("missing_file.py:f", "cannot load"),
                                        ("nanomars.util.tasks:no_such_function", "has no function")])
@pytest.mark.slow
def test_bad_checker_is_one_line(setup, spec, says):
    rc, out, err = run("tools/evaluate.py", "--ckpt", str(setup / "model"), "--data", str(setup / "data.jsonl"),
                       "--taus", "1", "--check", spec)
    assert rc != 0 and err.startswith("error:") and says in err and "Traceback" not in err
