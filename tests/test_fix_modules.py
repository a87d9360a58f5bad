"""Steps that call several top-level modules — an embedding, an encoder and a head called in one function,
a GAN's generator and discriminator — get every fix that wraps "the model" on each of them, and each fix
shows whether it took effect: the share of the forward's matmul work that ran in bfloat16, the
convolutions fed channels_last, the graphs torch.compile made. On the CPU, on real modules."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch.nn.modules import module as nn_module

from gpudoctor.fixes.attempt import no_effect, random_differs
from gpudoctor.fixes.catalog import SPECS, build_patch
from gpudoctor.fixes.evidence import CompileCounts, RoundWork, WorkTally, op_flops
from gpudoctor.fixes.kinds.base import Proposing
from gpudoctor.fixes.observe import Observer
from gpudoctor.fixes.patches.base import PatchContext
from gpudoctor.fixes.round import RoundResult
from gpudoctor.runner.hooks import RootFinder, patched


@pytest.fixture(autouse=True)
def no_global_hooks_left() -> Iterator[None]:
    before = (dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks))
    yield
    assert (dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks)) == before


class LanguageModel:
    """The issue's language model: three modules called in turn by one function."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 32)
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = torch.nn.Linear(32, 50)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def run(
    fixes: list[str], body: Any, steps: list[int], compile_backend: str = "inductor"
) -> tuple[RootFinder, list[Any], Observer]:
    """Apply `fixes` with the observer, as a fix round does (the modules found over the first 3 steps of
    `body`, which bumps steps[0] at each step), run `body()`, undo."""
    finder = RootFinder(until=lambda: steps[0] >= 3)
    ctx = PatchContext(finder, __file__)
    patches = sorted(
        (build_patch(f, ctx, compile_backend=compile_backend) for f in fixes), key=lambda p: p.order
    )
    observer = Observer(finder)
    finder.install()
    try:
        with patched([*patches, observer]):
            body()
            obs = observer.observations()
    finally:
        finder.uninstall()
    return finder, [p.outcome() for p in patches], obs


def test_every_top_level_module_is_found_and_one_called_once_at_set_up_is_not_the_steps() -> None:
    lm = LanguageModel()
    probe = torch.nn.Linear(50, 50)  # called once before the loop
    steps = [0]

    def body() -> None:
        probe(torch.randn(2, 50))
        for _ in range(5):
            lm.step(torch.randint(0, 50, (2, 8)))
            steps[0] += 1

    finder, _, obs = run([], body, steps)
    assert [r.module for r in finder.roots()] == [probe, lm.embed, lm.encoder, lm.head]
    assert [r.module for r in finder.per_step()] == [lm.embed, lm.encoder, lm.head]
    assert [r.cls for r in obs.step_roots] == ["Embedding", "TransformerEncoder", "Linear"]
    assert obs.root is not None and obs.root.cls == "Embedding"
    assert not finder.watching  # gone once the steps were counted


def test_bfloat16_reaches_the_matmuls_of_every_module_and_says_so() -> None:
    lm = LanguageModel()
    steps = [0]
    dtypes: list[torch.dtype] = []
    logits: list[torch.Tensor] = []

    def body() -> None:
        for _ in range(5):
            logits.append(lm.step(torch.randint(0, 50, (2, 8))).detach())
            dtypes.append(logits[-1].dtype)
            steps[0] += 1

    _, outcomes, obs = run(["autocast"], body, steps)
    # THEN the head's logits are computed in bfloat16 from the first step on (they leave it in float32,
    # each value one bfloat16 holds), and the probe of each module's first call saw its matmuls in
    # bfloat16 (the embedding has none)
    assert dtypes == [torch.float32] * 5 and all(torch.equal(x, x.bfloat16().float()) for x in logits)
    work = obs.work
    assert work is not None and work.total > 0 and work.half_flops() / work.total > 0.99
    assert SPECS["autocast"].not_in_effect(RoundWork(work, obs.compiled, len(obs.step_roots))) is None
    # AND the permanent change wraps each module's call (all three on the one line of `step`)
    assert {e.op for e in outcomes[0].edits} == {"wrap_statement"}
    assert [c.split(".")[0] for c in outcomes[0].changes] == ["Embedding", "TransformerEncoder", "Linear"]


def test_autocast_on_the_first_module_alone_did_not_take_effect() -> None:
    # GIVEN the work of the language model with bfloat16 around the embedding alone: the
    # encoder's and the head's matmuls in float32
    tally = WorkTally({"float32": 3.0e6}, ops=40)
    reason = SPECS["autocast"].not_in_effect(RoundWork(tally, None, 3))
    # THEN it is said as such, never as "no significant difference"
    assert reason is not None and reason.startswith("did not take effect: 0% of the forward's matmul")
    assert "of the 3 modules the step calls" in reason


