"""
Tokenizer and chat template.

- train_bpe: a tiny byte-level BPE trainer (the lesson), served afterwards by tiktoken (the speed).
- ChatTokenizer: Qwen2.5's ChatML template over ANY tiktoken.Encoding (ours or a real Qwen one),
  returning (ids, loss_mask) so the SFT loss mask is built in the same place as the template.
"""
import base64
from collections import Counter, defaultdict
from pathlib import Path

import regex  # the `re` module lacks \p{L}; tiktoken already depends on `regex`
import tiktoken

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
# Qwen2.5's pre-tokenizer: BPE merges never cross these chunks. \p{N} is ONE digit, so every number
# is spelled digit by digit, which keeps arithmetic regular.
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "data" / "tokenizer.tiktoken"

# -----------------------------------------------------------------------------
# BPE training

def _merge(word, pair, new_id):
    """Replace every non-overlapping occurrence of `pair` in `word`, left to right."""
    out, i = [], 0
    while i < len(word):
        matched = i + 1 < len(word) and (word[i], word[i + 1]) == pair
        out.append(new_id if matched else word[i])
        i += 2 if matched else 1
    return out

def train_bpe(text: str, vocab_size: int) -> dict[bytes, int]:
    """Learn byte-level BPE ranks {token bytes: rank}; rank == token id, merges in training order."""
    assert vocab_size >= 256, "the 256 single bytes are always in the vocabulary"
    # a corpus repeats the same chunks endlessly: work on unique chunks weighted by their count
    chunk_counts = Counter(regex.findall(QWEN_PATTERN, text))
    words = [list(chunk.encode("utf-8")) for chunk in chunk_counts]
    freqs = list(chunk_counts.values())
    vocab = [bytes([i]) for i in range(256)]  # id -> bytes; the first 256 ranks are the byte values
    ranks = {b: i for i, b in enumerate(vocab)}
    # pair counts are updated incrementally: only the words that contain the merged pair change
    pair_counts, where = Counter(), defaultdict(set)
    for w, word in enumerate(words):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += freqs[w]
            where[pair].add(w)
    while len(vocab) < vocab_size and pair_counts:
        # most frequent pair; ties go to the smallest (id, id) pair so training is deterministic
        pair = min(pair_counts, key=lambda p: (-pair_counts[p], p))
        merged, new_id = vocab[pair[0]] + vocab[pair[1]], len(vocab)
        # tiktoken needs unique token bytes; sequential merges never spell one token two ways
        assert merged not in ranks, merged
        vocab.append(merged)
        ranks[merged] = new_id
        for w in where.pop(pair):  # (stale entries are harmless: _merge finds nothing to merge)
            old, new = words[w], _merge(words[w], pair, new_id)
            for p in zip(old, old[1:]):
                pair_counts[p] -= freqs[w]
                if pair_counts[p] == 0:
                    del pair_counts[p]
            for p in zip(new, new[1:]):
                pair_counts[p] += freqs[w]
                where[p].add(w)
            words[w] = new
    return ranks

# -----------------------------------------------------------------------------
# tiktoken's file format: one "base64(token bytes) rank" per line

def save_bpe(ranks: dict[bytes, int], path):
    lines = [f"{base64.b64encode(b).decode()} {r}\n" for b, r in sorted(ranks.items(), key=lambda kv: kv[1])]
    Path(path).write_text("".join(lines))

def load_bpe(path) -> dict[bytes, int]:
    pairs = (line.split() for line in Path(path).read_text().splitlines())
    return {base64.b64decode(token): int(rank) for token, rank in pairs}

def build_encoding(ranks: dict[bytes, int], name="nanomars") -> tiktoken.Encoding:
    # the specials sit right after the ranks, like Qwen's <|endoftext|> at 151643
    specials = {tok: len(ranks) + i for i, tok in enumerate(SPECIAL_TOKENS)}
    return tiktoken.Encoding(name=name, pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=specials)

