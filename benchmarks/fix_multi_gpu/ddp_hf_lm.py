"""GPT-2 (124M, transformers, built from its config: random weights) trained as a causal LM under DDP in
float32 with AdamW, a linear warm-up, gradient clipping and gradient accumulation (4 micro-batches of 4 ×
128 tokens per rank), written as users often write it: `find_unused_parameters=True` (nothing is unused)
and every micro-batch's backward all-reducing the whole model's gradients (no `no_sync()`): 500 MB of
float32 gradients exchanged four times per optimizer step, for 512 tokens of compute each time.

`--expert`: `no_sync()` on every micro-batch but the last, bfloat16 autocast, TF32,
`find_unused_parameters=False`, `gradient_as_bucket_view=True`, fused AdamW (not `static_graph=True`: DDP
cannot run it with `no_sync()` from the first iteration), and on the GPU the model compiled before DDP
wraps it: at 4 × 128 tokens a micro-batch the step is bound by the host's launches, where autocast alone
adds casts (the expert without compile was slower than `no_sync` alone on 2 × H200:
benchmarks/results/fix_multi_gpu_short_budgets.json).
`--small`: a two-layer GPT-2 on 32-token sequences (the CPU path, gloo).

    torchrun --standalone --nproc-per-node 2 benchmarks/fix_multi_gpu/ddp_hf_lm.py [--expert] [--small]
"""

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1_000)
parser.add_argument("--micro-batch", type=int, default=4, help="sequences per rank per micro-batch")
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--accumulate", type=int, default=4, help="micro-batches per optimizer step")
parser.add_argument("--small", action="store_true", help="a tiny model (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

if args.small:
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=64, vocab_size=1000, n_positions=64, bos_token_id=999, eos_token_id=999
    )
    MICRO, SEQ, ACCUMULATE = 2, 32, 2
else:
    config = GPT2Config()
    MICRO, SEQ, ACCUMULATE = args.micro_batch, args.seq, args.accumulate


def main():
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    if args.expert:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    model = GPT2LMHeadModel(config).to(device)
    model.train()
    if args.expert and cuda:
        model.compile()
    if args.expert:
        model = DDP(model, device_ids=[local] if cuda else None, find_unused_parameters=False,
                    gradient_as_bucket_view=True)  # fmt: skip
    else:
        model = DDP(model, device_ids=[local] if cuda else None, find_unused_parameters=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1,
                                  fused=True if args.expert and cuda else None)  # fmt: skip
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=100, num_training_steps=1_000_000)

    tokens = torch.randint(0, config.vocab_size, (20_480, SEQ), generator=torch.Generator().manual_seed(0))
    data = TensorDataset(tokens)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=MICRO, sampler=sampler, drop_last=True)

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for i, (input_ids,) in enumerate(loader):
            input_ids = input_ids.to(device)
            last = (i + 1) % ACCUMULATE == 0
            sync = contextlib.nullcontext() if last or not args.expert else model.no_sync()
            with sync:
                if args.expert:
                    with torch.autocast(device.type, dtype=torch.bfloat16):
                        loss = model(input_ids, labels=input_ids).loss / ACCUMULATE
                else:
                    loss = model(input_ids, labels=input_ids).loss / ACCUMULATE
                loss.backward()
            if not last:
                continue
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % 10 == 0 and rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item() * ACCUMULATE:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
