"""On a real GPU: the in-process A/B of `gpudoctor fix` — fixes switched off and on in blocks of one
process, A B B A … — for the fixes whose switching touches CUDA state: channels_last (weights, gradients
and Adam's state converted back and forth), bfloat16 autocast, TF32, the fused optimizer (its step
counts moved between the GPU and the CPU with the flag), and torch.compile with CUDA graphs
(the graphs' memory pool beside eager steps); and two compiled forwards held in one process, each with
CUDA graphs of its own — autocast beneath a compile that stays, plain compile in CUDA graphs' place; and
torch.distributions' validation switched beneath a compiled function that builds a `Normal`. Each
round must time every block on CUDA events, leave the loss finite, and find what it should. Marked `gpu`;
skipped where torch sees no CUDA device (CI)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from compiled_scripts import COMPILED_INFERENCE  # noqa: E402
from gpudoctor.fixes.child import parse, run_round  # noqa: E402
from gpudoctor.fixes.round import RoundResult  # noqa: E402
from gpudoctor.timing.blocks import block_pairs  # noqa: E402
from gpudoctor.timing.paired import paired_compare  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CONVNET = """\
import torch

model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10),
).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 3, 64, 64, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
for step in range(100_000):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

MATMULS = """\
import torch

model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()
x = torch.randn(256, 2048, device="cuda")
with torch.no_grad():
    for step in range(1_000_000):
        model(x)
"""


def blocks_round(tmp_path: Path, body: str, fix: str) -> RoundResult:
    script = tmp_path / "train.py"
    script.write_text(body)
    return run_round(parse(["--out", str(tmp_path / "r.json"), "--fixes", fix, "--switch", fix, "--warmup", "5",
                            "--pairs", "6", "--block-s", "0.2", "--", str(script)]))  # fmt: skip


@pytest.mark.parametrize("fix", ["channels_last", "autocast", "compile:reduce-overhead", "fused_optimizer"])
def test_a_fix_switched_in_blocks_on_the_gpu_times_every_block(tmp_path: Path, fix: str) -> None:
    r = blocks_round(tmp_path, CONVNET, fix)
    assert r.failure is None and r.switch_error is None, r.failure
    assert len(r.blocks) == 12 and all(b.clock == "cuda_events" and b.steps >= 2 for b in r.blocks)
    assert r.outputs_kind == "loss" and all(math.isfinite(v) for step in r.outputs for v in step)
    c = paired_compare(block_pairs(r.blocks))
    print(fix, c.verdict, f"{100 * c.saving:.1f}%", c.test)  # the saving each measured, in the log


def test_tf32_switched_in_blocks_finds_the_tensor_cores(tmp_path: Path) -> None:
    r = blocks_round(tmp_path, MATMULS, "tf32")
    assert r.failure is None and len(r.blocks) == 12
    c = paired_compare(block_pairs(r.blocks))
    # float32 matmuls at 2048: TF32's tensor cores are several times faster (H100: 51 vs 416 TFLOP/s)
    assert c.verdict == "faster" and c.saving > 0.3, c


