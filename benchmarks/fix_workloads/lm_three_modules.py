"""A GPT-style language model built as three modules — an `nn.Embedding`, an `nn.TransformerEncoder`
with a causal mask and an `nn.Linear` head — called from one plain function, trained in float32 on random
tokens with AdamW, the loss read with `.item()` every step for a running average. No `nn.Module` wraps
the three: the step calls three top-level modules. `--expert`: bfloat16 autocast around the whole
function, TF32, the function compiled, fused AdamW, the loss kept on the GPU and read every 100 steps."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1_000_000)
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--small", action="store_true", help="a tiny model (CPU smoke test)")
parser.add_argument("--expert", action="store_true")
args = parser.parse_args()

DIM, HEADS, LAYERS, SEQ, VOCAB = (32, 4, 2, 32, 256) if args.small else (512, 8, 6, 256, 16_000)
device = "cuda" if torch.cuda.is_available() else "cpu"
if args.expert:
    torch.set_float32_matmul_precision("high")

embed = torch.nn.Embedding(VOCAB, DIM).to(device)
layer = torch.nn.TransformerEncoderLayer(DIM, HEADS, 4 * DIM, dropout=0.0, batch_first=True, norm_first=True)
encoder = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False).to(device)
head = torch.nn.Linear(DIM, VOCAB).to(device)
mask = torch.nn.Transformer.generate_square_subsequent_mask(SEQ, device=device)
params = [*embed.parameters(), *encoder.parameters(), *head.parameters()]
optimizer = torch.optim.AdamW(params, lr=3e-4, fused=True if args.expert else None)


def forward(tokens):
    return head(encoder(embed(tokens), mask=mask, is_causal=True))


if args.expert and device == "cuda":  # Inductor on the CPU needs a C++ toolchain: the smoke test runs eager
    forward = torch.compile(forward)

running = torch.zeros((), device=device) if args.expert else 0.0
for step in range(args.steps):
    tokens = torch.randint(0, VOCAB, (args.batch, SEQ + 1), device=device)
    if args.expert:
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = forward(tokens[:, :-1])
    else:
        logits = forward(tokens[:, :-1])
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
        if step % 100 == 99:
            print(f"step {step + 1} loss {running:.4f}")
