"""One round of `gpudoctor fix` (the child process's work, run here in-process on small CPU scripts):
seeded, patched, timed in the light phase, the first losses or outputs recorded, what the script does
observed, and every change undone — also when the script or a patch fails."""

from __future__ import annotations

import itertools
import sys
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from numpy.random import default_rng
from torch.nn.modules import module as nn_module
from torch.utils.data import DataLoader

from gpudoctor.fixes.child import parse, run_round
from gpudoctor.fixes.guard import numerics_of
from gpudoctor.fixes.round import RoundResult
from gpudoctor.runner import capture as live
from gpudoctor.timing.blocks import block_pairs
from gpudoctor.timing.paired import paired_compare, random_orders, sides

TRAIN = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(256, 8), torch.randint(0, 3, (256,)))
loader = DataLoader(data, batch_size=16, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
for epoch in range(5):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
        print(loss.item())
        {extra}
"""

INFER = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(8, 4).eval()
with torch.no_grad():
    for (x,) in DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=1):
        model(x)
"""


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    argv, path = sys.argv[:], sys.path[:]
    tensor = dict(vars(torch.Tensor))
    init = DataLoader.__init__
    yield
    assert sys.argv == argv and sys.path == path and live._ACTIVE is None
    assert dict(vars(torch.Tensor)) == tensor and DataLoader.__init__ is init
    assert not nn_module._global_forward_pre_hooks and not nn_module._global_forward_hooks


def child(tmp_path: Path, body: str, *options: str) -> RoundResult:
    script = tmp_path / "train.py"
    script.write_text(body)
    out = tmp_path / "round.json"
    return run_round(parse(["--out", str(out), "--warmup", "2", "--steps", "4", "--record", "3",
                            "--count-cpu-items", *options, "--", str(script)]))  # fmt: skip


def test_a_baseline_round_times_steps_records_losses_and_observes(tmp_path: Path) -> None:
    r = child(tmp_path, TRAIN.format(extra="pass"))
    assert r.failure is None and r.outcome == "stopped"
    assert len(r.step_times_us) == 4 and r.clock == "perf_counter" and r.device == "cpu"
    assert r.outputs_kind == "loss" and len(r.outputs) == 3
    obs = r.observations
    assert obs is not None and obs.root is not None
    assert (obs.root.cls, obs.root.dropout, obs.root.names) == ("Sequential", True, ("model",))
    assert obs.samples_per_step == 16 and obs.loaders[0].site is not None and obs.loaders[0].site.line == 5
    assert obs.loaders[0].taken == r.steps_seen  # a batch a step: the loader feeds the steps
    assert obs.optimizers[0].cls == "AdamW" and obs.optimizers[0].foreach is False
    assert obs.zero_grad_keep[0].site is not None and obs.zero_grad_keep[0].site.line == 11
    assert 14 in [s.site.line for s in obs.item_syncs if s.site]  # print(loss.item())
    assert obs.static_shapes
    # cuDNN's TF32 flag as the script left it (on by default); on the CPU nothing rounds at TF32
    assert obs.cudnn_tf32 is torch.backends.cudnn.allow_tf32 and not obs.tf32_baseline


def test_autocast_entered_inside_the_models_forward_is_seen_and_loosens_the_reordering_fixes_tolerance(
    tmp_path: Path,
) -> None:
    # GIVEN a model whose forward accelerate wrapped in bfloat16 autocast (the Trainer's bf16=True):
    # the root's own hooks run before autocast is entered
    wrapped = TRAIN.format(extra="pass").replace(
        "optimizer = ",
        "model.forward = torch.autocast('cpu', dtype=torch.bfloat16)(model.forward)\noptimizer = ",
    )
    r = child(tmp_path, wrapped)
    obs = r.observations
    assert r.failure is None and obs is not None and obs.root is not None
    # THEN the observer sees its layers run in bfloat16
    assert obs.root.autocast == "bfloat16" and obs.reduced_precision == "bfloat16"
    # AND a fix that only reorders the work (compile) is held to bfloat16's rounding, not float32's
    check = numerics_of(("compile",), r, r, [r], [])
    assert check.tolerance == 0.01 and "computes in bfloat16" in check.note
    # AND without the wrapper nothing is seen
    plain = child(tmp_path, TRAIN.format(extra="pass")).observations
    assert plain is not None and plain.root is not None and plain.root.autocast is None
    assert numerics_of(("compile",), r, replace(r, observations=plain), [r], []).tolerance == 0.001


def test_the_same_seed_gives_the_same_losses_and_exact_fixes_keep_them(tmp_path: Path) -> None:
    base = child(tmp_path, TRAIN.format(extra="pass"))
    again = child(tmp_path, TRAIN.format(extra="pass"))
    fixed = child(tmp_path, TRAIN.format(extra="pass"), "--fixes", "zero_grad_none,workers:1")
    assert base.outputs == again.outputs
    assert fixed.outputs == base.outputs
    assert fixed.patches["workers:1"].applied and fixed.patches["zero_grad_none"].applied
    assert fixed.observations is not None and fixed.observations.loaders[0].num_workers == 1


def test_an_inference_loop_records_its_outputs(tmp_path: Path) -> None:
    r = child(tmp_path, INFER)
    assert r.failure is None and r.outputs_kind == "output" and len(r.outputs) == 3 and len(r.outputs[0]) == 2


def test_a_script_that_raises_is_a_failed_round(tmp_path: Path) -> None:
    r = child(tmp_path, TRAIN.format(extra='raise RuntimeError("CUDA out of memory. Tried to allocate")'))
    assert r.outcome == "exception" and r.oom and r.failure is not None and "out of memory" in r.failure


def test_a_patch_that_cannot_be_applied_is_a_failed_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpudoctor.fixes.patches import backend

    def broken(self: object) -> None:
        raise RuntimeError("no such flag")

    monkeypatch.setattr(backend.TF32, "_apply", broken)
    r = child(tmp_path, TRAIN.format(extra="pass"), "--fixes", "tf32")
    assert r.outcome == "patch_failed" and "no such flag" in (r.failure or "")


def test_a_round_survives_json(tmp_path: Path) -> None:
    r = child(tmp_path, TRAIN.format(extra="pass"), "--fixes", "fused_optimizer")
    assert RoundResult.from_json(r.to_json()) == r


def test_compile_time_is_measured_apart_from_the_timed_steps(tmp_path: Path) -> None:
    r = child(tmp_path, TRAIN.format(extra="pass"), "--fixes", "compile", "--compile-backend", "eager")
    assert r.failure is None and r.patches["compile"].applied
    assert r.compile_s > 0 and r.compile_timed_s == 0.0  # compiled during the warm-up steps
    assert r.outputs_kind == "loss" and len(r.outputs) == 3


CONV = """\
import torch

model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(800, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(4, 3, 12, 12)
for step in range(10_000):
    loss = model(x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(model[0].weight.is_contiguous(), model[0].weight.is_contiguous(memory_format=torch.channels_last))
"""

BLOCKS = ("--pairs", "2", "--block-s", "0", "--block-steps", "2", "--settle", "1", "--order-seed", "1")


def test_an_in_process_ab_switches_the_fix_in_blocks_and_times_each(tmp_path: Path) -> None:
    """The candidate is on from the start (its first losses recorded so), then off for the calibration,
    and off and on in blocks, each pair's order as the seed drew it; each block a window of the same
    steps (at least two), synchronized at its ends."""
    r = child(tmp_path, CONV, "--fixes", "channels_last", "--switch", "channels_last", *BLOCKS)
    assert r.failure is None and r.switch == ("channels_last",) and r.switch_error is None
    layout = r.block_layout
    assert layout is not None and layout.seed == 1 and len(layout.calibration_us) >= 12
    assert [b.candidate for b in r.blocks] == sides(layout.b_first) == sides(random_orders(2, default_rng(1)))
    assert all(b.steps == layout.steps >= 2 and b.elapsed_us > 0 for b in r.blocks)
    assert len(r.step_times_us) == sum(b.steps for b in r.blocks)
    assert r.outputs_kind == "loss" and len(r.outputs) == 3  # recorded with the fix on, from step one
    # on from the start, off for the calibration, then each block's side where it differs
    run = [True, False, *sides(layout.b_first)]
    assert r.switches == sum(a != b for a, b in itertools.pairwise(run))
    assert RoundResult.from_json(r.to_json()) == r


def test_a_round_that_fails_before_its_first_switch_says_it_never_switched(tmp_path: Path) -> None:
    # the session does not run it again in fresh processes: every fix was on, as there
    script = TRAIN.format(
        extra="steps = globals().get('steps', 0) + 1\n"
        "        if steps == 2:\n            raise RuntimeError('the second step')"
    )
    r = child(tmp_path, script, "--fixes", "fused_optimizer", "--switch", "fused_optimizer", *BLOCKS)
    assert r.failure is not None and "the second step" in r.failure
    assert r.steps_seen <= 2 and r.switches == 0


def test_added_pairs_reach_the_block_plan_and_their_orders_are_recorded(tmp_path: Path) -> None:
    """`--extend-pairs` (the session's, where the budget has room): the schedule times that many more
    pairs where its planned ones lean to a saving undecided — on the CPU either may happen; both are
    recorded whole."""
    r = child(tmp_path, CONV, "--fixes", "channels_last", "--switch", "channels_last", *BLOCKS,
              "--extend-pairs", "2")  # fmt: skip
    layout = r.block_layout
    assert r.failure is None and layout is not None and layout.extended in (0, 2)
    assert len(layout.b_first) == 2 + layout.extended and len(r.blocks) == 2 * len(layout.b_first)
    assert [b.candidate for b in r.blocks] == sides(layout.b_first)
    assert RoundResult.from_json(r.to_json()) == r


def test_the_weights_follow_the_switch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = child(tmp_path, CONV, "--fixes", "channels_last", "--switch", "channels_last", *BLOCKS)
    assert r.failure is None
    printed = [line.split()[1] == "True" for line in capsys.readouterr().out.splitlines()]
    runs = [on for i, on in enumerate(printed) if i == 0 or on != printed[i - 1]]
    # channels_last from the start (warm-up, first losses), NCHW for the calibration, then each block's
    # (the step after each switch converts the weights)
    assert r.block_layout is not None
    sides_run = [True, False, *sides(r.block_layout.b_first)]
    assert runs == [on for i, on in enumerate(sides_run) if i == 0 or on != sides_run[i - 1]]


def test_a_fix_that_cannot_switch_is_a_failed_round_saying_so(tmp_path: Path) -> None:
    r = child(tmp_path, TRAIN.format(extra="pass"), "--fixes", "workers:2", "--switch", "workers:2", *BLOCKS)
    assert r.switch_error is not None and "cannot be switched" in r.switch_error
    assert r.failure is not None and r.failure.startswith("could not be switched in the running process")


def test_the_fused_optimizer_switches_in_blocks(tmp_path: Path) -> None:
    r = child(tmp_path, TRAIN.format(extra="pass"), "--fixes", "fused_optimizer", "--switch", "fused_optimizer",
              *BLOCKS)  # fmt: skip
    assert r.failure is None and r.switch_error is None and len(r.blocks) == 4
    assert r.patches["fused_optimizer"].applied


def test_switch_names_fixes_the_round_applies_or_forward_wrappers_of_its_baseline_alone() -> None:
    with pytest.raises(SystemExit):
        parse(["--out", "r.json", "--fixes", "tf32", "--switch", "workers:4", "--", "train.py"])
    # plain compile in CUDA graphs' place: the baseline's side alone compiles with reduce-overhead
    args = parse(
        ["--out", "r.json", "--fixes", "compile", "--switch", "compile,compile:reduce-overhead", "--", "t.py"]
    )
    assert args.switch == "compile,compile:reduce-overhead"


# -- two compiled forwards held at once ----------------------------------------------------------------------
SERVE = """\
import torch

model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
x = torch.randn(2, 8)
with torch.no_grad():
    for step in range(100_000):
        out = model(x)  # float32 as it leaves autocast: computed in bfloat16, each value is one exactly
        print(torch.bfloat16 if torch.equal(out, out.bfloat16().float()) else out.dtype)
"""


@pytest.fixture
def graphs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What Dynamo compiles through the backend "counted" (eager, as the graph was traced): each
    graph's compile mode, whether it runs under autocast, and how often it was called."""
    from torch._dynamo.backends import registry

    seen: list[dict[str, Any]] = []

    def counted(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        graph = {"mode": kwargs.get("mode", "default"), "autocast": "autocast" in gm.code, "calls": 0}
        seen.append(graph)

        def run(*args: Any) -> Any:
            graph["calls"] += 1
            return gm.forward(*args)

        return run

    monkeypatch.setitem(registry._BACKENDS, "counted", None)
    monkeypatch.setitem(registry._COMPILER_FNS, "counted", counted)
    return seen


def runs_of(values: list[Any]) -> list[Any]:
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def test_autocast_leaves_from_beneath_a_compile_that_stays_as_two_compiled_forwards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], graphs: list[dict[str, Any]]
) -> None:
    # GIVEN autocast tried on top of a kept torch.compile: compile(autocast(forward)) against compile(forward)
    ref = child(tmp_path, SERVE)
    capsys.readouterr()
    r = child(tmp_path, SERVE, "--fixes", "compile:reduce-overhead,autocast", "--switch", "autocast",
              "--compile-backend", "counted", *BLOCKS)  # fmt: skip
    assert r.failure is None and r.switch_error is None and r.switch == ("autocast",)
    # THEN the blocks alternate in the order the seed drew, each side's forward compiled once: B's
    # (under autocast) in the warm-up, A's in the untimed prewarm, neither in a timed block
    assert r.block_layout is not None and [b.candidate for b in r.blocks] == sides(r.block_layout.b_first)
    a, b = [g for g in graphs if not g["autocast"]], [g for g in graphs if g["autocast"]]
    assert len(a) == 1 and {g["mode"] for g in (*a, *b)} == {"reduce-overhead"}
    assert a[0]["calls"] >= sum(blk.steps for blk in r.blocks if not blk.candidate)
    assert b[-1]["calls"] >= sum(blk.steps for blk in r.blocks if blk.candidate)
    assert r.compile_s > 0 and r.compile_timed_s == 0.0
    # AND each step ran its side's forward: bfloat16 from the root's first call (entered under autocast
    # around it) through the warm-up, float32 for the prewarm and calibration, then each block's
    printed = [line == "torch.bfloat16" for line in capsys.readouterr().out.splitlines()]
    assert runs_of(printed) == runs_of([True, False, *sides(r.block_layout.b_first)])
    # AND the A/B is judged on the block pairs, B's first outputs against the script's as a fix's are
    assert paired_compare(block_pairs(r.blocks)).pairs == 2
    check = numerics_of(("compile:reduce-overhead", "autocast"), r, ref, [ref], [])
    assert check.ok and check.tolerance == 0.05 and check.max_rel_diff is not None and check.max_rel_diff > 0


