"""BERT-base fine-tuned for sequence classification with Hugging Face's Trainer, as its users write it:
the model built from its config (random weights: no download), a tokenized dataset in memory, bfloat16,
batch 32, two loader workers. `--expert`: the Trainer's own flag, `TrainingArguments(torch_compile=True)`."""

import argparse
import tempfile

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100_000)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--small", action="store_true", help="a tiny model (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()
if args.small:
    args.seq = 32

if args.small:
    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                        num_labels=2)  # fmt: skip
else:
    config = BertConfig(num_labels=2)
model = BertForSequenceClassification(config)


class Tokenized(torch.utils.data.Dataset):
    """What `dataset.map(tokenizer)` leaves: ids, attention mask and a label per example."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1000, config.vocab_size, (n, args.seq), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(args.seq, dtype=torch.long),
                "labels": self.labels[i]}  # fmt: skip


cuda = torch.cuda.is_available()
training_args = TrainingArguments(
    output_dir=tempfile.mkdtemp(prefix="hf-trainer-"),
    per_device_train_batch_size=args.batch,
    max_steps=args.steps,
    learning_rate=2e-5,
    bf16=cuda,
    dataloader_num_workers=0 if args.small else 2,
    logging_steps=50,
    save_strategy="no",
    report_to="none",
    torch_compile=args.expert,
    use_cpu=not cuda,
)
trainer = Trainer(model=model, args=training_args, train_dataset=Tokenized(20_000))
trainer.train()