def test_a_round_whose_fix_did_not_take_effect_is_failed_with_why() -> None:
    lm = LanguageModel()
    steps = [0]

    def body() -> None:
        for _ in range(4):
            lm.step(torch.randint(0, 50, (2, 8)))
            steps[0] += 1

    _, _, obs = run([], body, steps)  # the baseline: float32
    r = RoundResult(fixes=("autocast",), outcome="completed", exit_code=0, observations=obs)
    why = no_effect(r, ("autocast",))
    assert why is not None and why.startswith("bfloat16 autocast did not take effect")
    assert no_effect(r, ("workers:4",)) is None  # nothing to tell for a loader fix


def test_channels_last_reaches_the_convolutions_of_both_gan_modules() -> None:
    torch.manual_seed(0)
    gen = torch.nn.Sequential(torch.nn.ConvTranspose2d(8, 4, 4, 2, 1), torch.nn.Conv2d(4, 3, 3, padding=1))
    disc = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1), torch.nn.Flatten(), torch.nn.LazyLinear(1))
    disc(torch.randn(1, 3, 8, 8))  # materialize the lazy layer outside the finder
    steps = [0]

    def body() -> None:
        for _ in range(4):
            fake = gen(torch.randn(2, 8, 4, 4))
            disc(torch.randn(2, 3, 8, 8))
            disc(fake.detach())
            steps[0] += 1

    finder, outcomes, obs = run(["channels_last"], body, steps)
    assert [r.module for r in finder.per_step()] == [gen, disc]
    work = obs.work
    assert work is not None and work.conv_flops > 0 and work.conv_nhwc_flops / work.conv_flops > 0.99
    assert all(p.is_contiguous() for p in (*gen.parameters(), *disc.parameters()))  # put back on undo
    converted = {e.name for e in outcomes[0].edits if e.op == "after_assignment"}
    assert converted == {"gen", "disc"}  # each module converted where it is made


def test_compile_waits_for_the_finder_and_compiles_each_module_once() -> None:
    torch._dynamo.reset()
    lm = LanguageModel()
    steps = [0]
    compiled_while_watching = []
    from torch._dynamo.utils import counters

    start = counters["stats"]["unique_graphs"]  # Dynamo's counters add up over the whole process

    def body() -> None:
        for _ in range(6):
            lm.step(torch.randint(0, 50, (2, 8)))
            steps[0] += 1
            compiled_while_watching.append(counters["stats"]["unique_graphs"] - start)

    _, _, obs = run(["compile"], body, steps, compile_backend="eager")
    # THEN nothing compiled while the finder's hooks were in (steps 1-3), then each module once
    assert compiled_while_watching[:3] == [0, 0, 0]
    assert obs.compiled is not None and obs.compiled.graphs >= 3
    assert SPECS["compile"].not_in_effect(RoundWork(None, obs.compiled, 3)) is None
    assert SPECS["compile"].not_in_effect(RoundWork(None, CompileCounts(), 3)) is not None


def test_cuda_graphs_that_inductor_skipped_are_said_with_its_reason() -> None:
    # mode="reduce-overhead" runs without its CUDA graphs where Inductor skips them (an input the graph
    # mutates, a CPU tensor in it): the round counts its skips and hears its reasons, which the fix's
    # evidence then says beside the graphs
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    torch._dynamo.reset()
    lm = LanguageModel()
    steps = [0]

    def body() -> None:
        for _ in range(5):
            lm.step(torch.randint(0, 50, (2, 8)))
            steps[0] += 1
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (1 instances)")

    _, _, obs = run(["compile:reduce-overhead"], body, steps, compile_backend="eager")
    assert obs.compiled is not None and obs.compiled.cudagraph_skips == 1
    assert obs.compiled.cudagraph_reasons == ("skipping cudagraphs due to mutated inputs (1 instances)",)
    words = SPECS["compile"].evidence(RoundWork(None, obs.compiled, 3))
    assert words is not None and words.endswith(
        "; CUDA graphs skipped 1 time: skipping cudagraphs due to mutated inputs (1 instances)"
    )
    # AND a later round of the same process hears only its own
    _, _, again = run(["compile"], lambda: steps.__setitem__(0, 3), [0], compile_backend="eager")
    assert again.compiled is not None and again.compiled.cudagraph_skips == 0
    assert again.compiled.cudagraph_reasons == ()
    assert "CUDA graphs" not in (SPECS["compile"].evidence(RoundWork(None, again.compiled, 3)) or "")