def test_plain_compile_takes_cuda_graphs_place_as_a_second_compiled_forward(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], graphs: list[dict[str, Any]]
) -> None:
    # GIVEN plain compile tried in the place of a kept compile:reduce-overhead, autocast staying
    r = child(tmp_path, SERVE, "--fixes", "autocast,compile", "--switch", "compile,compile:reduce-overhead",
              "--compile-backend", "counted", *BLOCKS)  # fmt: skip
    assert r.failure is None and r.switch_error is None and r.fixes == ("autocast", "compile")
    # THEN both forwards run under autocast (the root's first call too), each compiled in its own mode
    # once, none in a timed block
    assert runs_of(capsys.readouterr().out.split()) == ["torch.bfloat16"]
    assert all(g["autocast"] for g in graphs)
    graphs_of = {mode: [g for g in graphs if g["mode"] == mode] for mode in ("default", "reduce-overhead")}
    assert len(graphs_of["reduce-overhead"]) == 1 and graphs_of["default"]
    assert graphs_of["reduce-overhead"][0]["calls"] >= sum(b.steps for b in r.blocks if not b.candidate)
    assert graphs_of["default"][-1]["calls"] >= sum(b.steps for b in r.blocks if b.candidate)
    assert r.compile_timed_s == 0.0 and len(r.blocks) == 4
    # AND the replaced fix is reported as what the A side ran
    assert r.patches["compile:reduce-overhead"].applied and r.patches["compile"].applied


