# Stage 2 of the paper's recipe (arXiv 2604.07023) for Qwen2.5-0.5B-Instruct: MARS,
# starting from stage 1's out/qwen05/ar.pt (config/qwen05_ar.py).
#   python train.py --config config/qwen05_mars.py                                  # one GPU
#   torchrun --standalone --nproc_per_node=8 train.py --config config/qwen05_mars.py --grad_accum 6
# A preset sets train.py flags; flags on the command line override it.
stage = "mars"
block_size = 4
alpha = 1.0  # noisy CE + 1 x clean (AR) CE
random_offsets = False  # blocks from position 0, as released; delete this line for nanoMARS's default
data = "sft.jsonl"  # your {"messages": [...]} JSONL; train.py holds 2% of it out for the loss curve
out_dir = "out/qwen05"
max_len = 512  # train.py drops longer examples
# global batch 384 = batch_size x grad_accum x GPUs: 8 x 48 x 1 here; on 8 GPUs pass --grad_accum 6
batch_size = 8
grad_accum = 48
# 5 epochs of the paper's ~2M examples at 384 a step. train.py counts steps, not epochs: for other data
# pass --max_iters (5 x examples / 384) and --warmup (3% of it)
max_iters = 5 * 2_000_000 // 384
warmup = max_iters * 3 // 100
lr = 5e-6
min_lr_ratio = 0.0  # cosine decay to 0
betas = (0.9, 0.999)
weight_decay = 0.0
grad_clip = 1.0
grad_checkpointing = True
eval_interval = 500
# bf16: on CUDA train.py always computes in bf16 autocast over fp32 master weights (no flag)
