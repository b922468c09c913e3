"""What takes nanoMARS to real checkpoints and many GPUs, read by GPU users: Qwen2.5 / released MARS
Hugging Face folders (qwen.py, safetensors_io.py), distributed training with DDP or FSDP2
(distributed.py), the per-GPU memory table (memory.py) and a tiny random Qwen2 folder built with
transformers for parity checks (tiny_qwen.py). A student can skip it."""
