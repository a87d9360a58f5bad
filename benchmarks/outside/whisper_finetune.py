"""A speech-recognition fine-tune as a transformers user writes it without the Trainer, for trying
gpudoctor on code it was not tuned for: Whisper (base's shape, from its config: random weights, no
download) on random log-mel features and token labels made per index by a Dataset, two loader workers,
AdamW with a linear warm-up from `transformers.get_linear_schedule_with_warmup`, gradient clipping, the
loss shown every step with `loss.item()`. Float32, as the model loads. Nothing here is tuned."""

import argparse

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import WhisperConfig, WhisperForConditionalGeneration, get_linear_schedule_with_warmup

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=50)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--label-len", type=int, default=96)
parser.add_argument("--lr", type=float, default=1e-4)
args = parser.parse_args()

config = WhisperConfig(
    d_model=512,
    encoder_layers=6,
    decoder_layers=6,
    encoder_attention_heads=8,
    decoder_attention_heads=8,
    encoder_ffn_dim=2048,
    decoder_ffn_dim=2048,
)


class RandomSpeech(Dataset):
    """Log-mel features of 30 s and a transcript's token ids, different for each index."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        features = torch.randn(config.num_mel_bins, 3000, generator=g)
        length = int(torch.randint(args.label_len // 2, args.label_len, (1,), generator=g))
        labels = torch.full((args.label_len,), -100)
        labels[:length] = torch.randint(0, config.vocab_size, (length,), generator=g)
        return {"input_features": features, "labels": labels}


device = torch.device("cuda")
model = WhisperForConditionalGeneration(config).to(device)
loader = DataLoader(
    RandomSpeech(4_000), batch_size=args.batch_size, shuffle=True, num_workers=2, drop_last=True
)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
scheduler = get_linear_schedule_with_warmup(optimizer, 100, args.epochs * len(loader))

model.train()
for epoch in range(args.epochs):
    for step, batch in enumerate(loader):
        batch = {k: v.to(device) for k, v in batch.items()}
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        print(f"epoch {epoch} step {step} loss {loss.item():.4f}", end="\r")
