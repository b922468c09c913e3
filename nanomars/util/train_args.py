"""
train.py's command line: every flag with its default and range check, and --config presets (config/*.py).
Kept apart from train.py so the flags and presets can be read and tested without starting a run.
"""
import argparse
import sys

from .cli import ArgumentParser, device_name, fail, nonneg_float, nonneg_int, positive_float, positive_int
from ..model import default_device


SWITCH = argparse.BooleanOptionalAction  # --flag / --no-flag, so a preset's True can be undone (or False said)


def train_parser(doc):
    """The parser, its flags in four groups (the --help order): the run and its data, the method,
    optimisation, the model shape and the system."""
    p = ArgumentParser(doc)
    for add in (run_flags, method_flags, optimisation_flags, model_and_system_flags):
        add(p)
    return p


def run_flags(p):
    p.add_argument("--config", default=None, help="a preset (config/*.py): its values act as flags given first, "
                   "so flags on the command line win")
    p.add_argument("--stage", choices=["ar", "mars", "medusa"], default="ar", help="ar: stage 1; mars: stage 2; "
                   "medusa: a peer of stage 2, --medusa_heads Medusa-1 heads trained on the frozen stage-1 model "
                   "(nanomars/compare/medusa.py)")
    p.add_argument("--out_dir", default="out")
    p.add_argument("--init_from", default=None, help="stage ar: 'scratch' (default) or a Hugging Face folder; "
                   "stage mars: a .pt checkpoint (default out_dir/ar.pt) or a Hugging Face folder; stage medusa: "
                   "a .pt checkpoint (default out_dir/ar.pt)")
    p.add_argument("--resume", action=SWITCH, default=False, help="continue this stage from out_dir/<stage>.pt "
                   "(with --fsdp: from the sharded out_dir/<stage>_dcp/)")
    p.add_argument("--data", default=None, help="a JSONL of {'messages': [...]} (default: the built-in task suite)")
    p.add_argument("--n_train", type=positive_int, default=20000, help="examples drawn from the built-in suite")
    p.add_argument("--epochs", type=positive_int, default=None, help="data-limited training: every training "
                   "example once per epoch, in a fresh seeded order (the last partial batch of an epoch is "
                   "dropped): the schedule is epochs x (examples // global batch) steps (--max_iters, if given, stops "
                   "earlier). Default: --max_iters steps, each batch drawn with replacement")
    p.add_argument("--last_turn_only", action=SWITCH, default=False, help="train only the last assistant "
                   "message of each conversation, as the released MARS code does (default: every one)")
    p.add_argument("--max_len", type=positive_int, default=None, help="examples longer than this are dropped "
                   "(default: 512, or the model's context if shorter)")


def method_flags(p):
    p.add_argument("--block_size", type=positive_int, default=4)
    p.add_argument("--medusa_heads", type=positive_int, default=None, help="stage medusa: how many heads; default "
                   "block_size-1 (as many proposals per forward as MARS at --block_size)")
    p.add_argument("--alpha", type=nonneg_float, default=1.0, help="weight of the clean-stream (AR) loss; 0 = no SFT loss")
    p.add_argument("--objective", choices=["mars", "no_sft_released", "bd3lm", "csbd"], default="mars",
                   help="stage mars: 'mars': noisy CE + alpha x clean CE (alpha 0 = the no-SFT ablation, plain); "
                   "'no_sft_released': that ablation as the released code ran it (noisy CE only, each sequence "
                   "weighted by 1/t, t ~ U(0.001, 1)); 'bd3lm': the paper's block-diffusion baseline as released "
                   "(nanomars/compare/block_diffusion.py); 'csbd': MARS's loss with the noisy stream bidirectional inside "
                   "a block (block_diffusion_mask, in the same file). Each objective is registered by its module "
                   "(dual_track.OBJECTIVES)")
    p.add_argument("--loss_norm", choices=["token", "sequence"], default="token",
                   help="'token': one mean over the batch's targets; 'sequence': each example's mean, then the "
                   "mean over examples (the released trainer's; short replies weigh more)")
    p.add_argument("--random_offsets", action=SWITCH, default=None,
                   help="stage mars (default on; --no-random_offsets for the released alignment): shift each "
                   "example's blocks by a random offset in [0, block_size), drawn per example per step from the "
                   "seeded batch generator, so the known context of a noisy prediction ends anywhere, as at decode "
                   "time, not only at multiples of block_size (held-out loss stays at offset 0). Measured in "
                   "experiments/alignment.py: on a fixed-template task, tau 0.95 exact match 0.00 -> 1.00")
    p.add_argument("--pad_targets", action=SWITCH, default=True,
                   help="train the EOS pads that fill each example's last block as targets, as the released code "
                   "does (dllm's AppendEOSBlockWrapper); --no-pad_targets: the pads stay (the blocks need them) but "
                   "nothing is trained to predict them (experiments/b_sweep.py)")


