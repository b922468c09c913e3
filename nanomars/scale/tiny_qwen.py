"""A tiny random Hugging Face Qwen2 folder, built with transformers: the reference for the parity tests
and for tools/gpu_check.py's parity section. Nothing is downloaded."""
import json
import os

import torch
import transformers

from ..util.qwen import bytes_to_unicode


def tiny_hf_folder(folder, n_kv_head=2, tie=True, shard=False, seed=0):
    """A tiny random Qwen2 saved as a Hugging Face folder (sharded on request), with a 256-byte
    tokenizer.json (<|mask|> = 259). Returns the transformers model."""
    torch.manual_seed(seed)
    # rope_theta != the 10000 default so a dropped theta would show; initializer_range 0.2: decisive
    # argmaxes, so rounding cannot flip greedy generation on a near-tie
    config = transformers.Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=n_kv_head,
                                      max_position_embeddings=128, rope_theta=1e6, rms_norm_eps=1e-6,
                                      tie_word_embeddings=tie, initializer_range=0.2)
    hf = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # HF inits biases / norms to 0 / 1: randomize them so parity covers them
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(folder, max_shard_size="20KB" if shard else "5GB")
    chars = bytes_to_unicode()
    added = [{"id": 256 + i, "content": s, "special": True}
             for i, s in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])]
    tokenizer = {"model": {"type": "BPE", "vocab": {chars[b]: b for b in range(256)}, "merges": []},
                 "added_tokens": added}
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    return hf