RESHAPED = """\
import torch

torch._dynamo.config.automatic_dynamic_shapes = False  # every new shape compiles anew
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
with torch.no_grad():
    for step in range(100_000):
        rows = 3 + step - 24 if 24 <= step < 30 else 2  # a few batches of other sizes, mid-run
        model(torch.randn(rows, 8))
"""


def test_a_block_in_which_the_compiled_side_recompiled_is_timed_again(tmp_path: Path) -> None:
    # GIVEN compile switched in blocks, and batches of new sizes in the middle of the blocks (an epoch's
    # last batch: Lightning's compiled model recompiled for 20 s inside a block on the H200)
    torch._dynamo.reset()  # Sequential.forward's compiled entries from other tests: its limit would hold
    r = child(tmp_path, RESHAPED, "--fixes", "compile", "--switch", "compile", "--compile-backend", "eager",
              *BLOCKS)  # fmt: skip
    assert r.failure is None and r.switch_error is None and len(r.blocks) == 4
    # THEN the compiled side's blocks that recompiled were set aside and timed again; no compilation
    # is left in the blocks that count
    assert r.redone and all(b.candidate and b.disturbed_s > 0 for b in r.redone)
    assert all(b.elapsed_us > 1e6 * b.disturbed_s for b in r.redone)
    assert r.compile_timed_s == 0.0
    assert [b.candidate for b in r.blocks] == sides(r.block_layout.b_first) if r.block_layout else False