# -----------------------------------------------------------------------------
# chat template

class ChatTokenizer:
    """ChatML exactly as Qwen2.5 renders it, over any tiktoken.Encoding that has a <|mask|> special."""

    def __init__(self, enc: tiktoken.Encoding, default_system: str | None = None):
        specials = enc.special_tokens_set
        for tok in ("<|mask|>", "<|im_start|>", "<|im_end|>"):
            if tok not in specials:
                raise ValueError(f"encoding {enc.name!r} has no {tok} special token; MARS needs it")
        self.enc, self.default_system = enc, default_system
        self.vocab_size = enc.n_vocab
        self.mask_id = enc.encode_single_token("<|mask|>")
        self.im_start_id = enc.encode_single_token("<|im_start|>")
        self.eos_id = enc.encode_single_token("<|im_end|>")  # the Instruct models' end of turn
        self.stop_ids = {enc.encode_single_token(t) for t in ("<|im_end|>", "<|endoftext|>") if t in specials}

    def encode(self, text: str) -> list[int]:
        # encode_ordinary: a user typing "<|im_end|>" gets plain text, never the control token
        return self.enc.encode_ordinary(text)

    def token_bytes(self, i) -> bytes:
        # a model can have more embedding rows than its tokenizer has tokens (Qwen2.5: 151,936 rows for
        # 151,665 tokens), and an untrained one predicts them: such an id reads as U+FFFD, not a crash
        try:
            return self.enc.decode_single_token_bytes(i)
        except KeyError:
            return "\ufffd".encode()

    def decode(self, ids) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def decode_tokens(self, ids) -> list[str]:
        """One printable piece per token (a piece may hold half a UTF-8 character, hence 'replace')."""
        return [self.token_bytes(i).decode("utf-8", errors="replace") for i in ids]

    def render(self, messages, add_generation_prompt=False, last_turn_only=False) -> tuple[list[int], list[int]]:
        """<|im_start|>{role}\\n{content}<|im_end|> joined by "\\n". loss_mask is 1 exactly on assistant
        content and its closing <|im_end|> (only the last assistant message's with last_turn_only, as the
        released MARS code trains multi-turn data; earlier replies are then context). No "\\n" after the
        last <|im_end|>: the trainer pads with more <|im_end|> tokens, which are targets too (the model
        learns to keep stopping)."""
        if self.default_system is not None and (not messages or messages[0]["role"] != "system"):
            messages = [{"role": "system", "content": self.default_system}, *messages]
        ids, mask = [], []

        def add(tokens, loss):
            ids.extend(tokens)
            mask.extend([loss] * len(tokens))

        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        for i, m in enumerate(messages):
            if i > 0:
                add(self.encode("\n"), 0)
            if m["role"] == "assistant":
                # a reply is generated after the prompt's "assistant\n", so its tokens never merge
                # with the header: encode them apart, exactly as they look at inference
                add([self.im_start_id] + self.encode("assistant\n"), 0)
                add(self.encode(m["content"]) + [self.eos_id], int(i == last or not last_turn_only))
            else:
                add([self.im_start_id] + self.encode(f"{m['role']}\n{m['content']}") + [self.eos_id], 0)
        if add_generation_prompt:
            add(self.encode("\n") + [self.im_start_id] + self.encode("assistant\n"), 0)
        return ids, mask

    def prompt_ids(self, user_text_or_messages) -> list[int]:
        """Ids to feed for generation: a str is one user message."""
        m = user_text_or_messages
        messages = [{"role": "user", "content": m}] if isinstance(m, str) else m
        return self.render(messages, add_generation_prompt=True)[0]

def load_default_tokenizer(path=DEFAULT_PATH) -> ChatTokenizer:
    """The small BPE trained on the task suite by data/prepare.py."""
    if not Path(path).exists():
        raise FileNotFoundError(f"{path} not found: run `python data/prepare.py` to generate it")
    return ChatTokenizer(build_encoding(load_bpe(path)))
