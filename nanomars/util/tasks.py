"""
A procedural instruction suite: offline, deterministic, every answer checked by a program.
Seven small families mirror the paper's benchmark mix (GSM8K, BBH, IFEval, MMLU, HumanEval) at a
size a ~1M-parameter model learns on a laptop CPU in minutes. Each family is a generator
rng -> (prompt, answer) and a checker (prompt, response) -> bool that solves the prompt itself.
"""
import json
import random
import re
from pathlib import Path
from typing import Callable, NamedTuple

class Family(NamedTuple):
    generate: Callable[[random.Random], tuple[str, str]]
    check: Callable[[str, str], bool]

# -----------------------------------------------------------------------------
# arithmetic (GSM8K-like): a word problem and a short worked solution ending in "The answer is N."

NAMES = "Tom Anna Sam Lily Ben Mia Max Zoe Leo Emma".split()
ITEMS = "apples pencils stickers books cookies marbles cards shells".split()
GAINS, LOSSES = ["buys", "finds", "gets"], ["gives away", "eats", "loses"]

def gen_arithmetic(rng):
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, total = rng.randint(2, 5), rng.randint(2, 5), rng.randint(2, 20)
    start, clauses, steps = f"{total} {item}", [], []
    if rng.random() < 0.3:  # start with a product, like GSM8K's "3 bags of 4"
        start, total, steps = f"{a} bags with {b} {item} in each", a * b, [f"{a} * {b} = {a * b}."]
    for _ in range(rng.randint(1, 2)):
        n = rng.randint(1, 9)
        gain = rng.random() < 0.5 or n > total  # never go below zero
        clauses.append(f"{rng.choice(GAINS)} {n} more" if gain else f"{rng.choice(LOSSES)} {n}")
        steps.append(f"{total} {'+' if gain else '-'} {n} = {total + n if gain else total - n}.")
        total = total + n if gain else total - n
    prompt = f"{name} has {start}, then {' and then '.join(clauses)}. How many {item} does {name} have now?"
    return prompt, " ".join(steps) + f" The answer is {total}."

def solve_arithmetic(prompt):
    m = re.search(r"has (\d+) bags with (\d+)", prompt)
    total = int(m[1]) * int(m[2]) if m else int(re.search(r"has (\d+)", prompt)[1])
    for verb, n in re.findall(r"(buys|finds|gets|gives away|eats|loses) (\d+)", prompt):
        total += int(n) if verb in GAINS else -int(n)
    return total

def check_arithmetic(prompt, response):
    answers = re.findall(r"The answer is (-?\d+)", response)
    return bool(answers) and int(answers[-1]) == solve_arithmetic(prompt)

# -----------------------------------------------------------------------------
# boolean (BBH boolean_expressions): "not ( True and False ) or False" -> "True"

def gen_bool_expr(rng, depth, p_leaf=0.3):
    if depth == 0 or rng.random() < p_leaf:
        return ("not " if rng.random() < 0.3 else "") + rng.choice(["True", "False"])
    left, right = gen_bool_expr(rng, depth - 1), gen_bool_expr(rng, depth - 1)
    expr = f"{left} {rng.choice(['and', 'or'])} {right}"
    if rng.random() < 0.5:
        return ("not " if rng.random() < 0.3 else "") + f"( {expr} )"
    return expr

def gen_boolean(rng):
    expr = gen_bool_expr(rng, 2, p_leaf=0.0)  # at least one and/or: "True" alone teaches nothing
    return f"Evaluate: {expr}", str(eval_bool(expr))

def eval_bool(expr):
    # whitelist the words before eval: only True/False/not/and/or and parentheses reach Python
    assert set(expr.split()) <= {"True", "False", "not", "and", "or", "(", ")"}, expr
    return eval(expr, {"__builtins__": {}})

def check_boolean(prompt, response):
    return response == str(eval_bool(prompt.removeprefix("Evaluate: ")))

# -----------------------------------------------------------------------------
# sorting (BBH word_sorting) and counting (BBH object_counting)

FRUITS = "apple banana cherry grape kiwi lemon mango melon peach pear plum".split()
ANIMALS = "cat cow dog duck fish frog goat horse lion mouse owl sheep".split()
TOOLS = "hammer saw drill wrench shovel rake ladder brush".split()
WORDS = FRUITS + ANIMALS + TOOLS