def optimisation_flags(p):
    p.add_argument("--max_iters", type=positive_int, default=None, help="optimizer steps (default 1200; with "
                   "--epochs: where to stop, the whole schedule by default)")
    p.add_argument("--batch_size", type=positive_int, default=32, help="examples per micro-step per process: "
                   "the global batch is batch_size x grad_accum x processes")
    p.add_argument("--grad_accum", type=positive_int, default=1)
    p.add_argument("--lr", type=positive_float, default=None, help="default: 2e-3 (ar) / 1e-3 (mars, medusa) from scratch; 5e-6 (the paper's) for Qwen2.5")
    p.add_argument("--warmup", type=nonneg_int, default=20, help="linear warmup steps")
    p.add_argument("--min_lr_ratio", type=nonneg_float, default=0.1,
                   help="after warmup the lr decays along a cosine to this fraction of --lr (the paper: 0)")
    p.add_argument("--betas", type=positive_float, nargs=2, default=[0.9, 0.95], help="AdamW's beta1 beta2")
    p.add_argument("--weight_decay", type=nonneg_float, default=0.01)
    p.add_argument("--grad_clip", type=positive_float, default=1.0)
    p.add_argument("--log_interval", type=positive_int, default=10)
    p.add_argument("--eval_interval", type=positive_int, default=200,
                   help="held-out loss and a checkpoint every N steps")
    p.add_argument("--eval_batches", type=positive_int, default=4)


def model_and_system_flags(p):
    # the model's shape is used only from scratch
    p.add_argument("--n_layer", type=positive_int, default=4)
    p.add_argument("--n_embd", type=positive_int, default=128)
    p.add_argument("--n_head", type=positive_int, default=4)
    p.add_argument("--n_kv_head", type=positive_int, default=2)
    p.add_argument("--intermediate_size", type=positive_int, default=352)
    # system
    p.add_argument("--device", type=device_name, default=default_device())
    p.add_argument("--grad_checkpointing", action=SWITCH, default=False)
    p.add_argument("--fsdp", action=SWITCH, default=False,
                   help="under torchrun: shard weights, gradients and AdamW state across the processes (FSDP2) "
                   "instead of replicating them (DistributedDataParallel, the default)")
    p.add_argument("--dist_timeout", type=positive_float, default=30.0,
                   help="minutes a process waits in a collective (e.g. while rank 0 writes a checkpoint) "
                   "before failing")
    p.add_argument("--compile", action=SWITCH, default=False)
    p.add_argument("--seed", type=nonneg_int, default=1337)


def read_preset(path, known):
    """A preset is a Python file of assignments, `lr = 5e-6`, one per flag (nanoGPT's config/ habit): unlike
    JSON it holds comments and arithmetic (max_iters = 5 * 2_000_000 // 384) and needs no new dependency.
    It is code, run like train.py itself, so only run presets you trust. Returns the values as command-line
    words, to go through each flag's own type and range check: True -> --flag, False -> --no-flag,
    a list -> --flag a b, None -> the flag's default."""
    values = {}
    try:
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), values)
    except OSError as e:
        fail(f"cannot read preset {path}: {e.strerror}")
    except Exception as e:  # a typo in the file: one line naming it, not a traceback
        fail(f"preset {path}: {type(e).__name__}: {e}")
    words = []
    for key, value in values.items():
        if key.startswith("__"):  # __builtins__, added by exec
            continue
        if key not in known or key == "config":
            fail(f"{path}: unknown setting {key!r} (a preset sets train.py flags: see python train.py --help)")
        if isinstance(value, bool):
            words.append(f"--{key}" if value else f"--no-{key}")
        elif value is not None:
            words += [f"--{key}", *map(str, value if isinstance(value, (list, tuple)) else [value])]
    return words


def parse_args(argv=None, doc=None):
    """train.py's arguments from argv (default sys.argv[1:]), a --config preset's values first."""
    argv = sys.argv[1:] if argv is None else list(argv)
    p = train_parser(doc)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    config = pre.parse_known_args(argv)[0].config
    if config:
        preset = read_preset(config, vars(p.parse_args([])))
        try:
            p.parse_args(preset)  # the preset's words alone first, so that a bad value names the file
        except SystemExit as e:
            fail(f"{config}: {str(e.code).removeprefix('error: ')}")
        argv = preset + argv  # later words win: the command line's
    args = p.parse_args(argv)
    dual_track = args.stage == "mars" and args.objective != "bd3lm"
    if args.random_offsets and not dual_track:
        p.error("--random_offsets is for --stage mars with a dual-track objective (mars, no_sft_released, csbd)")
    if args.random_offsets is None:
        args.random_offsets = dual_track
    if args.objective != "mars" and args.stage != "mars":
        p.error(f"--objective {args.objective} is a stage-2 objective: use it with --stage mars")
    if args.stage == "medusa" and args.medusa_heads is None:
        if args.block_size < 2:
            p.error("--stage medusa trains block_size-1 heads by default: need --block_size >= 2 or --medusa_heads")
        args.medusa_heads = args.block_size - 1
    if args.stage == "medusa" and args.fsdp:
        p.error("--stage medusa trains a few small heads: run it without --fsdp (one process or DDP)")
    return args
