"""
Regenerate the default offline data: the BPE tokenizer and the fixed held-out test split.

    python data/prepare.py [--vocab_size 1024]

writes data/tokenizer.tiktoken and data/test.jsonl. Deterministic: a rerun gives identical files.
Training examples are not stored: train.py draws them from nanomars.util.tasks.train_examples(n, seed).
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from nanomars.util import tasks
from nanomars.util.tokenizer import ChatTokenizer, build_encoding, save_bpe, train_bpe

DATA = Path(__file__).resolve().parent

def corpus_text(examples) -> str:
    # plain text of prompts and answers; the role names are included so "user" and "assistant" get
    # tokens of their own, while the chat special tokens stay outside the BPE
    return "\n".join(f"{m['role']}\n{m['content']}" for ex in examples for m in ex["messages"])

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab_size", type=int, default=1024, help="BPE ranks, before the 4 specials")
    parser.add_argument("--n_corpus", type=int, default=20000, help="training examples in the BPE corpus")
    args = parser.parse_args()
    t0 = time.time()

    text = corpus_text(tasks.train_examples(args.n_corpus, seed=0))
    ranks = train_bpe(text, args.vocab_size)
    save_bpe(ranks, DATA / "tokenizer.tiktoken")
    print(f"wrote {DATA / 'tokenizer.tiktoken'}: {len(ranks)} ranks + 4 specials, "
          f"from {len(text):,} chars in {time.time() - t0:.1f}s")

    test = tasks.held_out_split()
    tasks.write_jsonl(DATA / "test.jsonl", test)
    print(f"wrote {DATA / 'test.jsonl'}: {len(test)} held-out examples")

    tok = ChatTokenizer(build_encoding(ranks))
    lengths = {}
    for ex in test:
        lengths.setdefault(ex["family"], []).append(len(tok.render(ex["messages"])[0]))
    print("tokens per rendered test example:")
    for family, ls in lengths.items():
        print(f"  {family:<11} avg {sum(ls) / len(ls):5.1f}  max {max(ls):3d}")
    all_ls = [n for ls in lengths.values() for n in ls]
    print(f"  {'all':<11} avg {sum(all_ls) / len(all_ls):5.1f}  max {max(all_ls):3d}")
    print(f"done in {time.time() - t0:.1f}s")

if __name__ == "__main__":
    main()