def gen_sorting(rng):
    words = rng.sample(WORDS, rng.randint(3, 5))
    return f"Sort these words alphabetically: {', '.join(words)}", ", ".join(sorted(words))

def check_sorting(prompt, response):
    return response == ", ".join(sorted(prompt.split(": ", 1)[1].split(", ")))

CATEGORIES = {"fruits": FRUITS, "animals": ANIMALS, "tools": TOOLS}

def gen_counting(rng):
    category = rng.choice(list(CATEGORIES))
    words = rng.sample(WORDS, rng.randint(3, 7))
    return f"How many {category} are in this list: {', '.join(words)}?", str(count_category(category, words))

def count_category(category, words):
    return sum(w in CATEGORIES[category] for w in words)

def check_counting(prompt, response):
    m = re.match(r"How many (\w+) are in this list: (.*)\?$", prompt)
    return response == str(count_category(m[1], m[2].split(", ")))

# -----------------------------------------------------------------------------
# format (IFEval-like): the checker verifies the constraint, never string equality

SENTENCES = [  # "exactly n words about {topic}" is answered with the first n words of its sentence
    "the sea is deep and blue and full of fish", "the sun is hot and bright and gives us light",
    "a cat is small and soft and likes to sleep", "rain is cold and wet and makes the grass grow",
    "a tree is tall and green and gives us shade", "the moon is white and round and shines at night",
    "a dog is loyal and kind and loves to run", "snow is soft and cold and covers the ground in winter",
    "a book is full of words and tells a story", "the wind is strong and fast and moves the clouds",
]
TOPICS = {sentence.split(" is ")[0]: sentence for sentence in SENTENCES}

def gen_format(rng):
    kind = rng.randrange(3)
    if kind == 0:
        word, n = rng.choice(WORDS), rng.randint(2, 6)
        return (f"Write the word '{word}' {n} times in capital letters, separated by commas.",
                ", ".join([word.upper()] * n))
    if kind == 1:
        topic, n = rng.choice(list(TOPICS)), rng.randint(2, 8)
        return f"Answer with exactly {n} words about {topic}.", " ".join(TOPICS[topic].split()[:n])
    category, bullet, n = rng.choice(list(CATEGORIES)), rng.choice("-*+"), rng.randint(2, 6)
    return (f"List {n} {category}, one per line, each line starting with '{bullet} '.",
            "\n".join(f"{bullet} {w}" for w in rng.sample(CATEGORIES[category], n)))

def check_format(prompt, response):
    if m := re.match(r"Write the word '(\w+)' (\d+) times in capital", prompt):
        return [w.strip() for w in response.split(",")] == [m[1].upper()] * int(m[2])
    if m := re.match(r"Answer with exactly (\d+) words", prompt):
        return len(response.split()) == int(m[1])
    m = re.match(r"List (\d+) (\w+), one per line, each line starting with '(.) '", prompt)
    lines = response.split("\n")
    items = [line[2:] for line in lines if line.startswith(m[3] + " ")]
    return len(lines) == len(items) == len(set(items)) == int(m[1]) and set(items) <= set(CATEGORIES[m[2]])

# -----------------------------------------------------------------------------
# facts (MMLU-like): multiple choice over a fixed fact table -> one letter

FACT_TABLES = [  # (question template, "subject:answer" pairs); distractors come from the same table
    ("What is the capital of {}?", "France:Paris Italy:Rome Spain:Madrid Germany:Berlin Japan:Tokyo "
     "Egypt:Cairo Canada:Ottawa Peru:Lima Kenya:Nairobi Norway:Oslo Greece:Athens Russia:Moscow "
     "China:Beijing Portugal:Lisbon Poland:Warsaw Austria:Vienna"),
    ("What sound does a {} make?", "dog:woof cat:meow cow:moo duck:quack lion:roar sheep:baa "
     "snake:hiss owl:hoot horse:neigh bee:buzz pig:oink"),
    ("What color is {}?", "a_banana:yellow grass:green the_sky:blue snow:white coal:black "
     "blood:red a_carrot:orange a_plum:purple chocolate:brown a_flamingo:pink"),
    ("What is the opposite of {}?", "hot:cold big:small up:down fast:slow light:dark happy:sad "
     "open:closed early:late full:empty wet:dry"),
]
FACTS = {}  # question -> (answer, the table's answers)
for template, pairs in FACT_TABLES:
    pairs = [p.replace("_", " ").split(":") for p in pairs.split()]
    for subject, answer in pairs:
        FACTS[template.format(subject)] = (answer, [a for _, a in pairs])
