"""
A long-answer task: worked multi-step arithmetic. The prompt gives a start number and 2 to 4 operations;
the answer works them out step by step and ends in "The answer is N." (GSM8K's shape, closer to the length
of the paper's responses: 25-63 tokens with the default tokenizer, median 46, every digit a token), so a
decoding block of 16 fits inside one answer. Checked by a program that solves the prompt (only the final number
counts, as in GSM8K). Not part of nanomars.util.tasks.FAMILIES: the default run and its held-out split are
unchanged; experiments/power_grid.py mixes it in.

    python data/worked_arithmetic.py [--out out/worked] [--n_train 3000] [--n_test 200]

writes <out>/train.jsonl and <out>/test.jsonl (test prompts never occur in train); then, e.g.:
    python train.py --stage ar --data out/worked/train.jsonl --out_dir out/worked
"""
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from nanomars.util.tasks import user_prompt, write_split_command

NAME = "worked_arithmetic"
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def generate(rng):
    """-> (prompt, answer). No value below 0; a product only of a number below 100 (every value < 1300)."""
    value = start = rng.randint(10, 99)
    steps, lines = [], []
    for _ in range(rng.randint(2, 4)):
        op = rng.choice(["+"] + ["-"] * (value >= 2) + ["*"] * (value <= 99))
        n = rng.randint(2, 9) if op == "*" else rng.randint(2, min(99, value)) if op == "-" else rng.randint(2, 99)
        steps.append(f"{op} {n}")
        lines.append(f"{value} {op} {n} = {OPS[op](value, n)}.")
        value = OPS[op](value, n)
    prompt = f"Start with {start}, then {', '.join(steps)}. Show each step."
    return prompt, " ".join(lines) + f" The answer is {value}."


def solve(prompt):
    value = int(re.match(r"Start with (\d+)", prompt)[1])
    for op, n in re.findall(r"([-+*]) (\d+)", prompt):
        value = OPS[op](value, int(n))
    return value


def check(prompt, response):
    answers = re.findall(r"The answer is (-?\d+)", response)
    return bool(answers) and int(answers[-1]) == solve(prompt)


def make_example(rng) -> dict:
    prompt, answer = generate(rng)
    return {"family": NAME, "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}


def make_split(n_train, n_test, seed):
    rng = random.Random(seed)
    test = [make_example(rng) for _ in range(n_test)]
    held_out, train = {user_prompt(ex) for ex in test}, []
    while len(train) < n_train:
        ex = make_example(rng)
        if user_prompt(ex) not in held_out:
            train.append(ex)
    return train, test


def main():
    write_split_command(__doc__, make_split, "out/worked", 3000)


if __name__ == "__main__":
    main()
