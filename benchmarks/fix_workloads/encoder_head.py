"""A sentence classifier as fine-tuning scripts write it without the Trainer: a pretrained-style encoder
(`AutoModel`, BERT-base built from its config: random weights, no download) and a classification head of
one's own (dropout, `nn.Linear`), composed in a plain function — `head(encoder(...).last_hidden_state[:, 0])`
— float32, AdamW over both, batches of token ids from a DataLoader. `--expert`: bfloat16 autocast
around the function, TF32, the function compiled, fused AdamW, pinned memory and non-blocking copies."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from transformers import AutoModel, BertConfig

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1000)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--small", action="store_true", help="a tiny encoder (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

SEQ = 16 if args.small else args.seq
LABELS = 4
device = "cuda" if torch.cuda.is_available() else "cpu"
if args.expert:
    torch.set_float32_matmul_precision("high")
if args.small:
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
else:
    config = BertConfig()


class Tokenized(Dataset):
    """What `dataset.map(tokenizer, padding="max_length")` leaves: ids, an attention mask and a label."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1000, config.vocab_size, (n, SEQ), generator=g)
        self.lengths = torch.randint(SEQ // 2, SEQ + 1, (n,), generator=g)
        self.labels = torch.randint(0, LABELS, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        mask = (torch.arange(SEQ) < self.lengths[i]).long()
        return {"input_ids": self.ids[i] * mask, "attention_mask": mask, "labels": self.labels[i]}


encoder = AutoModel.from_config(config).to(device)
head = nn.Sequential(nn.Dropout(0.1), nn.Linear(config.hidden_size, LABELS)).to(device)
optimizer = torch.optim.AdamW([*encoder.parameters(), *head.parameters()], lr=2e-5, weight_decay=0.01,
                              fused=True if args.expert else None)  # fmt: skip
loader = DataLoader(Tokenized(20_000), batch_size=args.batch, shuffle=True, drop_last=True,
                    pin_memory=args.expert)  # fmt: skip


def forward_step(batch):
    hidden = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    return head(hidden[:, 0])


if args.expert and device == "cuda":  # Inductor on the CPU needs a C++ toolchain: the smoke test runs eager
    forward_step = torch.compile(forward_step)

encoder.train()
head.train()
for _epoch in range(args.epochs):
    for batch in loader:
        batch = {k: v.to(device, non_blocking=args.expert) for k, v in batch.items()}
        if args.expert:
            with torch.autocast(device, dtype=torch.bfloat16):
                logits = forward_step(batch)
                loss = nn.functional.cross_entropy(logits, batch["labels"])
        else:
            logits = forward_step(batch)
            loss = nn.functional.cross_entropy(logits, batch["labels"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