def test_a_light_phase_in_which_the_process_recompiled_starts_again(tmp_path: Path) -> None:
    # GIVEN a compiled round in fresh processes (no blocks) and one batch of another size in its light
    # phase: a recompilation inside the timed steps (the epoch's last batch; a kept compile under a worker
    # count's process pairs, or a script that compiles its own model)
    script = RESHAPED.replace("3 + step - 24 if 24 <= step < 30 else 2", "3 if step == 5 else 2")
    torch._dynamo.reset()  # Sequential.forward's compiled entries from other tests: its limit would hold
    r = child(tmp_path, script, "--fixes", "compile", "--compile-backend", "eager")
    assert r.failure is None and not r.blocks
    # THEN the light phase started again after it, and timed its steps with no compilation among them
    assert len(r.restarted_s) == 1 and r.restarted_s[0] > 0
    assert r.compile_timed_s == 0.0 and len(r.step_times_us) == 4
    assert max(r.step_times_us) < 1e6 * r.restarted_s[0]


def test_pinned_batches_on_top_of_workers_are_timed_in_blocks(tmp_path: Path) -> None:
    # GIVEN pinned batches tried on top of kept loader workers (no accelerator here: the loader cannot
    # pin, and says so; the switching and the blocks are what is checked). Each block settles the
    # batches made ahead first (2 workers × 4 + 1 steps): the four blocks need about 80 steps, so the
    # script runs ten epochs, not five (at five, one step more of warm-up on a slow host ended it early)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = child(tmp_path, TRAIN.format(extra="pass").replace("range(5)", "range(10)"), "--fixes", "workers:2,pin_memory", "--switch",
                  "pin_memory", *BLOCKS)  # fmt: skip
    # THEN the blocks ran in one process, switched at their boundaries
    assert r.failure is None and r.switch_error is None and r.switch == ("pin_memory",)
    assert r.block_layout is not None and [b.candidate for b in r.blocks] == sides(r.block_layout.b_first)
    assert r.patches["workers:2"].applied and r.patches["pin_memory"].applied


