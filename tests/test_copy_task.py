"""data/copy_task.py: held-out lists never trained on, the exact-match checker, answers of 20-40 tokens that
are a run of the prompt's own tokens, and the JSONL files its command line writes."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data import copy_task  # noqa: E402
from nanomars.util.tasks import load_checker, prompt_messages, read_jsonl, user_prompt  # noqa: E402


def answer(ex):
    return ex["messages"][-1]["content"]


def test_splits_are_disjoint_sized_and_set_by_the_seed():
    train, test = copy_task.make_split(3000, 200, seed=0)
    assert len(train) == 3000 and len(test) == 200
    lists = lambda rows: {copy_task.bracketed(user_prompt(ex)) for ex in rows}  # noqa: E731
    assert len(lists(test)) == 200 and not lists(train) & lists(test)  # no held-out list is trained on
    assert copy_task.make_split(3000, 200, seed=0) == (train, test)
    assert copy_task.make_split(3000, 200, seed=1)[1] != test


def test_checker_is_exact_match_with_the_prompts_span():
    _, test = copy_task.make_split(0, 50, seed=0)
    for ex in test:
        ref = answer(ex)
        words = ref.split(", ")
        assert copy_task.check(ex, ref) and copy_task.check(ex, f" {ref}\n")
        assert not copy_task.check(ex, ", ".join(words[:-1]))  # a word short
        assert not copy_task.check(ex, ", ".join([words[1], words[0], *words[2:]]))  # two words swapped
        assert not copy_task.check(ex, ref + ".")
        before = user_prompt(ex).split(": ", 1)[1].split(" [")[0]
        assert not copy_task.check(ex, f"{before}, {ref}")  # the words around the brackets are not the list
    ex = test[0]  # the checker reads the prompt, not the stored answer
    wrong_ref = {"messages": [*prompt_messages(ex), {"role": "assistant", "content": "cat"}]}
    assert copy_task.check(wrong_ref, answer(ex)) and not copy_task.check(wrong_ref, "cat")


def test_answers_are_20_to_40_tokens_copied_from_the_prompt(tok):
    train, test = copy_task.make_split(2000, 200, seed=0)
    lengths = []
    for ex in train + test:
        ids, prompt = tok.encode(answer(ex)), tok.prompt_ids(prompt_messages(ex))
        lengths.append(len(ids))
        # the answer's tokens are a run of the prompt's tokens: a lookup of the prompt can draft all of it
        assert any(prompt[i:i + len(ids)] == ids for i in range(len(prompt)))
    assert min(lengths) >= 20 and max(lengths) <= 40 and 25 <= sorted(lengths)[len(lengths) // 2] <= 35


def test_command_line_writes_the_splits_and_bench_loads_the_checker(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "data", "copy_task.py"), "--out", str(tmp_path), "--n_train", "40",
           "--n_test", "10", "--seed", "3"]
    subprocess.run(cmd, check=True, capture_output=True)
    train, test = copy_task.make_split(40, 10, seed=3)
    assert read_jsonl(tmp_path / "train.jsonl") == train and read_jsonl(tmp_path / "test.jsonl") == test
    check = load_checker(os.path.join(ROOT, "data", "copy_task.py") + ":check")
    assert check(test[0], answer(test[0])) and not check(test[0], answer(test[1]))
