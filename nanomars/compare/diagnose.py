"""
Where do confident MARS proposals go wrong? Training counts blocks from position 0, so every noisy
prediction is learnt from a known context whose length is a multiple of B; at decode time a window
starts wherever the answer has got to (docs/mars.md, "Decoding").

gate_errors follows greedy AR's own answer to each prompt and, at EVERY answer position c (c known tokens:
the prompt plus AR's first tokens), runs the MARS window there. Proposal j >= 1 of that window is
"passed" when the decoder would accept it (it and every proposal before it pass the gate) and "wrong"
when it is passed but differs from AR's token at that place. Counts are grouped by the window's
alignment c mod B (0 = the known context ends on a training block boundary) and by j. Proposal 0 is
AR's own prediction and is never counted.
"""
import torch

from ..batch_decode import batch_ar
from ..engine import PAD, forward_window
from ..decode import gate, n_accepted, propose


@torch.no_grad()
def gate_errors(model, prompts, mask_id, block_size, tau, stop_ids=(), max_new_tokens=64, metric="prob"):
    """prompts: lists of ids. Returns {"passed": (B, B) long, "wrong": (B, B) long, "windows": (B,) long}
    indexed [c mod B, j] (column 0 stays zero), and "windows" counts the windows run at each alignment."""
    B, dev = block_size, model.embed.weight.device
    passed = torch.zeros(B, B, dtype=torch.long)
    wrong = torch.zeros(B, B, dtype=torch.long)
    windows = torch.zeros(B, dtype=torch.long)
    answers = batch_ar(model, prompts, max_new_tokens, stop_ids)
    for prompt, row in zip(prompts, answers.rows):
        seq = torch.tensor(list(prompt) + row.tokens, device=dev)
        c = torch.arange(len(prompt), len(seq), device=dev)  # (n,) known tokens of each window
        n, W = len(c), len(seq) - 1 + B - 1
        # row i: [seq[:c_i] | B-1 masks | padding]; only each row's own window is read back
        col = torch.arange(W, device=dev)[None]  # (1, W)
        x = torch.where(col < c[:, None], seq[col.clamp(max=len(seq) - 1)].expand(n, W), PAD)
        x = torch.where((col >= c[:, None]) & (col < c[:, None] + B - 1), mask_id, x)
        logits, _ = forward_window(model, x, torch.zeros_like(c), c, B)  # (n, B, V)
        y, p = propose(logits)  # (n, B)
        accepted = torch.arange(B, device=dev) < n_accepted(gate(p, y, tau, metric))[:, None]  # (n, B)
        # AR's token at the place of proposal j, where AR's answer reaches it
        target_pos = c[:, None] + torch.arange(B, device=dev)  # (n, B)
        known = target_pos < len(seq)
        truth = seq[target_pos.clamp(max=len(seq) - 1)]
        counted = accepted & known
        counted[:, 0] = False
        align = (c % B).cpu()
        windows += torch.bincount(align, minlength=B)
        passed.index_put_((align,), counted.long().cpu(), accumulate=True)
        wrong.index_put_((align,), (counted & (y != truth)).long().cpu(), accumulate=True)
    return {"passed": passed, "wrong": wrong, "windows": windows}


def format_gate_errors(counts):
    """A text table: one line per alignment c mod B, wrong/passed proposals per mask index j and in all."""
    passed, wrong, windows = counts["passed"], counts["wrong"], counts["windows"]
    B = len(windows)
    lines = ["c mod B  windows  " + "".join(f"{'j=' + str(j):>14}" for j in range(1, B)) + "           all"]
    for a in range(B):
        cells = [f"{int(wrong[a, j])}/{int(passed[a, j])}" for j in range(1, B)]
        total = f"{int(wrong[a].sum())}/{int(passed[a].sum())}"
        rate = wrong[a].sum() / passed[a].sum().clamp(min=1)
        lines.append(f"{a:>7}  {int(windows[a]):>7}  " + "".join(f"{c:>14}" for c in cells) +
                     f"{total:>10} {rate:6.1%}")
    return "\n".join(lines) + "\n(wrong/passed: proposals the decoder would accept that differ from greedy AR)"
