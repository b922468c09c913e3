"""
A copy task: the answer is a span of the prompt, word for word, so every answer token can be found in the
context (prompt lookup decoding's home ground, docs/peers.md). The prompt holds a list of 11-19 distinct
words in brackets, between a few other words that are not to be copied:

    Copy the list between the brackets: owl, brush [kiwi, saw, duck, ..., pear] lemon.
    -> kiwi, saw, duck, ..., pear

Every word of a prompt is different (so the copy never has to choose between two places), and every word
with a space before it is one token of the default tokenizer: answers are 21-39 tokens.

    python data/copy_task.py [--out out/copy] [--n_train 20000] [--n_test 200]

writes <out>/train.jsonl and <out>/test.jsonl, deterministic from --seed; no test list occurs in train.
check(example, response) is the exact-match checker (tools/bench.py / tools/evaluate.py --check data/copy_task.py:check):
    python train.py --stage ar --data out/copy/train.jsonl --out_dir out/copy
"""
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from nanomars.util.tasks import WORDS, user_prompt, write_split_command

LIST_LEN = (11, 19)  # words in the brackets: 2 tokens a word (", word") less one, + the first word's 1-3
AROUND = (1, 4)  # words before the brackets, and after them


def example(before, words, after):
    prompt = f"Copy the list between the brackets: {', '.join(before)} [{', '.join(words)}] {', '.join(after)}."
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": ", ".join(words)}]}


def bracketed(prompt):
    """The span the answer copies: what lies between the prompt's brackets."""
    return prompt[prompt.index("[") + 1:prompt.index("]")]


def check(example, response):
    """Exact match with the bracketed span of the example's prompt (not with its stored answer)."""
    return response.strip() == bracketed(user_prompt(example))


def make_split(n_train, n_test, seed):
    rng = random.Random(seed)
    seen, rows = set(), []
    while len(rows) < n_train + n_test:
        n_list, n_before, n_after = rng.randint(*LIST_LEN), rng.randint(*AROUND), rng.randint(*AROUND)
        drawn = rng.sample(WORDS, n_before + n_list + n_after)  # all different
        words = tuple(drawn[n_before:n_before + n_list])
        if words not in seen:  # a list is held out whatever words surround it
            seen.add(words)
            rows.append(example(drawn[:n_before], words, drawn[n_before + n_list:]))
    return rows[n_test:], rows[:n_test]


def main():
    write_split_command(__doc__, make_split, "out/copy", 20000)


if __name__ == "__main__":
    main()
