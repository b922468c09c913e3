"""The presets in config/ (the paper's recipes) read through train.py's own flag parsing: every value a flag
accepts, flags on the command line win, and a bad preset is one line naming the file."""
import glob
import os

import pytest

from nanomars.util.train_args import parse_args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = sorted(glob.glob(os.path.join(ROOT, "config", "*.py")))


def test_the_four_recipes_are_there():
    assert [os.path.basename(p) for p in PRESETS] == ["qwen05_ar.py", "qwen05_mars.py", "qwen7_ar.py", "qwen7_mars.py"]


# The paper's recipe (arXiv 2604.07023, its training setup): the quantities the presets must reproduce
PAPER = dict(examples=2_000_000, epochs=5, global_batch=384, warmup_share=0.03, lr=5e-6, betas=[0.9, 0.999],
             max_len=512, block_size=4, alpha=1.0)


@pytest.mark.parametrize("path", PRESETS, ids=os.path.basename)
def test_preset_is_the_papers_recipe(path):
    a = parse_args(["--config", path])
    ranks = 8 if a.fsdp else 1  # the processes each preset's global batch is written for (its comment)
    global_batch = a.batch_size * a.grad_accum * ranks  # what one optimizer step sees
    assert global_batch == PAPER["global_batch"]
    assert a.max_iters == PAPER["epochs"] * PAPER["examples"] // global_batch  # 5 epochs of the paper's data
    assert a.warmup == int(a.max_iters * PAPER["warmup_share"])  # 3% of the steps
    assert (a.lr, a.betas, a.max_len, a.block_size, a.alpha) == tuple(PAPER[k] for k in
                                                                      ("lr", "betas", "max_len", "block_size", "alpha"))
    assert (a.min_lr_ratio, a.weight_decay, a.grad_clip) == (0.0, 0.0, 1.0)  # cosine to 0, no decay, clip 1
    assert a.stage == os.path.basename(path)[:-3].split("_")[1]
    assert a.random_offsets is False  # as released (nanoMARS's own default for stage mars is True)
    assert a.fsdp == ("qwen7" in path) and a.grad_checkpointing  # 7B does not fit one GPU: sharded
    assert a.init_from == ({"qwen05_ar.py": "ckpt/qwen05", "qwen7_ar.py": "ckpt/qwen7"}.get(os.path.basename(path)))


def test_command_line_flags_win_wherever_they_stand():
    path = os.path.join(ROOT, "config", "qwen7_ar.py")
    a = parse_args(["--lr", "1e-4", "--config", path, "--grad_accum", "12", "--no-fsdp", "--betas", "0.8", "0.9"])
    assert (a.lr, a.grad_accum, a.fsdp, a.betas) == (1e-4, 12, False, [0.8, 0.9])
    assert a.batch_size == 8 and a.grad_checkpointing  # the rest still from the preset


@pytest.mark.parametrize("text, says", [
    ("lr = 5e-6\nlearning_rate = 1e-3\n", "unknown setting 'learning_rate'"),
    ("config = 'other.py'\n", "unknown setting 'config'"),  # presets do not nest
    ("max_iters = 0\n", "argument --max_iters: must be an integer >= 1, got 0"),  # each flag's own check
    ("lr = 5e-6 +\n", "SyntaxError"),
])
def test_a_bad_preset_is_one_line(tmp_path, text, says):
    path = tmp_path / "bad.py"
    path.write_text(text)
    with pytest.raises(SystemExit) as e:
        parse_args(["--config", str(path)])
    message = str(e.value)
    assert message.startswith(f"error: {'preset ' if 'Error' in says else ''}{path}: ") and says in message
    assert "\n" not in message


def test_missing_preset_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        parse_args(["--config", str(tmp_path / "nope.py")])
    assert str(e.value).startswith("error: cannot read preset") and "\n" not in str(e.value)
