"""The fix_vs_expert workloads whose step calls several top-level modules run on the CPU with `--small`,
as written and with their expert's changes (`--expert`), and each step calls the top-level modules it was
written to call — counted as benchmarks/fix_workloads/plain_timer.py counts them (`--count-modules`).
Each runs in this process for a few optimizer steps, then is stopped."""

from __future__ import annotations

import importlib.util
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gpudoctor.runner.hooks import eager_only

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "benchmarks" / "fix_workloads"
spec = importlib.util.spec_from_file_location("plain_timer", WORKLOADS / "plain_timer.py")
assert spec is not None and spec.loader is not None
plain_timer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plain_timer)

# the top-level modules with parameters each one's step calls, by class
MULTI_MODULE = {
    "gan_dcgan": ["Discriminator", "Generator"],
    "encoder_head": ["BertModel", "Sequential"],
    "diffusion_unet": ["ImageEncoder", "CLIPTextModel", "UNet"],
    "actor_critic": ["Actor", "Critic"],
    "lm_three_modules": ["Embedding", "TransformerEncoder", "Linear"],
}


class Enough(Exception):
    """Raised from the optimizer's step hook: the script has run the steps asked for."""


@pytest.fixture
def torch_settings() -> Iterator[None]:
    """What the experts set for their process (TF32, cudnn.benchmark, no distribution validation, one
    thread here), put back after each run."""
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    benchmark, validate = torch.backends.cudnn.benchmark, torch.distributions.Distribution._validate_args
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.benchmark = benchmark
    torch.distributions.Distribution.set_default_validate_args(validate)


def run_steps(name: str, flags: list[str], steps: int, on_step: Any = None) -> int:
    """Run the workload with `flags` until its leading optimizer (the first to step) has stepped
    `steps` times; the steps taken."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    taken: list[Any] = []

    def counted(optimizer: Any, args: Any, kwargs: Any) -> None:
        if taken and optimizer is not taken[0]:
            return
        taken.append(optimizer)
        if on_step is not None:
            on_step()
        if len(taken) >= steps:
            raise Enough

    handle = register_optimizer_step_post_hook(counted)
    argv = sys.argv
    sys.argv = [str(WORKLOADS / f"{name}.py"), "--small", *flags]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except Enough:
        pass
    finally:
        sys.argv = argv
        handle.remove()
    return len(taken)


@pytest.mark.parametrize("name", list(MULTI_MODULE))
def test_each_step_calls_several_top_level_modules_and_the_expert_runs(
    name: str, torch_settings: None
) -> None:
    # WHEN the script as written runs four steps, its top-level modules counted as the plain timer counts
    modules = plain_timer.TopModules(eager_only)
    modules.install()
    try:
        assert run_steps(name, [], 4, on_step=lambda: modules.step_ended(False)) == 4
    finally:
        modules.uninstall()
    # THEN each step after the first calls the modules it was written to call
    counted = modules.result()
    assert counted["per_step"] == [len(MULTI_MODULE[name])] * 3
    assert sorted(counted["names"]) == sorted(MULTI_MODULE[name])
    # AND the expert's version runs too
    assert run_steps(name, ["--expert"], 2) == 2
