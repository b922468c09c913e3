"""Plumbing the commands share, read by whoever changes train.py or the tools: flags and one-line errors
(cli.py, train_args.py), progress of long work (progress.py), checkpoints (checkpoint.py) and Qwen2.5 /
released MARS Hugging Face folders (qwen.py, safetensors_io.py), the tokenizer (tokenizer.py) and the
built-in task suite (tasks.py). Nothing of the method is here, and nothing here imports compare/ or scale/."""
