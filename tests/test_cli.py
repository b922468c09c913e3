"""
Every command answers bad input with ONE line starting "error:" that names what is wrong, and a non-zero
exit; never a traceback. One case per bad flag value or bad file, run as a user runs them (the script as
__main__ with its arguments, in this process: see run()).
"""
import contextlib
import io
import json
import os
import runpy
import sys
import traceback
import types

import pytest
import torch

from nanomars.util.checkpoint import save_checkpoint
from nanomars.model import Config, Decoder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def files(tmp_path_factory, tok):
    """Checkpoints and data files, good and bad. The good model is random: bad input must be caught
    before any decoding quality matters."""
    d = tmp_path_factory.mktemp("cli")

    def model(**overrides):
        torch.manual_seed(0)
        cfg = dict(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_kv_head=1, n_embd=32, intermediate_size=64,
                   max_seq_len=256)
        m = Decoder(Config(**{**cfg, **overrides}))
        m.init_weights()
        return m

    save_checkpoint(str(d / "good.pt"), model(), None, 0, {"block_size": 4})
    save_checkpoint(str(d / "short_context.pt"), model(max_seq_len=40), None, 0, {"block_size": 4})
    save_checkpoint(str(d / "small_vocab.pt"), model(vocab_size=500), None, 0, {"block_size": 4})
    ckpt = torch.load(d / "good.pt", weights_only=True)
    ckpt["config"]["n_embd"] = 64  # the weights are still 32 wide
    torch.save(ckpt, d / "config_mismatch.pt")
    (d / "truncated.pt").write_bytes((d / "good.pt").read_bytes()[:2000])
    (d / "text.pt").write_text("not a checkpoint")
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (d / "bad_line2.jsonl").write_text(json.dumps(good) + "\n{oops\n")
    (d / "no_messages.jsonl").write_text('{"text": "hi"}\n')
    (d / "one.jsonl").write_text(json.dumps(good) + "\n")
    latin1 = {"messages": [{"role": "user", "content": "caf\u00e9?"}, {"role": "assistant", "content": "yes"}]}
    latin1 = json.dumps(latin1, ensure_ascii=False)  # the e-acute is byte 0xe9 in Latin-1, at column 47
    (d / "latin1.jsonl").write_bytes(f"{json.dumps(good)}\n\n{latin1}\n".encode("latin-1"))  # a blank line 2
    return d


