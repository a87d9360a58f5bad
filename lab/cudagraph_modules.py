"""Why `torch.compile(mode="reduce-overhead")` over several modules of one step fails ("accessing tensor
output of CUDAGraphs that has been overwritten by a subsequent run", a DCGAN's and a diffusion UNet's in
`benchmarks/fix_vs_expert.py` on the H200), and what does not: each pattern runs 8 steps of small
modules on the GPU, compiled as named, and prints whether it ran or the error's first words.

    PYTHONPATH=src python lab/cudagraph_modules.py [--out results.json]

Patterns:
  frozen_encoder  a frozen encoder under no_grad feeds a trained module (diffusion: text encoder → UNet)
  gan             D(real).backward(); fake = G(z); D(fake.detach()).backward(); D(fake) → G's backward;
                  each output read with .item() after the backward that follows it (the DCGAN)
  one_module      the trained module alone (the control: CUDA graphs' own case)
Compile forms: every module reduce-overhead; the trained one alone reduce-overhead, the others default;
every module default.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
from torch import nn

DEVICE = "cuda"


def mlp(width: int = 256) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width)).to(DEVICE)


def frozen_encoder(compile_frozen: str | None, compile_trained: str | None) -> None:
    encoder, trained = mlp().eval().requires_grad_(False), mlp()
    enc = torch.compile(encoder, mode=compile_frozen) if compile_frozen else encoder
    net = torch.compile(trained, mode=compile_trained) if compile_trained else trained
    opt = torch.optim.AdamW(trained.parameters())
    for _ in range(8):
        x = torch.randn(64, 256, device=DEVICE)
        with torch.no_grad():
            context = enc(x)
        loss = (net(x) * context).square().mean()  # the context is kept for the backward
        loss.backward()
        opt.step()
        opt.zero_grad()


def gan(compile_d: str | None, compile_g: str | None) -> None:
    g_net, d_net = mlp(), mlp()
    g = torch.compile(g_net, mode=compile_g) if compile_g else g_net
    d = torch.compile(d_net, mode=compile_d) if compile_d else d_net
    opt_g, opt_d = torch.optim.Adam(g_net.parameters()), torch.optim.Adam(d_net.parameters())
    for _ in range(8):
        real, z = torch.randn(64, 256, device=DEVICE), torch.randn(64, 256, device=DEVICE)
        d_net.zero_grad()
        out = d(real)
        out.square().mean().backward()
        out.mean().item()
        fake = g(z)
        out = d(fake.detach())
        out.square().mean().backward()
        opt_d.step()
        g_net.zero_grad()
        out.mean().item()
        out = d(fake)
        out.square().mean().backward()
        opt_g.step()
        out.mean().item()


def one_module(mode: str | None, _: str | None) -> None:
    net = mlp()
    model = torch.compile(net, mode=mode) if mode else net
    opt = torch.optim.AdamW(net.parameters())
    for _ in range(8):
        loss = model(torch.randn(64, 256, device=DEVICE)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()


PATTERNS: dict[str, Callable[[str | None, str | None], None]] = {
    "frozen_encoder": frozen_encoder,
    "gan": gan,
    "one_module": one_module,
}
FORMS = {  # (the first module's mode, the second's): the first is the frozen encoder, D, or the only one
    "all reduce-overhead": ("reduce-overhead", "reduce-overhead"),
    "trained alone reduce-overhead": ("default", "reduce-overhead"),
    "all default": ("default", "default"),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = []
    for name, run in PATTERNS.items():
        for form, modes in FORMS.items():
            if name == "gan" and form == "trained alone reduce-overhead":
                continue  # both are trained
            torch._dynamo.reset()
            try:
                run(*modes)
                outcome = "ran"
            except Exception as err:  # the outcome is the finding
                outcome = f"{type(err).__name__}: {' '.join(str(err).split())[:90]}"
            rows.append({"pattern": name, "form": form, "outcome": outcome})
            print(f"{name:16} {form:30} {outcome}", flush=True)
    if args.out:
        env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        with open(args.out, "w") as f:
            json.dump({"environment": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
