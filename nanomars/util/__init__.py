"""Plumbing the commands share, read by whoever changes train.py or the tools: flags and one-line errors
(cli.py, train_args.py), progress of long work (progress.py), checkpoints (checkpoint.py), the
tokenizer (tokenizer.py) and the built-in task suite (tasks.py). Nothing of the method is here."""