def run(script, *args):
    """`python SCRIPT ARGS`, run in this process (runpy, as __main__) so that no test pays for a fresh Python
    and torch import (about 2.5 s each, dozens of tests): its exit code, stdout and stderr, an uncaught
    exception printed as Python would (a traceback, exit code 1)."""
    out, err, code = io.StringIO(), io.StringIO(), 0
    argv, path, threads = sys.argv, list(sys.path), torch.get_num_threads()
    sys.argv = [os.path.join(ROOT, script), *map(str, args)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(sys.argv[0], run_name="__main__")
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        sys.argv, sys.path[:] = argv, path
        torch.set_num_threads(threads)  # a script may set its own
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def assert_one_line_error(proc, *expected):
    err = proc.stderr.strip()
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in err and err.startswith("error:") and len(err.splitlines()) == 1, err
    for text in expected:
        assert text in err, err


TRAIN = ["--max_iters", "1", "--n_train", "20", "--n_layer", "1", "--n_embd", "32", "--n_head", "2",
         "--n_kv_head", "1", "--intermediate_size", "64", "--batch_size", "2", "--device", "cpu"]


@pytest.mark.parametrize("flag, value, expected", [
    ("--block_size", 0, "argument --block_size: must be an integer >= 1, got 0"),
    ("--block_size", -3, "argument --block_size: must be an integer >= 1, got -3"),
    ("--max_iters", 0, "argument --max_iters: must be an integer >= 1"),
    ("--batch_size", -1, "argument --batch_size: must be an integer >= 1"),
    ("--grad_accum", 0, "argument --grad_accum"),
    ("--lr", 0, "argument --lr: must be a number > 0"),
    ("--lr", -1e-3, "argument --lr: must be a number > 0"),
    ("--alpha", -1, "argument --alpha: must be a number >= 0"),
    ("--warmup", -1, "argument --warmup: must be an integer >= 0"),
    ("--weight_decay", -0.1, "argument --weight_decay"),
    ("--grad_clip", 0, "argument --grad_clip"),
    ("--eval_interval", 0, "argument --eval_interval"),
    ("--eval_batches", 0, "argument --eval_batches"),
    ("--max_len", 0, "argument --max_len"),
    ("--n_train", 0, "argument --n_train"),
    ("--n_layer", 0, "argument --n_layer"),
    ("--seed", -1, "argument --seed"),
    ("--block_size", "four", "argument --block_size: expected an integer >= 1, got 'four'"),
    ("--device", "gpu0", "unknown device 'gpu0'"),
])
def test_train_rejects_bad_numbers(tmp_path, flag, value, expected):
    assert_one_line_error(run("train.py", *TRAIN, "--out_dir", tmp_path, flag, value), expected)


def test_train_rejects_a_missing_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert_one_line_error(run("train.py", *TRAIN, "--out_dir", tmp_path, "--device", "cuda"), "cuda is not available")


@pytest.mark.parametrize("args, expected", [
    (["--n_head", "3"], "n_embd % n_head == 0"),
    (["--n_head", "4", "--n_kv_head", "4", "--n_embd", "20"], "must be even (RoPE)"),
    (["--max_len", "20"], "fits --max_len 20"),
    (["--stage", "mars"], "no checkpoint at"),
    (["--stage", "mars", "--resume"], "no checkpoint at"),
    (["--fsdp"], "--fsdp shards across the processes torchrun starts"),
])
def test_train_rejects_bad_setups(tmp_path, args, expected):
    assert_one_line_error(run("train.py", *TRAIN, "--out_dir", tmp_path, *args), expected)


@pytest.mark.parametrize("data, expected", [
    ("missing.jsonl", "missing.jsonl"),
    ("bad_line2.jsonl", "bad_line2.jsonl, line 2"),
    ("no_messages.jsonl", "no_messages.jsonl, line 1"),
    ("one.jsonl", "need at least 2, one held out for the loss curve"),
    ("latin1.jsonl", "latin1.jsonl, line 3: not valid UTF-8 (byte 0xe9 at column 47): save the file as UTF-8"),
])
def test_train_rejects_bad_data_files(files, tmp_path, data, expected):
    assert_one_line_error(run("train.py", *TRAIN, "--out_dir", tmp_path, "--data", files / data), expected)


@pytest.mark.parametrize("ckpt, args, expected", [
    ("truncated.pt", [], "cannot read checkpoint"),
    ("text.pt", [], "cannot read checkpoint"),
    ("config_mismatch.pt", [], "needs (1028, 64)"),
    ("small_vocab.pt", [], "this checkpoint was trained with another tokenizer"),
    ("short_context.pt", ["--max_len", "64"], "--max_len 64 is longer than the model's context of 40"),
])
def test_train_rejects_bad_checkpoints(files, tmp_path, ckpt, args, expected):
    assert_one_line_error(run("train.py", *TRAIN, "--out_dir", tmp_path, "--stage", "mars", "--init_from",
                              files / ckpt, *args), expected)


# ---------------------------------------------------------------------------------------- decoding
SAMPLE_FLAGS = [
    (["--tau", "0"], "argument --tau: must be a threshold in (0, 1]"),
    (["--tau", "1.5"], "argument --tau"),
    (["--taus", "1", "-0.5"], "argument --taus"),
    (["--block_size", "0"], "argument --block_size: must be an integer >= 1, got 0"),
    (["--max_new_tokens", "0"], "argument --max_new_tokens"),
    (["--temperature", "-1"], "argument --temperature: must be a number >= 0"),
    (["--top_k", "0"], "argument --top_k"),
    (["--dtype", "double"], "argument --dtype"),
]
BAD_CHECKPOINTS = [
    ("missing.pt", "no checkpoint at"),
    ("truncated.pt", "cannot read checkpoint"),
    ("text.pt", "cannot read checkpoint"),
    ("config_mismatch.pt", "the file was edited or mixed up"),
    ("small_vocab.pt", "has 500 embedding rows but its tokenizer"),
]


@pytest.mark.parametrize("args, expected", SAMPLE_FLAGS)
def test_sample_rejects_bad_numbers(files, args, expected):
    assert_one_line_error(run("sample.py", "--ckpt", files / "good.pt", *args), expected)


@pytest.mark.parametrize("ckpt, expected", BAD_CHECKPOINTS)
def test_sample_rejects_bad_checkpoints(files, ckpt, expected):
    assert_one_line_error(run("sample.py", "--ckpt", files / ckpt), expected)


def test_sample_rejects_a_prompt_longer_than_the_context(files):
    assert_one_line_error(run("sample.py", "--ckpt", files / "short_context.pt", "--prompt", "word " * 50),
                          "exceeds the model context of 40 tokens")


def test_sample_rejects_a_folder_that_is_not_a_model(tmp_path):
    assert_one_line_error(run("sample.py", "--ckpt", tmp_path), "no config.json")


@pytest.mark.parametrize("args, expected", [
    (["--tau", "0"], "argument --tau"),
    (["--block_size", "0"], "argument --block_size"),
    (["--batch_sizes", "1", "0"], "argument --batch_sizes"),
    (["--n_prompts", "0"], "argument --n_prompts"),
    (["--n_prompts", "100000"], "the held-out split has 350 prompts"),
    (["--max_new_tokens", "-1"], "argument --max_new_tokens"),
    (["--threads", "-1"], "argument --threads"),
    (["--dtype", "float8"], "argument --dtype: unknown dtype 'float8'"),
    (["--check", "nope"], "expected 'suite', 'FILE.py:FUNCTION'"),
])
def test_bench_rejects_bad_numbers(files, args, expected):
    assert_one_line_error(run("tools/bench.py", "--ckpt", files / "good.pt", *args), expected)


@pytest.mark.parametrize("ckpt, expected", BAD_CHECKPOINTS + [("short_context.pt", "exceeds the model context")])
def test_bench_rejects_bad_checkpoints(files, ckpt, expected):
    assert_one_line_error(run("tools/bench.py", "--ckpt", files / ckpt, "--quick"), expected)


@pytest.mark.parametrize("flag, path, expected", [
    ("--draft", "text.pt", "cannot read checkpoint"),
    ("--draft", "config_mismatch.pt", "the file was edited or mixed up"),
    ("--medusa", "truncated.pt", "cannot read checkpoint"),
    ("--medusa", "good.pt", "holds no Medusa heads"),
])
def test_bench_rejects_bad_peer_files(files, flag, path, expected):
    """A peer's file that is there but unusable is an error (a missing one is a note: test_bench.py)."""
    assert_one_line_error(run("tools/bench.py", "--ckpt", files / "good.pt", "--quick", flag, files / path), expected)


@pytest.mark.parametrize("args, expected", [
    (["--taus", "0.9", "0"], "argument --taus"),
    (["--block_size", "0"], "argument --block_size"),
    (["--n_per_family", "0"], "argument --n_per_family"),
    (["--n_per_family", "51"], "the held-out split has 1..50 prompts per family"),
    (["--max_new_tokens", "0"], "argument --max_new_tokens"),
    (["--taus"], "nothing to evaluate"),
    (["--dtype", "int8"], "argument --dtype: unknown dtype 'int8'"),
    (["--data", "missing.jsonl"], "missing.jsonl"),
])
def test_evaluate_rejects_bad_numbers(files, args, expected):
    assert_one_line_error(run("tools/evaluate.py", "--ckpt", files / "good.pt", *args), expected)


@pytest.mark.parametrize("ckpt, expected", BAD_CHECKPOINTS)
def test_evaluate_rejects_bad_checkpoints(files, ckpt, expected):
    assert_one_line_error(run("tools/evaluate.py", "--ckpt", files / ckpt, "--ar"), expected)


@pytest.mark.parametrize("args, expected", [
    (["--device", "cpu", "--peak_flops", "0"], "argument --peak_flops: must be a number > 0"),
    (["--device", "nonsense"], "unknown device 'nonsense'"),
])
def test_gpu_check_rejects_bad_arguments(args, expected):
    assert_one_line_error(run("tools/gpu_check.py", "--small", *args), expected)


def test_run_sees_a_traceback_and_an_exit_as_python_would(tmp_path):
    """run() in this process reports what a fresh `python script` would: a deep exception is a traceback and
    exit code 1 (which assert_one_line_error rejects), sys.exit("error: ...") one line and exit code 1."""
    (tmp_path / "deep.py").write_text("import sys\nprint('partial')\nraise ValueError('deep inside')\n")
    (tmp_path / "clean.py").write_text("import sys\nsys.exit('error: the input is bad; fix it')\n")
    proc = run(tmp_path / "deep.py")
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "ValueError: deep inside" in proc.stderr
    assert proc.stdout == "partial\n"
    with pytest.raises(AssertionError):
        assert_one_line_error(proc)
    assert_one_line_error(run(tmp_path / "clean.py"), "the input is bad")
