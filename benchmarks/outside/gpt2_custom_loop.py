"""A language-model fine-tune as a transformers user writes it without the Trainer, for trying gpudoctor
on code it was not tuned for (`benchmarks/aa_noise.py --script`): GPT-2 small from its config (random
weights, no download) on random token blocks of 512, AdamW with a linear warm-up schedule from
`transformers.get_scheduler`, gradient clipping, the loss logged every 20 steps with `loss.item()`.
Float32 with the default attention. Nothing here is tuned."""

import argparse

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import AutoConfig, AutoModelForCausalLM, get_scheduler

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--block-size", type=int, default=512)
parser.add_argument("--lr", type=float, default=5e-5)
args = parser.parse_args()


class RandomTokens(Dataset):
    def __init__(self, n, block, vocab):
        self.n, self.block, self.vocab = n, block, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = torch.randint(0, self.vocab, (self.block,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
config = AutoConfig.for_model("gpt2")
model = AutoModelForCausalLM.from_config(config).to(device)
train_dataloader = DataLoader(RandomTokens(10_000, args.block_size, config.vocab_size),
                              batch_size=args.batch_size, shuffle=True)  # fmt: skip
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
num_training_steps = args.epochs * len(train_dataloader)
lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=100,
                             num_training_steps=num_training_steps)  # fmt: skip

model.train()
completed_steps = 0
for epoch in range(args.epochs):
    for batch in train_dataloader:
        batch = {k: v.to(device) for k, v in batch.items()}
        outputs = model(**batch)
        loss = outputs.loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        completed_steps += 1
        if completed_steps % 20 == 0:
            print(f"epoch {epoch} step {completed_steps} loss {loss.item():.4f}")
