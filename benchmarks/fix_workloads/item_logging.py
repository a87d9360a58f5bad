"""A small GPT-style language model trained in float32, logging the loss with `loss.item()` every step
into a running average and printing it — the loop most tutorials show. `--expert`: the loss kept on the
GPU and read every 100 steps, bfloat16 autocast, fused AdamW."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1_000_000)
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--small", action="store_true", help="a tiny model (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

DIM, LAYERS, SEQ, VOCAB = (32, 2, 32, 256) if args.small else (512, 6, 256, 16_000)
device = "cuda" if torch.cuda.is_available() else "cpu"


class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        layer = torch.nn.TransformerEncoderLayer(
            DIM, 8, 4 * DIM, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, LAYERS)
        self.head = torch.nn.Linear(DIM, VOCAB)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens), mask=self.mask, is_causal=True))


model = LM().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True if args.expert else None)
running = torch.zeros((), device=device) if args.expert else 0.0
for step in range(args.steps):
    tokens = torch.randint(0, VOCAB, (args.batch, SEQ + 1), device=device)
    if args.expert:
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
    else:
        logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if args.expert:
        running += loss.detach()
        if step % 100 == 99:
            print(f"step {step + 1} loss {running.item() / 100:.4f}")
            running.zero_()
    else:
        running = 0.98 * running + 0.02 * loss.item()
        print(f"step {step + 1} loss {running:.4f}")
