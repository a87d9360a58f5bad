"""`gpudoctor run --nproc N`: the ranks started under torchrun (`--standalone`), each `gpudoctor run` with
the same options (`runner.ranks` inside each), through the runner's one way of starting a process for the
user's script (`runner.child.run_attached`: a process group of its own, Ctrl-C passed on, nothing left
behind). NVLink multicast stays off unless the environment says otherwise: a tool's own launch must not
need it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpudoctor.runner.child import run_attached
from gpudoctor.runner.phases import LiveOptions

NVLS_OFF_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def torchrun_argv(nproc: int, out: Path, options: LiveOptions, module: bool, command: list[str]) -> list[str]:
    """The torchrun command line that runs `gpudoctor run` with these options as `nproc` ranks."""
    o = options
    flags = [
        "--out", str(out), "--warmup", str(o.warmup), "--light-steps", str(o.light_steps),
        "--light-seconds", str(o.light_seconds), "--warmup-seconds", str(o.warmup_seconds), "--steps", str(o.steps),
        "--nvml-interval", str(round(o.nvml_interval_s * 1000)), "--module-depth", str(o.module_depth),
    ]  # fmt: skip
    for name, on in (
        ("--light", o.light_only),
        ("--run-to-end", o.run_to_end),
        ("--with-stack", o.with_stack),
        ("--record-shapes", o.record_shapes),
        ("--profile-memory", o.profile_memory),
    ):
        flags += [name] if on else []
    flags.append("--nvml" if o.nvml else "--no-nvml")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    return [*launcher, "-m", "gpudoctor", "run", *flags, *(["-m"] if module else []), *command]


def run_ranks(nproc: int, out: Path, options: LiveOptions, module: bool, command: list[str]) -> int:
    """Run the ranks under torchrun, in the foreground, to their end; torchrun's exit status."""
    env = {**os.environ, **{k: v for k, v in NVLS_OFF_ENV.items() if k not in os.environ}}
    return run_attached(torchrun_argv(nproc, out, options, module, command), env)
