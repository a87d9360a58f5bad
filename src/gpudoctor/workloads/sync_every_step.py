"""`sync_every_step`: an MLP training loop with the usual host-sync antipatterns, each on its own line:
`loss.item()` every step, `.cpu()` of a metric, and an explicit `torch.cuda.synchronize()`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpudoctor.workloads import models
from gpudoctor.workloads.base import Step, Workload, seed_everything

NAME = "sync_every_step"


def build(device: torch.device, *, small: bool = False) -> Step:
    seed_everything(0)
    batch, d_in, hidden, depth, classes = (8, 32, 64, 2, 10) if small else (2048, 1024, 4096, 4, 1000)
    model = models.mlp(d_in, hidden, depth, classes).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cpu").manual_seed(0)
    inputs = [torch.randn(batch, d_in, generator=gen).to(device) for _ in range(4)]
    labels = [torch.randint(0, classes, (batch,), generator=gen).to(device) for _ in range(4)]
    history: list[tuple[float, float]] = []
    counter = [0]

    def run() -> None:
        i = counter[0] % len(inputs)
        counter[0] += 1
        logits = model(inputs[i])
        loss = F.cross_entropy(logits, labels[i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_value = loss.item()  # host sync: waits for the whole step's kernels
        accuracy = (logits.argmax(dim=1) == labels[i]).float().mean()
        accuracy_cpu = accuracy.cpu()  # host sync: device-to-host copy of one scalar
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # host sync: explicit, and redundant after the two above
        history.append((loss_value, float(accuracy_cpu)))

    def close() -> None:
        inputs.clear()
        labels.clear()
        history.clear()

    info = {"model": "builtin.mlp", "batch": batch, "hidden": hidden, "depth": depth, "dtype": "fp32"}
    return Step(run=run, close=close, info=info)


WORKLOAD = Workload(
    NAME, "MLP training with loss.item(), metric .cpu() and cuda.synchronize() every step", build
)
