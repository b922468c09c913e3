"""
What every command (train.py, sample.py, tools/bench.py, tools/evaluate.py, tools/gpu_check.py) shares: bad input ends in ONE
line starting "error:" and a non-zero exit, never a traceback. Numeric flags get a range-checked type, so
argparse itself refuses 0 or -1 where they make no sense and names the flag.
"""
import argparse
import sys


class ArgumentParser(argparse.ArgumentParser):
    def __init__(self, doc):
        super().__init__(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)

    def error(self, message):  # argparse's default prints the whole usage block before the message
        fail(f"{message} (see --help)")


def fail(message):
    sys.exit(f"error: {message}")


def _ranged(cast, ok, what):
    def parse(text):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    parse.__name__ = what  # argparse names the type in its messages
    return parse


positive_int = _ranged(int, lambda v: v >= 1, "an integer >= 1")
nonneg_int = _ranged(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _ranged(float, lambda v: v > 0 and v != float("inf"), "a number > 0")
nonneg_float = _ranged(float, lambda v: 0 <= v < float("inf"), "a number >= 0")
tau_float = _ranged(float, lambda v: 0 < v <= 1, "a threshold in (0, 1] (1 = exactly greedy AR)")


def device_name(text):
    """--device: a torch device that exists on this machine."""
    import torch
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"unknown device {text!r}: use cpu, cuda, cuda:1 or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("cuda is not available on this machine: use --device cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError("mps is not available on this machine: use --device cpu")
    return text


DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}


def dtype_name(text):
    """--dtype: the weights' dtype at inference. float32 is where "tau = 1 is exactly AR" holds bit for bit;
    in bf16 MARS and AR can round near-tie argmaxes differently (docs/mars.md)."""
    import torch
    if text not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}: use float32, bfloat16 or float16")
    return getattr(torch, DTYPES[text])


def run(main):
    """Call main(); a ValueError or OSError (bad file, bad value found later) becomes one line."""
    try:
        main()
    except (ValueError, OSError) as e:
        fail(str(e))
