"""A small Transformer classifier trained with Lightning's Trainer.fit on an in-memory dataset, float32.
`--expert`: precision="bf16-mixed", TF32, fused AdamW, torch.compile of the LightningModule."""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100_000)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--small", action="store_true", help="a tiny model (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

DIM, SEQ, VOCAB = (32, 16, 100) if args.small else (256, 128, 8000)


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        layer = torch.nn.TransformerEncoderLayer(DIM, 4, 4 * DIM, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 4)
        self.head = torch.nn.Linear(DIM, 10)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))

    def training_step(self, batch, batch_idx):
        tokens, labels = batch
        return torch.nn.functional.cross_entropy(self(tokens), labels)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3, fused=True if args.expert else None)


if args.expert:
    torch.set_float32_matmul_precision("high")
data = TensorDataset(torch.randint(0, VOCAB, (20_000, SEQ)), torch.randint(0, 10, (20_000,)))
loader = DataLoader(data, batch_size=args.batch, shuffle=True)
model = Classifier()
if args.expert:
    model = torch.compile(model)
trainer = pl.Trainer(
    max_steps=args.steps, accelerator="auto", devices=1, precision="bf16-mixed" if args.expert else "32-true",
    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
)  # fmt: skip
trainer.fit(model, loader)
