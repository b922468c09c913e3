import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanomars.model import Config, Decoder  # noqa: E402


def random_model(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=97, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=64, max_seq_len=128)
    model = Decoder(Config(**{**cfg, **overrides}))
    model.init_weights()
    return model.eval()


@pytest.fixture(scope="session")
def tok():
    from nanomars.tokenizer import load_default_tokenizer
    return load_default_tokenizer()


@pytest.fixture(scope="session")
def trained(tok):
    """A small model briefly trained (AR then MARS dual-track) on the default suite: confident enough
    that MARS accepts several tokens per forward, so decoding tests exercise multi-token spans."""
    from nanomars.dual_track import ar_loss, collate, dual_track_loss
    from nanomars.tasks import train_examples
    torch.manual_seed(0)
    model = Decoder(Config(vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_kv_head=2, n_embd=64,
                           intermediate_size=128, max_seq_len=256))
    model.init_weights()
    data = [tok.render(ex["messages"]) for ex in train_examples(2000, seed=0)]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for step in range(160):
        idx = torch.randint(len(data), (32,), generator=gen)
        x, response, targets = collate([data[i] for i in idx], 4, tok.eos_id)
        loss = ar_loss(model, x, targets) if step < 80 else dual_track_loss(
            model, x, response, targets, 4, tok.mask_id)[0]
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()
