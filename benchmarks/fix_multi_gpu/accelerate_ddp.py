"""BERT-base (transformers, built from its config: random weights) fine-tuned for sentence-pair
classification with accelerate, as accelerate's own `nlp_example.py` does it — pre-tokenized pairs padded
per batch by a collate function, AdamW with a linear warm-up, `accelerator.backward` — launched by torchrun
(`Accelerator()` reads torchrun's environment and wraps the model in DDP), in float32 with the DataLoader's
default of no workers.

`--expert`: `Accelerator(..., mixed_precision="bf16")`, padding to a multiple of 8 (as the example does under
mixed precision), loader workers with pinned memory and persistent workers, TF32, fused AdamW.
`--small`: a two-layer BERT on a tenth of the pairs, short ones (the CPU path, gloo).

    torchrun --standalone --nproc-per-node 2 benchmarks/fix_multi_gpu/accelerate_ddp.py [--expert] [--small]
"""

import argparse
import os
import random

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1_000)
parser.add_argument("--batch", type=int, default=32, help="per process")
parser.add_argument("--small", action="store_true", help="a tiny model (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

if args.small:
    config = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=64, num_labels=2)  # fmt: skip
    LENGTHS, BATCH = (8, 32), 8
else:
    config = BertConfig(num_labels=2)
    LENGTHS, BATCH = (24, 128), args.batch
CLS, SEP, PAD = 101, 102, 0


class TokenizedPairs(Dataset):
    """Sentence pairs as a tokenizer leaves them: `[CLS] a [SEP] b [SEP]`, lists of ids, and a label."""

    def __init__(self, count=40_960):
        rng = random.Random(0)
        self.items = []
        for _ in range(count):
            n = rng.randint(*LENGTHS) - 3
            a = [rng.randrange(103, config.vocab_size) for _ in range(n // 2)]
            b = [rng.randrange(103, config.vocab_size) for _ in range(n - n // 2)]
            ids = [CLS, *a, SEP, *b, SEP]
            types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
            self.items.append({"input_ids": ids, "token_type_ids": types, "labels": rng.randrange(2)})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def collate(examples, multiple_of=None):
    """Pad to the batch's longest (rounded up to `multiple_of`), as DataCollatorWithPadding does."""
    longest = max(len(e["input_ids"]) for e in examples)
    if multiple_of:
        longest = (longest + multiple_of - 1) // multiple_of * multiple_of
    batch = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
    for e in examples:
        pad = longest - len(e["input_ids"])
        batch["input_ids"].append(e["input_ids"] + [PAD] * pad)
        batch["token_type_ids"].append(e["token_type_ids"] + [0] * pad)
        batch["attention_mask"].append([1] * len(e["input_ids"]) + [0] * pad)
    out = {k: torch.tensor(v) for k, v in batch.items()}
    out["labels"] = torch.tensor([e["labels"] for e in examples])
    return out


def workers_per_rank():
    """This rank's share of the cores it may use, less one for the training loop."""
    mine = os.sched_getaffinity(0)
    try:  # the launcher's (torchrun's): the cores the job may use on this node
        launcher = os.sched_getaffinity(os.getppid())
    except OSError:
        launcher = mine
    cores = len(mine)
    if cores >= len(launcher):  # not pinned to a share of its own: the node's ranks share these cores
        cores //= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return cores - 1


def collate_to_8(examples):
    return collate(examples, multiple_of=8)


def main():
    cpu = not torch.cuda.is_available()  # as the example's --cpu: DDP over gloo where there is no GPU
    # one Accelerator(...) as its users write it (the fix writes its options there)
    accelerator = Accelerator(cpu=cpu, mixed_precision="bf16" if args.expert else "no")
    torch.manual_seed(0)
    if args.expert:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5,
                                  fused=True if args.expert and torch.cuda.is_available() else None)  # fmt: skip
    data = TokenizedPairs(4_096 if args.small else 40_960)
    if args.expert:
        workers = max(2, min(4, workers_per_rank()))
        loader = DataLoader(data, batch_size=BATCH, shuffle=True, collate_fn=collate_to_8, num_workers=workers,
                            pin_memory=True, persistent_workers=True, drop_last=True)  # fmt: skip
    else:
        loader = DataLoader(data, batch_size=BATCH, shuffle=True, collate_fn=collate, drop_last=True)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=100,
                                                num_training_steps=len(loader) * args.epochs)  # fmt: skip
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    model.train()
    step = 0
    for epoch in range(args.epochs):
        for batch in loader:
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step % 50 == 0:
                accelerator.print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
