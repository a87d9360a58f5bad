"""`host_sync`: an MLP classifier (Linear + GELU: matmul-bound) trained under bf16 autocast with fused AdamW;
each step gathers its batch from a feature table in host RAM and sends it pinned and non-blocking (nanoGPT's
`get_batch`). Slow: every step calls `loss.item()`, copies an accuracy to the host with `.cpu()` and calls
`torch.cuda.synchronize()` to log them, so the next batch's host work can no longer overlap the GPU.
Fixed: loss and accuracy are summed on the GPU and read (one sync) every 50 steps."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpudoctor.workloads.base import Step, Workload, autocast, seed_everything
from gpudoctor.workloads.zoo._common import fused_optimizer_kwargs
from gpudoctor.workloads.zoo.case import ZooCase

BATCH = 2048
LOG_EVERY = 50  # longer than the profiled window: the fixed trace holds no sync at all


def _mlp(d_in: int, hidden: int, depth: int, num_classes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(d_in if i == 0 else hidden, hidden), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(hidden, num_classes))


def _build(device: torch.device, small: bool, sync_every_step: bool) -> Step:
    seed_everything(0)
    rows, batch, d_in, hidden, depth, classes = (
        (256, 8, 32, 64, 2, 10) if small else (32768, BATCH, 768, 4096, 5, 1000)
    )
    gen = torch.Generator(device="cpu").manual_seed(0)
    features = torch.randn(rows, d_in, generator=gen)  # the dataset, in pageable host memory
    targets = torch.randint(0, classes, (rows,), generator=gen)
    model = _mlp(d_in, hidden, depth, classes).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **fused_optimizer_kwargs(device))
    pin = device.type == "cuda"
    log: list[str] = []
    sums = {"loss": torch.zeros((), device=device), "acc": torch.zeros((), device=device)}
    counter = [0]

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, rows, (batch,), generator=gen)
        x, y = features[idx], targets[idx]
        if pin:
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def run() -> None:
        step = counter[0]
        counter[0] += 1
        x, y = get_batch()
        with autocast(device):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        accuracy = (logits.argmax(dim=1) == y).float().mean()
        if sync_every_step:
            loss_value = loss.item()  # host sync: waits for the whole step
            accuracy_value = accuracy.cpu()  # host sync: a one-element device-to-host copy
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # "for accurate logging"
            log.append(f"step {step}: loss {loss_value:.4f} acc {float(accuracy_value):.3f}")
            return
        sums["loss"] += loss.detach()
        sums["acc"] += accuracy
        if (step + 1) % LOG_EVERY == 0:
            mean_loss, mean_acc = (torch.stack([sums["loss"], sums["acc"]]) / LOG_EVERY).tolist()
            log.append(f"step {step}: loss {mean_loss:.4f} acc {mean_acc:.3f}")
            sums["loss"].zero_()
            sums["acc"].zero_()

    info = {
        "model": "zoo.mlp_gelu",
        "batch": batch,
        "hidden": hidden,
        "depth": depth,
        "dtype": "bf16-autocast",
        "optimizer": "AdamW(fused)" if pin else "AdamW(foreach)",
        "host_syncs_per_step": 3 if sync_every_step else 0,
        "log_every": 1 if sync_every_step else LOG_EVERY,
        "variant": "slow" if sync_every_step else "fixed",
    }
    return Step(run=run, close=log.clear, info=info)


def build_slow(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, sync_every_step=True)


def build_fixed(device: torch.device, *, small: bool = False) -> Step:
    return _build(device, small, sync_every_step=False)


CASE = ZooCase(
    rule="host_sync",
    title="loss.item(), .cpu() and cuda.synchronize() in every step",
    slow=Workload(
        "host_sync.slow", "MLP training logging loss.item()/.cpu() + synchronize() each step", build_slow
    ),
    fixed=Workload(
        "host_sync.fixed", "MLP training summing metrics on the GPU, read every 50 steps", build_fixed
    ),
    samples_per_step_slow=BATCH,
    samples_per_step_fixed=BATCH,
    note=(
        "Planted: three host syncs at the end of every step (loss.item(), accuracy.cpu(), "
        "torch.cuda.synchronize()); the host then gathers and pins the next batch (~1.5 ms) while the "
        "GPU idles, on a ~3.5 ms GPU step. Fix: accumulate loss and accuracy in device tensors and read "
        f"them (.tolist(), one sync) every {LOG_EVERY} steps, so the batch gathering overlaps the GPU's work."
    ),
)
