# Stage 2 of the paper's recipe (arXiv 2604.07023) for Qwen2.5-7B-Instruct: MARS, on 8 GPUs,
# starting from stage 1's out/qwen7/ar.pt (config/qwen7_ar.py).
#   torchrun --standalone --nproc_per_node=8 train.py --config config/qwen7_mars.py
# A preset sets train.py flags; flags on the command line override it.
# fp32 weights, gradients and AdamW state of 7.6B parameters are 122 GB: more than one GPU holds, so
# --fsdp shards them over the GPUs (15 GB each on 8) and --grad_checkpointing keeps activations small.
# Each process first loads the full fp32 model into CPU memory (30 GB) before sharding it.
stage = "mars"
block_size = 4
alpha = 1.0  # noisy CE + 1 x clean (AR) CE
random_offsets = False  # blocks from position 0, as released; delete this line for nanoMARS's default
data = "sft.jsonl"  # your {"messages": [...]} JSONL; train.py holds 2% of it out for the loss curve
out_dir = "out/qwen7"
fsdp = True
grad_checkpointing = True
max_len = 512  # train.py drops longer examples
# global batch 384 = batch_size x grad_accum x GPUs = 8 x 6 x 8; on 4 GPUs pass --grad_accum 12
batch_size = 8
grad_accum = 6
# 5 epochs of the paper's ~2M examples at 384 a step. train.py counts steps, not epochs: for other data
# pass --max_iters (5 x examples / 384) and --warmup (3% of it)
max_iters = 5 * 2_000_000 // 384
warmup = max_iters * 3 // 100
lr = 5e-6
min_lr_ratio = 0.0  # cosine decay to 0
betas = (0.9, 0.999)
weight_decay = 0.0
grad_clip = 1.0
eval_interval = 500
# bf16: under --fsdp on CUDA, bf16 compute from fp32 master shards, gradients reduced in fp32 (no flag)