def test_float16_autocast_records_the_loss_before_it_is_scaled(tmp_path: Path) -> None:
    ref = child(tmp_path, TRAIN.format(extra="pass"))
    r = child(tmp_path, TRAIN.format(extra="pass"), "--fixes", "autocast:float16")
    assert r.failure is None and r.patches["autocast:float16"].changes[0].endswith("with loss scaling")
    # scaled, the losses recorded would be 65,536 times the script's
    check = numerics_of(("autocast:float16",), r, ref, [ref], [])
    assert check.ok and check.max_rel_diff is not None and check.max_rel_diff < 0.05


def test_float16_autocast_with_loss_scaling_cannot_leave_from_beneath_compile(tmp_path: Path) -> None:
    r = child(tmp_path, TRAIN.format(extra="pass"), "--fixes", "compile,autocast:float16", "--switch",
              "autocast:float16", "--compile-backend", "eager", *BLOCKS)  # fmt: skip
    assert r.switch_error is not None and "loss scaling" in r.switch_error
    assert r.failure is not None and r.failure.startswith("could not be switched in the running process")


def test_a_model_the_script_compiles_and_runs_under_autocast_is_seen_so(tmp_path: Path) -> None:
    from gpudoctor.fixes.applies import why_not

    # GIVEN a script that compiles its model and calls it under bfloat16 autocast (a compiled root hides
    # its layers from the observer's hooks: the autocast is seen at the call)
    body = TRAIN.format(extra="pass").replace(
        "optimizer = torch.optim", "model = torch.compile(model, backend='eager')\noptimizer = torch.optim"
    ).replace("        loss = torch.nn.functional", "        with torch.autocast('cpu', dtype=torch.bfloat16):\n            loss = torch.nn.functional")  # fmt: skip
    r = child(tmp_path, body)
    root = r.observations.root if r.observations else None
    # THEN neither compile nor autocast is tried on it: both are the script's already
    assert r.failure is None and root is not None and root.compiled and root.autocast == "bfloat16"
    assert root.cls == "Sequential"  # the compiled module's own class, not OptimizedModule
    assert why_not("compile", r.observations, r.steps_seen) is not None
    assert why_not("autocast", r.observations, r.steps_seen) is not None


