"""What takes nanoMARS to many GPUs, read by GPU users: distributed training with DDP or FSDP2
(distributed.py), the per-GPU memory table (memory.py) and a tiny random Qwen2 folder built with
transformers for parity checks (tiny_qwen.py). Reading a Hugging Face folder is plumbing every script
shares, so it lives in util/ (qwen.py). A student can skip it."""