class Encoder(torch.nn.Module):
    """A VAE encoder as a diffusion fine-tune calls it: it samples its latents in its own forward."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, logvar = self.conv(x).chunk(2, dim=1)
        return mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)


def test_a_module_that_samples_in_its_forward_is_compiled_drawing_as_eager_does() -> None:
    # GIVEN a frozen sampling encoder and a trained head called in one step, no dropout anywhere
    torch.manual_seed(0)
    encoder, head = Encoder(), torch.nn.Linear(4 * 8 * 8, 1)
    steps = [0]

    def body() -> None:
        for _ in range(4):
            head(encoder(torch.randn(2, 3, 8, 8)).flatten(1)).sum()
            steps[0] += 1

    _, _, obs = run([], body, steps)
    sampler = next(r for r in obs.step_roots if r.cls == "Encoder")
    # THEN its first call's forward is seen drawing, though it has no dropout module
    assert not sampler.dropout and sampler.work is not None and sampler.work.random_ops == 1
    assert sampler.draws_random and not next(r for r in obs.step_roots if r.cls == "Linear").draws_random
    # AND compile's rounds draw as eager does, so that the losses compare
    assert random_differs(("compile",), obs) and not random_differs(("tf32",), obs)


def test_flops_are_counted_from_shapes() -> None:
    a, b = torch.empty(4, 8), torch.empty(8, 16)
    assert op_flops("mm", (a, b), None) == ("matmul", 2 * 4 * 8 * 16)
    assert op_flops("addmm", (torch.empty(16), a, b), None) == ("matmul", 2 * 4 * 8 * 16)
    x, w, out = torch.empty(1, 3, 8, 8), torch.empty(4, 3, 3, 3), torch.empty(1, 4, 6, 6)
    assert op_flops("convolution", (x, w, None), out) == ("conv", 2 * 4 * 6 * 6 * 27)
    # transposed (weight Cin x Cout x k x k): the FLOPs of the convolution it is the adjoint of
    t, wt, up = torch.empty(1, 4, 6, 6), torch.empty(4, 3, 3, 3), torch.empty(1, 3, 8, 8)
    args = (t, wt, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1)
    assert op_flops("convolution", args, up) == ("conv", 2 * 4 * 6 * 6 * 27)
    assert op_flops("relu", (a,), a) is None


# an actor and a critic called from one plain function, as RL code writes its rollout step; a method, and
# functions that take their own gradients (`.backward()`, `torch.autograd.grad`), call modules too and are
# not compiled whole
ACTOR, CRITIC = torch.nn.Linear(6, 2), torch.nn.Linear(6, 1)


def act(obs: torch.Tensor) -> torch.Tensor:
    return torch.tanh(ACTOR(obs)).sum(-1) + CRITIC(obs).squeeze(-1) * 0.5


def learn(obs: torch.Tensor) -> None:
    CRITIC(obs).sum().backward()


def meta_learn(obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(ACTOR(obs).sum(), ACTOR.parameters())


class Rollout:
    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return CRITIC(obs)


def test_the_plain_function_that_calls_the_step_modules_is_compiled_whole_and_written_after_its_def() -> None:
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    start = counters["stats"]["unique_graphs"]
    steps, graphs = [0], []
    the_function = act

    def body() -> None:
        torch.optim.SGD([*ACTOR.parameters(), *CRITIC.parameters()], lr=0.0)  # a training script's
        for _ in range(6):
            obs = torch.randn(4, 6)
            globals()["act"](obs)  # as the script's loop looks the name up at each call
            learn(obs)
            meta_learn(obs)
            Rollout().value(obs)
            steps[0] += 1
            graphs.append(counters["stats"]["unique_graphs"] - start)
        bound.append(globals()["act"])  # what the name is bound to while the fix is on

    bound: list[Any] = []
    _, (outcome,), obs = run(["compile_fn"], body, steps, compile_backend="eager")
    # THEN the one plain function that does not take its own backward is found, and no method
    assert [(f.name, f.line) for f in obs.step_functions] == [("act", the_function.__code__.co_firstlineno)]
    # AND its name was bound to the compiled one, which ran once the finder's hooks were out, and back on undo
    assert bound[0] is not the_function and bound[0].__wrapped__ is the_function
    assert graphs[:3] == [0, 0, 0] and graphs[-1] >= 1
    assert globals()["act"] is the_function
    assert outcome.applied and outcome.changes == ("act() compiled",)
    assert [(e.op, e.name, e.line) for e in outcome.edits] == [
        ("after_definition", "act", the_function.__code__.co_firstlineno)
    ]
    # AND the search proposes it first of the compile group, the modules' own compile as its alternative
    spec = SPECS["compile_fn"]
    assert spec.propose(Proposing({"launch_overhead": None}, obs)) and spec.why_not(obs, "", 6) is None
    # (its rounds draw random numbers as eager code does, whatever the function samples)
    assert random_differs(("compile_fn",), None) and not random_differs(("compile",), obs)
    # (not where no optimizer steps count the step: the modules' calls that would count it run compiled)
    assert spec.propose(Proposing({"launch_overhead": None}, replace(obs, optimizers=()))) == []
    assert SPECS["compile"].not_in_effect(RoundWork(None, obs.compiled, 2)) is None


def test_a_step_with_no_plain_function_around_its_modules_gets_no_compile_of_functions() -> None:
    lm = LanguageModel()  # its step is a method
    steps = [0]

    def body() -> None:
        for _ in range(4):
            lm.step(torch.randint(0, 50, (2, 8)))
            steps[0] += 1

    _, outcomes, obs = run(["compile_fn"], body, steps)
    assert obs.step_functions == ()
    assert SPECS["compile_fn"].propose(Proposing({"launch_overhead": None}, obs)) == []
    assert "no plain function" in (SPECS["compile_fn"].why_not(obs, "", 4) or "")
    assert not outcomes[0].applied and "no plain function" in (outcomes[0].reason or "")