PERSISTENT = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 3, (256,)))
    loader = DataLoader(data, batch_size=16, num_workers=1, persistent_workers=True)
    model = torch.nn.Linear(8, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    for epoch in range(100):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""


def test_a_stopped_scripts_persistent_loader_workers_end_with_the_round(tmp_path: Path) -> None:
    import multiprocessing

    # GIVEN a main() whose DataLoader keeps its worker between epochs, stopped by the round mid-epoch
    r = child(tmp_path, PERSISTENT)
    # THEN its worker has shut down by the round's end, as at the script's own end: not held (by the
    # observer) until the interpreter's exit, where multiprocessing terminates it and the worker's
    # pymp-* folder stays in the temp directory (one per round of `gpudoctor fix`)
    assert r.failure is None and r.outcome == "stopped"
    assert r.observations is not None and r.observations.loaders[0].num_workers == 1
    assert multiprocessing.active_children() == []


TWO_MODULES_IN_A_FUNCTION = """\
import torch

body, head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD([*body.parameters(), *head.parameters()], lr=0.01)
x = torch.randn(32, 8)


def forward(x):
    return head(torch.relu(body(x))).square().mean()


for step in range(10_000):
    loss = forward(x)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_the_function_that_calls_both_modules_is_compiled_in_the_scripts_own_namespace(
    tmp_path: Path,
) -> None:
    r = child(tmp_path, TWO_MODULES_IN_A_FUNCTION, "--fixes", "compile_fn", "--compile-backend", "eager")
    assert r.failure is None and r.outcome == "stopped"
    # THEN the script's `forward` was found, bound to its compiled form there, and ran compiled
    assert r.observations is not None
    assert [(f.name, f.line) for f in r.observations.step_functions] == [("forward", 8)]
    outcome = r.patches["compile_fn"]
    assert outcome.applied and outcome.changes == ("forward() compiled",)
    assert [(e.op, e.name, e.line) for e in outcome.edits] == [("after_definition", "forward", 8)]
    assert r.compile_s > 0 and r.observations.compiled is not None and r.observations.compiled.graphs >= 1
