"""
A fixed-template task: every prompt has exactly the same token length, so every answer starts at the same
offset inside a MARS training block (docs/mars.md, "Decoding", on alignment). With the default suite the
prompts vary in length and the model sees every offset; here it sees one.

    python data/template_task.py [--out out/template] [--n_train 3000] [--n_test 200]

writes <out>/train.jsonl and <out>/test.jsonl, deterministic from --seed; test prompts never occur in
train. Answers are checked by exact match (nanomars.util.tasks.check does that for examples without a family):
    python train.py --stage ar --data out/template/train.jsonl --out_dir out/template
    python tools/evaluate.py --ckpt out/template/mars.pt --data out/template/test.jsonl --ar
"""
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from nanomars.util.tasks import write_split_command

WORDS = "zero one two three four five six seven eight nine".split()
N_DIGITS = 5


def example(digits):
    # each digit is one token and so is the space before it: the prompt's length never changes
    prompt = "Spell out the digits " + " ".join(map(str, digits)) + "."
    answer = "The digits are " + ", ".join(WORDS[d] for d in digits) + "."
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}


def make_split(n_train, n_test, seed):
    rng = random.Random(seed)
    seen, rows = set(), []
    while len(rows) < n_train + n_test:
        digits = tuple(rng.randrange(10) for _ in range(N_DIGITS))
        if digits not in seen:
            seen.add(digits)
            rows.append(example(digits))
    return rows[n_test:], rows[:n_test]


def main():
    write_split_command(__doc__, make_split, "out/template", 3000)


if __name__ == "__main__":
    main()