LETTERS = "ABCD"

def gen_facts(rng):
    question = rng.choice(list(FACTS))
    answer, pool = FACTS[question]
    options = rng.sample([a for a in pool if a != answer], 3) + [answer]
    rng.shuffle(options)
    lines = [question] + [f"{letter}. {option}" for letter, option in zip(LETTERS, options)]
    return "\n".join(lines + ["Answer with the letter."]), LETTERS[options.index(answer)]

def check_facts(prompt, response):
    question, *lines = prompt.split("\n")
    options = [line[3:] for line in lines[:4]]
    return response == LETTERS[options.index(FACTS[question][0])]

# -----------------------------------------------------------------------------
# code (HumanEval-like): a small string function applied to a random lowercase string

CODE_OPS = {
    "Reverse the string": lambda s: s[::-1],
    "Uppercase": lambda s: s.upper(),
    "Remove the vowels": lambda s: "".join(c for c in s if c not in "aeiou"),
    "Sort the letters": lambda s: "".join(sorted(s)),
    "Double each letter": lambda s: "".join(c + c for c in s),
}

def gen_code(rng):
    op = rng.choice(list(CODE_OPS))
    s = ""
    while not CODE_OPS[op](s):  # "Remove the vowels: aei" would leave an empty reply: draw again
        s = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 6)))
    return f"{op}: {s}", CODE_OPS[op](s)

def check_code(prompt, response):
    op, s = prompt.split(": ", 1)
    return response == CODE_OPS[op](s)

# -----------------------------------------------------------------------------
# the suite

FAMILIES = {
    "arithmetic": Family(gen_arithmetic, check_arithmetic),
    "boolean": Family(gen_boolean, check_boolean),
    "sorting": Family(gen_sorting, check_sorting),
    "counting": Family(gen_counting, check_counting),
    "format": Family(gen_format, check_format),
    "facts": Family(gen_facts, check_facts),
    "code": Family(gen_code, check_code),
}
TEST_SEED, TEST_PER_FAMILY = 1234, 50

def make_example(family, rng) -> dict:
    prompt, answer = FAMILIES[family].generate(rng)
    return {"family": family, "messages": [{"role": "user", "content": prompt},
                                           {"role": "assistant", "content": answer}]}

def user_prompt(example) -> str:
    return next(m["content"] for m in example["messages"] if m["role"] == "user")

def held_out_split(n_per_family=TEST_PER_FAMILY) -> list[dict]:
    """The fixed held-out split (data/test.jsonl), identical on every machine. One rng per family, so
    a smaller split is a prefix of each family's items and stays held out too."""
    if not 1 <= n_per_family <= TEST_PER_FAMILY:
        raise ValueError(f"the held-out split has 1..{TEST_PER_FAMILY} prompts per family, asked for {n_per_family}")
    rngs = {f: random.Random(f"{TEST_SEED}-{f}") for f in FAMILIES}
    return [make_example(f, rngs[f]) for f in FAMILIES for _ in range(n_per_family)]

def train_examples(n, seed) -> list[dict]:
    """n examples cycling evenly over the families; no user prompt of the test split ever appears."""
    held_out = {user_prompt(ex) for ex in held_out_split()}
    rng, names, examples = random.Random(seed), list(FAMILIES), []
    for i in range(n):
        ex = make_example(names[i % len(names)], rng)
        while user_prompt(ex) in held_out:
            ex = make_example(names[i % len(names)], rng)
        examples.append(ex)
    return examples

def check(example: dict, response: str) -> bool:
    """Is `response` a correct answer to the example's prompt? Checkers never raise on a bad response.
    An example from elsewhere (no family of this suite) is checked by exact match with its reference,
    the last assistant message."""
    if example.get("family") in FAMILIES:
        return FAMILIES[example["family"]].check(user_prompt(example), response.strip())
    reference = [m["content"] for m in example["messages"] if m["role"] == "assistant"][-1]
    return response.strip() == reference.strip()

