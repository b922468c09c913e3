import json
import random
import re
from pathlib import Path

import pytest

from nanomars.util import tasks

def wrong(family, answer):
    """A plausible but wrong answer for each family."""
    if family == "arithmetic":
        return re.sub(r"The answer is (\d+)", lambda m: f"The answer is {int(m[1]) + 1}", answer)
    return {"boolean": lambda a: {"True": "False", "False": "True"}[a],
            "sorting": lambda a: ", ".join(reversed(a.split(", "))),
            "counting": lambda a: str(int(a) + 1),
            "format": lambda a: a + " extra",
            "facts": lambda a: "ABCD"[("ABCD".index(a) + 1) % 4],
            "code": lambda a: a + "z"}[family](answer)

@pytest.mark.parametrize("family", list(tasks.FAMILIES))
def test_family_checks_its_own_answers(family):
    rng = random.Random(0)
    for _ in range(200):
        ex = tasks.make_example(family, rng)
        answer = ex["messages"][1]["content"]
        assert tasks.check(ex, answer), ex
        assert tasks.check(ex, f"  {answer}\n"), "responses are checked after stripping whitespace"
        assert not tasks.check(ex, wrong(family, answer)), ex
        assert not tasks.check(ex, "")

def test_format_checks_the_constraint_not_the_string():
    def ok(prompt, response):
        return tasks.check({"family": "format", "messages": [{"role": "user", "content": prompt}]}, response)
    caps = "Write the word 'cat' 3 times in capital letters, separated by commas."
    assert ok(caps, "CAT,CAT , CAT") and not ok(caps, "cat, cat, cat") and not ok(caps, "CAT, CAT")
    words = "Answer with exactly 4 words about the sea."
    assert ok(words, "waves crash on rocks") and not ok(words, "waves crash")
    bullets = "List 2 fruits, one per line, each line starting with '* '."
    assert ok(bullets, "* kiwi\n* pear") and not ok(bullets, "* kiwi\n* kiwi") and not ok(bullets, "- kiwi\n- pear")
    assert not ok(bullets, "* kiwi\n* dog")

def test_garbage_response_is_just_wrong():
    for ex in tasks.held_out_split(3):
        assert not tasks.check(ex, "<|mask|> ??? \n\n The answer is")

def test_test_split_fixed_and_committed():
    test = tasks.held_out_split()
    assert test == tasks.held_out_split() and len(test) == 50 * len(tasks.FAMILIES)
    # data/test.jsonl is what prepare.py wrote; it must match the generator (rerun prepare.py if not)
    assert tasks.read_jsonl(Path(__file__).parent.parent / "data" / "test.jsonl") == test
    small = tasks.held_out_split(5)  # a quick eval uses a prefix of each family: still held out
    assert all(ex in test for ex in small) and len(small) == 5 * len(tasks.FAMILIES)

def test_train_disjoint_from_test_and_balanced():
    held_out = {tasks.user_prompt(ex) for ex in tasks.held_out_split()}
    train = tasks.train_examples(3500, seed=0)
    assert not held_out & {tasks.user_prompt(ex) for ex in train}
    counts = {f: sum(ex["family"] == f for ex in train) for f in tasks.FAMILIES}
    assert set(counts.values()) == {3500 // len(tasks.FAMILIES)}
    assert train == tasks.train_examples(3500, seed=0) and train != tasks.train_examples(3500, seed=1)

def test_jsonl_roundtrip(tmp_path):
    examples = tasks.train_examples(20, seed=0) + [{"messages": [{"role": "assistant", "content": "é 🙂"}]}]
    tasks.write_jsonl(tmp_path / "x.jsonl", examples)
    assert tasks.read_jsonl(tmp_path / "x.jsonl") == examples

@pytest.mark.parametrize("bad", ['{"messages": [', '{"text": "hi"}', '{"messages": [{"role": "user", "content": "hi"}]}',
                                 '{"messages": [{"role": "assistant"}]}', '[1, 2]'])
def test_jsonl_malformed_line(tmp_path, bad):
    good = json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{good}\n{bad}\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2"):
        tasks.read_jsonl(path)


def test_jsonl_not_utf8_names_the_line_and_column(tmp_path):
    good = json.dumps({"messages": [{"role": "user", "content": "né"}, {"role": "assistant", "content": "a"}]},
                      ensure_ascii=False).encode()  # valid UTF-8 before the bad line is fine
    bad = b'{"messages": [{"role": "user", "content": "caf\xe9"}, {"role": "assistant", "content": "a"}]}'  # Latin-1
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(good + b"\r\n" + good + b"\r\n" + bad + b"\r\n")  # Windows line ends
    message = f"{path}, line 3: not valid UTF-8 (byte 0xe9 at column 47): save the file as UTF-8"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        tasks.read_jsonl(path)
    path.write_bytes(good + b"\n" + bad.replace(b"\xe9", b"\xc3\xa9") + b"\n")  # the same line saved as UTF-8
    assert tasks.read_jsonl(path)[1]["messages"][0]["content"] == "café"


def test_examples_from_elsewhere_are_checked_by_exact_match():
    ex = {"messages": [{"role": "user", "content": "Spell out the digits 1 2."},
                       {"role": "assistant", "content": "The digits are one, two."}]}
    assert tasks.check(ex, " The digits are one, two.\n") and not tasks.check(ex, "The digits are one, three.")
    assert tasks.check({**ex, "family": "mine"}, "The digits are one, two.")  # an unknown family: exact match too


def test_fixed_template_prompts_all_have_one_token_length(tok):
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "data", "template_task.py")
    spec = importlib.util.spec_from_file_location("template_task", path)
    template = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(template)
    train, test = template.make_split(300, 50, seed=0)
    lengths = {len(tok.prompt_ids(ex["messages"][:1])) for ex in train + test}
    assert len(lengths) == 1, lengths
    assert not {ex["messages"][0]["content"] for ex in test} & {ex["messages"][0]["content"] for ex in train}
