"""Hugging Face `Trainer.train`: BERT-base sequence classification from its config, bf16, batch 32 of
128 tokens, a tokenized in-memory dataset."""

import argparse

import _window
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--small", action="store_true")
parser.add_argument("--out", default="/tmp/hf_trainer_out")
args = parser.parse_args()
config = BertConfig(num_labels=2)
if args.small:
    config = BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128, num_labels=2
    )


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, config.vocab_size, (n, 128), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones(128, dtype=torch.long),
            "labels": i % 2,
        }


class Tick(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        _window.tick()


training = TrainingArguments(
    output_dir=args.out,
    per_device_train_batch_size=32,
    max_steps=args.steps,
    bf16=torch.cuda.is_available(),
    report_to=[],
    save_strategy="no",
    logging_strategy="no",
    dataloader_num_workers=2,
    use_cpu=not torch.cuda.is_available(),
)
trainer = Trainer(
    model=BertForSequenceClassification(config),
    args=training,
    train_dataset=Tokens(32 * args.steps),
    callbacks=[Tick()],
)
trainer.train()