def prompt_messages(example: dict) -> list[dict]:
    """The conversation up to the last assistant message: what a decoder is given to produce that reply."""
    last = max(i for i, m in enumerate(example["messages"]) if m["role"] == "assistant")
    return example["messages"][:last]

def load_checker(spec: str) -> Callable[[dict, str], bool]:
    """--check for the evaluation tools: "suite" (check above: the suite's checkers, exact match otherwise)
    or "FILE.py:NAME" / "MODULE:NAME", a function (example dict, response str) -> bool of the user's."""
    if spec == "suite":
        return check
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ValueError(f"--check {spec!r}: expected 'suite', 'FILE.py:FUNCTION' or 'MODULE:FUNCTION'")
    import importlib
    import importlib.util
    try:
        if where.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location(Path(where).stem, where)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except (OSError, ImportError) as e:
        raise ValueError(f"--check {spec!r}: cannot load {where} ({e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"--check {spec!r}: {where} has no function {name}")
    return fn

def score(tok, examples, rows, checker=check) -> dict:
    """How well decoded rows answer their examples (rows[i], with .tokens and .forwards, answers examples[i];
    stop tokens are not part of the answer). Returns {"accuracy": {family: fraction right, ..., "all": ...},
    "tokens_per_forward", "tokens", "forwards"}; examples without a family count as "data"."""
    right, total = {}, {}
    for ex, row in zip(examples, rows, strict=True):
        ok = bool(checker(ex, tok.decode([t for t in row.tokens if t not in tok.stop_ids])))
        for key in (ex.get("family", "data"), "all"):
            right[key], total[key] = right.get(key, 0) + ok, total.get(key, 0) + 1
    tokens, forwards = sum(len(r.tokens) for r in rows), sum(r.forwards for r in rows)
    return {"accuracy": {k: right[k] / total[k] for k in total}, "tokens_per_forward": tokens / max(1, forwards),
            "tokens": tokens, "forwards": forwards}

# -----------------------------------------------------------------------------
# JSONL in the common {"messages": [{"role", "content"}, ...]} format (plus optional "family")

def write_jsonl(path, examples):
    Path(path).write_text("".join(json.dumps(ex) + "\n" for ex in examples))

def write_split_command(doc, make_split, out, n_train):
    """The command line of a task module in data/ (python data/<task>.py --out DIR): make_split(n_train,
    n_test, seed) -> (train, test), written as DIR/train.jsonl and DIR/test.jsonl."""
    import argparse
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=out)
    p.add_argument("--n_train", type=int, default=n_train)
    p.add_argument("--n_test", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    train, test = make_split(args.n_train, args.n_test, args.seed)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_jsonl(Path(args.out) / "train.jsonl", train)
    write_jsonl(Path(args.out) / "test.jsonl", test)
    print(f"wrote {args.out}/train.jsonl ({len(train)}) and {args.out}/test.jsonl ({len(test)})")

def read_jsonl(path) -> list[dict]:
    """Every bad line is one ValueError naming the file and the line (train.py turns it into one error line)."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")  # JSON is UTF-8, whatever the machine's locale
    except UnicodeDecodeError as e:  # e.g. a file saved as Latin-1: name the line, not the byte's file offset
        lineno, column = data.count(b"\n", 0, e.start) + 1, e.start - data.rfind(b"\n", 0, e.start)
        raise ValueError(f"{path}, line {lineno}: not valid UTF-8 (byte 0x{data[e.start]:02x} at column {column}): "
                         "save the file as UTF-8") from None
    examples = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            ex = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {lineno}: not valid JSON ({e})") from None
        msgs = ex.get("messages") if isinstance(ex, dict) else None
        ok = isinstance(msgs, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                            and isinstance(m.get("content"), str) for m in msgs)
        if not (ok and any(m["role"] == "assistant" for m in msgs)):
            raise ValueError(f"{path}, line {lineno}: expected {{\"messages\": [{{\"role\", \"content\"}}, ...]}} "
                             "with at least one assistant message")
        examples.append(ex)
    return examples
