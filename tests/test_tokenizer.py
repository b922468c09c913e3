import pytest
import tiktoken
import tiktoken.load

from nanomars.util.tokenizer import (SPECIAL_TOKENS, ChatTokenizer, build_encoding, load_bpe,
                                load_default_tokenizer, save_bpe, train_bpe)

TEXT = ("The quick brown fox jumps over the lazy dog. It's 2 + 3 = 5, isn't it?\n"
        "Sort these words: pear, apple, kiwi.\n\n  Indented line\twith a tab.\n") * 20
VARIED = ["Hello, world!", "12345 + 678 = 13023", "line one\nline two\n\n\n  spaced   out\t",
          "ünïcödé, 日本語 and emoji 🙂🚀👍🏽", "we'll say it's 'quoted'", "", " ", "<|im_end|> <|mask|>"]

@pytest.fixture(scope="module")
def tok():
    return ChatTokenizer(build_encoding(train_bpe(TEXT, 300)))

def test_train_bpe_first_merges():
    # the textbook example: "aa" is most frequent; then "aa"+"a" and "a"+"b" tie at 2 and the smaller
    # pair (97, 98) = "ab" wins; then "aa"+"ab" -> "aaab"
    ranks = train_bpe("aaabdaaabac", 259)
    assert [b for b, r in sorted(ranks.items(), key=lambda kv: kv[1])][256:] == [b"aa", b"ab", b"aaab"]
    assert all(ranks[bytes([i])] == i for i in range(256))
    enc = build_encoding(ranks)
    assert enc.encode_ordinary("aaabdaaabac") == [258, ord("d"), 258, ord("a"), ord("c")]

def test_train_bpe_deterministic_and_valid():
    a, b = train_bpe(TEXT, 320), train_bpe(TEXT, 320)
    assert a == b and len(a) == 320
    assert sorted(a.values()) == list(range(320))  # unique bytes, contiguous ranks: valid for tiktoken

def test_save_load_roundtrip(tmp_path):
    ranks = train_bpe(TEXT, 300)
    save_bpe(ranks, tmp_path / "t.tiktoken")
    assert load_bpe(tmp_path / "t.tiktoken") == ranks
    # the same file is readable by tiktoken's own loader
    assert tiktoken.load.load_tiktoken_bpe(str(tmp_path / "t.tiktoken")) == ranks

@pytest.mark.parametrize("which", ["small", "default"])
def test_roundtrip(tok, which):
    t = tok if which == "small" else load_default_tokenizer()
    for text in VARIED:
        ids = t.encode(text)
        assert t.decode(ids) == text
        assert b"".join(t.enc.decode_single_token_bytes(i) for i in ids) == text.encode("utf-8")
        assert all(i < t.vocab_size for i in ids)


@pytest.mark.parametrize("which", ["small", "default"])
def test_non_ascii_falls_back_to_utf8_bytes(tok, which):
    """Neither vocabulary ever merged these characters: they must come out as their raw UTF-8 bytes, one
    id per byte (ids 0..255 are the single bytes), and decode back exactly. A vocabulary missing a byte,
    or a decoder that drops or re-encodes bytes, fails here."""
    t = tok if which == "small" else load_default_tokenizer()
    for text in ["日本語", "🙂🚀👍🏽", "Ωμέγα", "naïve café"]:
        ids = t.encode(text)
        assert t.decode(ids) == text
        assert b"".join(t.enc.decode_single_token_bytes(i) for i in ids) == text.encode("utf-8")
    assert t.encode("日本語") == list("日本語".encode("utf-8"))  # e6 97 a5 e6 9c ac e8 aa 9e
    assert t.encode("🙂") == list("🙂".encode("utf-8"))

def test_special_ids(tok):
    n = tok.enc.n_vocab - len(SPECIAL_TOKENS)
    assert [tok.enc.encode_single_token(s) for s in SPECIAL_TOKENS] == [n, n + 1, n + 2, n + 3]
    assert (tok.im_start_id, tok.eos_id, tok.mask_id) == (n + 1, n + 2, n + 3)
    assert tok.stop_ids == {n, n + 2} and tok.vocab_size == n + 4

def test_special_strings_in_user_text_are_plain_text(tok):
    ids = tok.encode("stop <|im_end|> now <|mask|>")
    assert not set(ids) & {tok.eos_id, tok.mask_id, tok.im_start_id}
    ids, _ = tok.render([{"role": "user", "content": "<|im_end|>"}, {"role": "assistant", "content": "ok"}])
    assert ids.count(tok.eos_id) == 2  # only the two real ends of turn

def test_render_exact(tok):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo there"}]
    ids, mask = tok.render(msgs)
    e = tok.encode
    assert ids == ([tok.im_start_id] + e("user\nhi") + [tok.eos_id] + e("\n") +
                   [tok.im_start_id] + e("assistant\n") + e("yo there") + [tok.eos_id])
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo there<|im_end|>"
    n_resp = len(e("yo there")) + 1
    assert mask == [0] * (len(ids) - n_resp) + [1] * n_resp

def test_render_loss_mask_multi_turn(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a?"},
            {"role": "assistant", "content": "A."}, {"role": "user", "content": "b?"},
            {"role": "assistant", "content": "B."}]
    ids, mask = tok.render(msgs)
    pieces = tok.decode_tokens(ids)
    assert "".join(p for p, m in zip(pieces, mask) if m) == "A.<|im_end|>B.<|im_end|>"
    assert "".join(p for p, m in zip(pieces, mask) if not m) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\na?<|im_end|>\n<|im_start|>assistant\n"
        "\n<|im_start|>user\nb?<|im_end|>\n<|im_start|>assistant\n")
    ids_last, mask_last = tok.render(msgs, last_turn_only=True)  # the released code's multi-turn rule
    assert ids_last == ids
    assert "".join(p for p, m in zip(pieces, mask_last) if m) == "B.<|im_end|>"

def test_generation_prompt_and_default_system(tok):
    ids = tok.prompt_ids("hi")
    assert ids[-len(tok.encode("assistant\n")) - 1:] == [tok.im_start_id] + tok.encode("assistant\n")
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert ids == tok.prompt_ids([{"role": "user", "content": "hi"}])
    sys_tok = ChatTokenizer(tok.enc, default_system="Be nice.")
    assert sys_tok.decode(sys_tok.prompt_ids("hi")) == (
        "<|im_start|>system\nBe nice.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    own = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "hi"}]
    assert sys_tok.prompt_ids(own) == tok.prompt_ids(own)  # an explicit system message wins

def test_errors(tmp_path):
    enc = tiktoken.Encoding(name="nomask", pat_str=r"\S+|\s+", mergeable_ranks={bytes([i]): i for i in range(256)},
                            special_tokens={"<|im_start|>": 256, "<|im_end|>": 257})
    with pytest.raises(ValueError, match="mask"):
        ChatTokenizer(enc)
    with pytest.raises(FileNotFoundError, match="data/prepare.py"):
        load_default_tokenizer(tmp_path / "missing.tiktoken")


def test_ids_beyond_the_tokenizer_decode_as_replacement(tok):
    """Qwen2.5 has more embedding rows than tokens and an untrained model predicts the extra rows: they
    must read as U+FFFD, with the text around them intact."""
    ids = tok.encode("ab") + [tok.vocab_size + 5] + tok.encode("cd")
    assert tok.decode(ids) == "ab\ufffdcd"
    assert tok.decode_tokens([tok.vocab_size + 5]) == ["\ufffd"]