@pytest.mark.parametrize("body", [CONVNET, MATMULS], ids=["train", "infer"])
@pytest.mark.parametrize(
    ("fixes", "switch"),
    [
        ("compile:reduce-overhead,autocast", "autocast"),  # autocast beneath CUDA graphs that stay
        ("autocast,compile", "compile,compile:reduce-overhead"),  # plain compile in CUDA graphs' place
    ],
    ids=["autocast-beneath-graphs", "compile-for-graphs"],
)
def test_two_compiled_forwards_with_cuda_graphs_switch_in_blocks(
    tmp_path: Path, body: str, fixes: str, switch: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text(body)
    r = run_round(parse(["--out", str(tmp_path / "r.json"), "--fixes", fixes, "--switch", switch, "--warmup", "5",
                         "--pairs", "6", "--block-s", "0.2", "--", str(script)]))  # fmt: skip
    assert r.failure is None and r.switch_error is None, r.failure
    assert len(r.blocks) == 12 and all(b.clock == "cuda_events" and b.steps >= 2 for b in r.blocks)
    assert all(math.isfinite(v) for step in r.outputs for v in step)
    # each side compiled before the blocks (B's in the warm-up, A's in the prewarm), none inside one
    assert r.compile_s > 0 and r.compile_timed_s == 0.0, r.compile_timed_s
    c = paired_compare(block_pairs(r.blocks))
    print(
        fixes,
        switch,
        c.verdict,
        f"{100 * c.saving:.1f}%",
        c.test,
        f"compile {r.compile_s:.1f} s, {r.wall_s:.1f} s",
    )


PINNED = """\
import torch
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __init__(self):
        self.pool = torch.randn(8, 3, 224, 224)

    def __len__(self):
        return 1_000_000

    def __getitem__(self, index):
        return self.pool[index % 8], index % 10


model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
    torch.nn.Linear(8, 10),
).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Images(), batch_size=64, num_workers=4, persistent_workers=True)
for images, labels in loader:
    print("PINNED", images.is_pinned())
    images, labels = images.cuda(), labels.cuda()
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_pinned_batches_switch_in_blocks_and_reach_the_loop_after_their_lag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a loop copying 38 MB batches from 4 workers, pinned batches switched in blocks (the
    # loader's 4 × 2 batches in flight: a lag of 9 steps after each switch)
    from gpudoctor.timing.paired import sides

    script = tmp_path / "train.py"
    script.write_text(PINNED)
    r = run_round(parse(["--out", str(tmp_path / "r.json"), "--fixes", "pin_memory", "--switch", "pin_memory",
                         "--warmup", "5", "--pairs", "4", "--block-s", "0.2", "--order-seed", "1", "--",
                         str(script)]))  # fmt: skip
    assert r.failure is None and r.switch_error is None, r.failure
    assert r.block_layout is not None and len(r.blocks) == 8
    assert all(b.clock == "cuda_events" for b in r.blocks)
    # THEN the batches the loop got were pinned in the warm-up, not in the calibration, and in each
    # block as its side has it: the batches made before a switch were used up in the untimed steps
    flags = [
        line.split()[1] == "True"
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("PINNED")
    ]
    runs = [v for i, v in enumerate(flags) if i == 0 or v != flags[i - 1]]
    expected = [True, False, *sides(r.block_layout.b_first)]
    expected = [v for i, v in enumerate(expected) if i == 0 or v != expected[i - 1]]
    assert runs[: len(expected)] == expected, (runs, expected)
    c = paired_compare(block_pairs(r.blocks))
    print("pin_memory", c.verdict, f"{100 * c.saving:.1f}%", c.test)


POLICY = """\
import torch
from torch.distributions import Normal

actor = torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.Tanh(), torch.nn.Linear(256, 2)).cuda()
critic = torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1)).cuda()
optimizer = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=1e-4)
obs = torch.randn(4096, 8, device="cuda")


def act(obs):
    policy = Normal(actor(obs), torch.ones(2, device="cuda"))
    action = policy.sample()
    return action, policy.log_prob(action).sum(-1), critic(obs).squeeze(-1)


for step in range(100_000):
    for t in range(8):
        action, log_prob, value = act(obs)
    loss = -(log_prob * value.detach()).mean() + value.pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_no_validation_switches_in_blocks_beneath_a_compiled_step_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a compiled function over a distribution is guarded on the validation flag: each setting compiled
    # once before the blocks (B's in the warm-up, A's in the prewarm), none inside a timed one. A round is
    # a fresh process; this one is not: the first torch.compile of an earlier test (dynamo's TorchPatcher)
    # turned validation off for the whole process, so it is set back as a fresh process has it
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", True)
    script = tmp_path / "rl.py"
    script.write_text(POLICY)
    r = run_round(parse(["--out", str(tmp_path / "r.json"), "--fixes", "compile_fn,no_validation", "--switch",
                         "no_validation", "--warmup", "5", "--pairs", "6", "--block-s", "0.2", "--exact-random",
                         "--", str(script)]))  # fmt: skip
    assert r.failure is None and r.switch_error is None, r.failure
    assert r.patches["compile_fn"].applied and r.patches["no_validation"].applied
    assert len(r.blocks) == 12 and all(b.clock == "cuda_events" for b in r.blocks)
    assert r.compile_s > 0 and r.compile_timed_s == 0.0, r.compile_timed_s
    assert r.outputs_kind == "loss" and all(math.isfinite(v) for step in r.outputs for v in step)
    c = paired_compare(block_pairs(r.blocks))
    print("no_validation beneath compile_fn", c.verdict, f"{100 * c.saving:.1f}%", c.test)


def test_a_round_times_the_calls_of_a_model_the_script_compiles_with_module_compile(tmp_path: Path) -> None:
    # its hooks run inside the compiled call (CUDA graphs here): the step is seen from outside it, as
    # one call of the model, not as an iteration of the loop around it
    script = tmp_path / "infer.py"
    script.write_text(COMPILED_INFERENCE)
    r = run_round(
        parse(["--out", str(tmp_path / "r.json"), "--warmup", "10", "--steps", "50", "--", str(script)])
    )
    assert r.failure is None, r.failure
    assert r.step is not None and r.step.source == "module" and r.step.module == "Net", r.step
    assert len(r.step_times_us) >= 50 and r.clock == "cuda_events"
    assert r.observations is not None and r.observations.root is not None and r.observations.root.compiled
