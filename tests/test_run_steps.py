"""`gpudoctor run` finds the step of every kind of loop without help, on the CPU: training loops
(optimizer steps, also with closures, gradient accumulation, two optimizers), inference loops (one call
of the root module), generate-style loops (the outer call), DataLoader loops without a model, loops of
plain tensor ops, compiled models, the frameworks (Lightning, the Hugging Face Trainer, accelerate); a
stronger source seen later takes over; a script too short for the phases is traced all the same."""

from __future__ import annotations

import json
import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from gpudoctor.analysis.summary import Analysis
from gpudoctor.cli.main import app
from gpudoctor.runner import capture as live
from gpudoctor.runner.discovery import KEEP_ENDS
from gpudoctor.runner.discovery import Observations as discovery_observations
from gpudoctor.runner.discovery import decide as discovery_decide
from gpudoctor.runner.loops import LoopKey
from gpudoctor.runner.record import RunRecord
from run_options import FAST


def run_script(tmp_path: Path, body: str, *options: str, name: str = "script.py") -> tuple[RunRecord, str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["run", "--out", str(out), *FAST, *options, str(path)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return RunRecord.from_json(json.loads((out / "record.json").read_text())), result.output


def analysis_of(tmp_path: Path) -> Analysis:
    return Analysis.from_json(json.loads((tmp_path / "run" / "analysis.json").read_text())["analysis"])


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Every hook gpudoctor puts in for discovery is gone afterwards: optimizer and module hooks, the
    DataLoader stand-in, the loop watcher, the SIGALRM handler and timer."""
    from torch.nn.modules import module
    from torch.optim import optimizer
    from torch.utils.data import dataloader

    before = (
        dict(optimizer._global_optimizer_pre_hooks),
        dict(optimizer._global_optimizer_post_hooks),
        dict(module._global_forward_pre_hooks),
        dict(module._global_forward_hooks),
        dataloader._BaseDataLoaderIter.__next__,
        sys.gettrace(),
        signal.getsignal(signal.SIGALRM),
        _compile_callbacks(),
    )
    yield
    after = (
        dict(optimizer._global_optimizer_pre_hooks),
        dict(optimizer._global_optimizer_post_hooks),
        dict(module._global_forward_pre_hooks),
        dict(module._global_forward_hooks),
        dataloader._BaseDataLoaderIter.__next__,
        sys.gettrace(),
        signal.getsignal(signal.SIGALRM),
        _compile_callbacks(),
    )
    assert after == before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert live._ACTIVE is None and not torch.autograd.profiler._is_profiler_enabled
    if sys.version_info >= (3, 12):
        assert all(sys.monitoring.get_tool(t) != "gpudoctor" for t in range(6))


def _compile_callbacks() -> tuple[int, int]:
    from torch._dynamo.callback import callback_handler

    return len(callback_handler.start_callbacks), len(callback_handler.end_callbacks)


MLP = "torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))"


def test_a_training_loop_steps_at_each_optimizer_step(tmp_path: Path) -> None:
    record, output = run_script(
        tmp_path,
        f"""
        import torch
        model = {MLP}
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(60):
            loss = model(torch.randn(8, 32)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        """,
    )
    assert record.step is not None and record.step.source == "optimizer"
    assert "step = one step of the optimizer (SGD.step)" in output
    assert record.step.calls_per_step == pytest.approx(1.0)


def test_gradient_accumulation_counts_one_step_per_optimizer_step(tmp_path: Path) -> None:
    record, output = run_script(
        tmp_path,
        f"""
        import torch
        model = {MLP}
        opt = torch.optim.AdamW(model.parameters())
        for i in range(160):
            (model(torch.randn(8, 32)).sum() / 4).backward()
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()
        """,
    )
    assert record.step is not None and record.step.source == "optimizer"
    assert record.step.calls_per_step == pytest.approx(4.0)  # four micro-batches in each step
    # the module called in the step is named, though the step is the optimizer's
    assert record.step.module == "Sequential" and "4.0 calls of Sequential.forward per step" in output


def test_two_optimizers_make_one_step(tmp_path: Path) -> None:
    record, _ = run_script(
        tmp_path,
        f"""
        import torch
        gen, disc = {MLP}, {MLP}
        opt_g = torch.optim.Adam(gen.parameters())
        opt_d = torch.optim.Adam(disc.parameters())
        for i in range(60):
            disc(torch.randn(8, 32)).sum().backward()
            opt_d.step(); opt_d.zero_grad()
            gen(torch.randn(8, 32)).sum().backward()
            opt_g.step(); opt_g.zero_grad()
        """,
    )
    assert record.step is not None and record.step.source == "optimizer"
    assert record.steps_seen <= 60  # the first optimizer to step leads: one boundary per iteration


def test_an_lbfgs_closure_is_not_optimizer_time(tmp_path: Path) -> None:
    record, _ = run_script(
        tmp_path,
        f"""
        import torch
        model = {MLP}
        opt = torch.optim.LBFGS(model.parameters(), max_iter=2)
        x, y = torch.randn(64, 32), torch.randint(0, 4, (64,))
        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            return loss
        for i in range(40):
            opt.step(closure)
        """,
    )
    assert record.step is not None and record.step.source == "optimizer"
    analysis = analysis_of(tmp_path)
    for step in analysis.steps:
        # the closure (forward, backward) runs inside Optimizer.step and is left out of its time
        assert 0 < step.cpu.optimizer_us < 0.9 * step.cpu.duration_us


def test_an_inference_loop_steps_at_each_call_of_the_model(tmp_path: Path) -> None:
    record, output = run_script(
        tmp_path,
        f"""
        import torch
        model = {MLP}.eval()
        with torch.inference_mode():
            for i in range(80):
                y = model(torch.randn(16, 32))
        """,
    )
    assert record.step is not None and record.step.source == "module"
    assert "step = one call of Sequential.forward" in output
    # the trace carries it: the analysis (and every report) says how the marked steps were found
    source = analysis_of(tmp_path).steps_source
    assert (
        source is not None
        and "gpudoctor run: one step = one call of Sequential.forward" in source.description
    )
    names = {e for e in _annotations(tmp_path) if e.startswith("gpudoctor.module: ")}
    assert {"gpudoctor.module: Sequential", "gpudoctor.module: 0", "gpudoctor.module: 2"} <= names


def test_a_model_called_from_the_users_own_function_is_still_the_step(tmp_path: Path) -> None:
    record, _ = run_script(
        tmp_path,
        f"""
        import torch
        model = {MLP}.eval()
        def predict(x):
            with torch.no_grad():
                return model(x).argmax(-1)
        for i in range(80):
            predict(torch.randn(16, 32))
        """,
    )
    assert record.step is not None and record.step.source == "module"


def test_a_compiled_model_is_found_by_its_calls(tmp_path: Path) -> None:
    record, output = run_script(
        tmp_path,
        f"""
        import torch
        model = torch.compile({MLP}.eval(), backend="eager")
        with torch.no_grad():
            for i in range(80):
                model(torch.randn(16, 32))
        """,
    )
    assert record.step is not None and record.step.source == "module"
    assert "one call of Sequential (torch.compile).forward" in output
    assert any("no module view" in note for note in record.notes)


def test_hugging_face_generate_in_a_loop_is_one_step_per_generate_call(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    record, output = run_script(
        tmp_path,
        """
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64)
        model = GPT2LMHeadModel(config).eval()
        prompt = torch.randint(0, 100, (1, 4))
        for i in range(30):
            model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
        """,
    )
    assert record.step is not None and record.step.source == "call"
    assert record.step.description.startswith("one call of GPT2LMHeadModel.generate")
    assert record.step.calls_per_step == pytest.approx(6.0)  # one forward per new token
    assert "calls of GPT2LMHeadModel.forward per step" in output


def test_a_dataloader_loop_without_a_model_steps_at_each_batch(tmp_path: Path) -> None:
    record, _ = run_script(
        tmp_path,
        """
        import time
        import torch
        data = torch.utils.data.TensorDataset(torch.randn(4000, 16))
        loader = torch.utils.data.DataLoader(data, batch_size=8)
        total = 0.0
        for (x,) in loader:
            total += float((x @ x.T).sum())
            time.sleep(0.002)
        """,
    )
    assert record.step is not None and record.step.source == "dataloader"


def test_a_loop_of_plain_tensor_ops_steps_at_each_iteration(tmp_path: Path) -> None:
    record, output = run_script(
        tmp_path,
        """
        import torch
        a, w = torch.randn(128, 128), torch.randn(128, 128)
        for i in range(3000):
            a = torch.tanh(a @ w)
            for j in range(3):
                a = a * 0.5
        """,
    )
    assert record.step is not None and record.step.source == "loop"
    assert "one iteration of the loop at script.py:4" in output  # the outer loop, not the inner


def test_validation_calls_first_then_training_steps_start_again(tmp_path: Path) -> None:
    record, _ = run_script(
        tmp_path,
        f"""
        import torch
        model = {MLP}
        with torch.no_grad():  # a short validation before training (Lightning's sanity check)
            for i in range(4):
                model(torch.randn(8, 32))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(60):
            model(torch.randn(8, 32)).sum().backward()
            opt.step(); opt.zero_grad()
        """,
    )
    assert record.step is not None and record.step.source == "optimizer"
    assert any("started again" in note for note in record.notes)


def test_a_script_too_short_for_the_phases_is_run_again_to_fit(tmp_path: Path) -> None:
    """... and the second run's memory does not count the first run's model: its objects live on in
    reference cycles (the script's functions hold its globals) until they are collected."""
    record, output = run_script(
        tmp_path,
        f"""
        import builtins, weakref
        import torch
        runs = builtins.__dict__.setdefault("_gpudoctor_test_runs", [])
        print("alive from earlier runs:", sum(r() is not None for r in runs))
        model = {MLP}
        runs.append(weakref.ref(model))
        def step():  # a function: the script's globals are in a cycle
            model(torch.randn(8, 32)).sum().backward()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(7):
            step()
            opt.step(); opt.zero_grad()
        print("ran")
        """,
        "--warmup",
        "3",
        "--light-steps",
        "20",
    )
    import builtins

    builtins.__dict__.pop("_gpudoctor_test_runs", None)
    assert "running it once more" in output and output.count("ran") >= 2
    assert record.trace_files and (tmp_path / "run" / "analysis.json").exists()
    assert record.light is not None and record.light.times_us
    assert "alive from earlier runs: 0" in output and "alive from earlier runs: 1" not in output


SHORT_SCRIPT = f"""
import torch
model = {MLP}
opt = torch.optim.SGD(model.parameters(), lr=0.1)
print("SIDE-EFFECT-MARK")
for i in range(7):
    model(torch.randn(8, 32)).sum().backward()
    opt.step(); opt.zero_grad()
"""


def test_a_second_run_is_announced_before_it_happens_with_the_way_to_avoid_it(tmp_path: Path) -> None:
    # GIVEN a script too short for its phases WHEN it is run
    _, output = run_script(tmp_path, SHORT_SCRIPT, "--warmup", "3", "--light-steps", "20")
    # THEN the notice comes between the first run's output and the second's, says that its output and
    # side effects happen again, and names --no-rerun
    first, notice, second = output.partition("running it once more")
    assert first.count("SIDE-EFFECT-MARK") == 1 and second.count("SIDE-EFFECT-MARK") == 1 and notice
    assert "its output and side effects happen again (--no-rerun: not)" in second.splitlines()[0]


def test_no_rerun_runs_a_short_script_once(tmp_path: Path) -> None:
    record, output = run_script(tmp_path, SHORT_SCRIPT, "--warmup", "3", "--light-steps", "20", "--no-rerun")
    assert output.count("SIDE-EFFECT-MARK") == 1
    assert "before anything was traced (--no-rerun: not run again)" in output
    assert not record.trace_files and not (tmp_path / "run" / "analysis.json").exists()


def test_a_script_of_a_few_steps_is_traced_whole(tmp_path: Path) -> None:
    record, output = run_script(
        tmp_path,
        f"""
        import torch
        model = {MLP}
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(3):
            model(torch.randn(8, 32)).sum().backward()
            opt.step(); opt.zero_grad()
        """,
    )
    assert "traced from start to end" in output
    assert record.trace_files and record.outcome == "completed"


def _annotations(tmp_path: Path) -> set[str]:
    import gzip

    with gzip.open(tmp_path / "run" / "trace.json.gz") as f:
        doc = json.load(f)
    return {e["name"] for e in doc["traceEvents"] if e.get("cat") == "user_annotation"}


def test_a_replay_loop_after_the_models_calls_becomes_the_step(tmp_path: Path) -> None:
    # A CUDA graph is captured from a few calls of the model and then replayed in a loop: the calls stop,
    # the script's loop runs on, and that loop is the step (here plain ops stand in for the replay).
    record, _ = run_script(
        tmp_path,
        f"""
        import torch
        model = {MLP}.eval()
        x = torch.randn(16, 32)
        with torch.no_grad():
            for i in range(5):
                model(x)
        a, w = torch.randn(256, 256), torch.randn(256, 256) / 16
        for i in range(100000):
            a = torch.tanh(a @ w)
        """,
    )
    assert record.step is not None and record.step.source == "loop"
    assert "one iteration of the loop at script.py:9" in record.step.description


def test_when_nothing_repeats_the_steps_are_timed_windows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpudoctor.runner import discovery

    monkeypatch.setattr(discovery, "WINDOW_AFTER_S", 0.5)
    record, output = run_script(
        tmp_path,
        """
        import torch
        a = torch.randn(128, 128)
        def work(_):
            return float((a @ a).sum())
        total = sum(map(work, range(200000)))  # no loop in the script's own code, no model
        """,
    )
    assert record.step is not None and record.step.source == "window"
    assert "window" in output and record.trace_files


def test_a_first_step_that_compiles_longer_than_discovery_waits_is_not_nothing_repeating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN discovery that falls back to windows after 0.5 s of nothing repeating, and a script whose
    # first step compiles for 2 s (a big model under torch.compile: GPT-2's took over 20 s on the H100)
    from gpudoctor.runner import discovery

    monkeypatch.setattr(discovery, "WINDOW_AFTER_S", 0.5)
    record, output = run_script(
        tmp_path,
        """
        import time
        import torch

        def slow_backend(graph, inputs):
            time.sleep(2.0)
            return graph.forward

        model = torch.nn.Linear(8, 1)
        loss_of = torch.compile(lambda x: model(x).sum(), backend=slow_backend)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(100000):
            loss_of(torch.randn(4, 8)).backward()
            optimizer.step()
            optimizer.zero_grad()
        """,
    )
    # THEN the compilation does not count as nothing repeating: the step is the optimizer's, found once
    assert record.step is not None and record.step.source == "optimizer"
    assert "window" not in output and not any("started again" in n for n in record.notes)


def test_a_plain_loop_while_an_optimizer_waits_for_its_first_step_is_set_up_not_the_step() -> None:
    # GIVEN a plain loop iterating every millisecond for 3 s (a dataset built in Python)
    obs = discovery_observations(start=0.0)
    for i in range(3000):
        obs.add_iteration(LoopKey("data.py", "build", 12), i / 1000)
    found = discovery_decide(obs, now=3.0)
    # THEN alone it is the step; with an optimizer built it is not, until the model or the optimizer
    # had long enough to show
    assert found is not None and found.source == "loop"
    obs.optimizers = 1
    assert discovery_decide(obs, now=3.0) is None
    late = discovery_decide(obs, now=61.0)
    assert late is not None and late.source == "loop"


def test_a_loop_seen_a_million_times_costs_discovery_what_one_seen_a_hundred_times_does() -> None:
    # GIVEN an inner loop of a dataset built in Python (a comprehension, every microsecond) inside an
    # outer one (every 100 microseconds), seen for a second
    obs = discovery_observations(start=0.0)
    inner, outer = LoopKey("data.py", "build", 14), LoopKey("data.py", "build", 12)
    for i in range(1_000_000):
        obs.add_iteration(inner, i / 1e6)
        if i % 100 == 99:
            obs.add_iteration(outer, i / 1e6)
    # THEN each keeps only its latest iterations, and its first: what decide reads does not grow
    assert all(len(ends) <= 2 * KEEP_ENDS for ends in obs.loops.values())
    assert obs.first_end == {inner: 0.0, outer: 99 / 1e6}
    assert obs.loops[inner][-1] == 999_999 / 1e6
    # and the outer loop is the step, on the period of its latest iterations
    found = discovery_decide(obs, now=3.0)
    assert found is not None and found.loop == outer


def test_a_dataset_built_in_a_loop_after_the_optimizer_leaves_the_training_step_to_the_optimizer(
    tmp_path: Path,
) -> None:
    record, _ = run_script(
        tmp_path,
        f"""
        import random, time
        import torch
        model = {MLP}
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        items = []
        until = time.perf_counter() + 3
        while time.perf_counter() < until:
            items.append([random.random() for _ in range(32)])
        data = torch.tensor(items[:512])
        for i in range(60):
            loss = model(data[:8]).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        """,
    )
    assert record.step is not None and record.step.source == "optimizer"


def test_compilation_does_not_count_towards_the_window_fallback() -> None:
    obs = discovery_observations(start=0.0)
    assert discovery_decide(obs, now=25.0, compile_s=10.0) is None  # 15 s of the script's own time
    found = discovery_decide(obs, now=25.0)
    assert found is not None and found.source == "window"


def test_short_steps_are_timed_in_groups_so_the_marks_cost_stays_out() -> None:
    from gpudoctor.timing.stepclock import StepClock

    clock = StepClock(cuda=False, every=4)
    for _ in range(9):
        clock.boundary()
    times = clock.spans()
    assert len(clock.marks) == 3 and clock.timed_steps == 8  # marks at boundaries 1, 5 and 9
    assert len(times.times_us) == 8 and len(set(times.times_us[:4])) == 1  # each mark: the mean of 4 steps
    assert times.mean_us == pytest.approx((clock.marks[-1] - clock.marks[0]) / 8)


def test_step_numbers_count_the_scripts_iterations_after_discovery() -> None:
    """Discovery watches a few calls of the model before it decides; the steps after it still carry
    the script's iteration numbers (the memory record pairs them with the script's own figures)."""
    from gpudoctor.runner.steps import StepDetector

    model = torch.nn.Linear(8, 8)
    boundaries: list[int] = []
    detector = StepDetector(lambda: boundaries.append(1)).install()
    try:
        for _ in range(40):
            model(torch.randn(2, 8))
    finally:
        detector.uninstall()
    assert detector.definition is not None and detector.definition.source == "module"
    assert detector.first_step > 1  # it did watch some calls first
    # a boundary at the start of every call after the deciding one: the last ends iteration 39
    assert detector.first_step + len(boundaries) - 1 == 39


def test_a_recompilation_inside_the_light_phase_starts_it_again(tmp_path: Path) -> None:
    # GIVEN a compiled model that meets one batch of another size while its light phase times it (an
    # epoch's last, smaller batch: 19.6 s of recompilation in one window on the H200)
    torch._dynamo.reset()
    record, _ = run_script(
        tmp_path,
        f"""
        import torch
        torch._dynamo.config.automatic_dynamic_shapes = False
        model = torch.compile({MLP}.eval(), backend="eager")
        with torch.no_grad():
            for i in range(60):
                model(torch.randn(15 if i == 4 else 16, 32))
        """,
        "--light",
    )
    # THEN the light phase started again after it and says so; its steps hold no compilation
    assert record.light is not None and len(record.light.times_us) >= 3
    assert any(n.startswith("the light phase started again after a recompilation") for n in record.notes)


def test_the_module_view_goes_as_deep_as_the_run_labelled_the_modules(tmp_path: Path) -> None:
    body = f"""
        import torch
        model = torch.nn.Sequential(torch.nn.Sequential({MLP}), torch.nn.ReLU())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(400):
            model(torch.randn(8, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
        """
    for depth in (1, 3):
        run_script(tmp_path, body, "--module-depth", str(depth))
        view = analysis_of(tmp_path).modules
        assert view is not None and view.depth == depth


def test_a_model_compiled_in_place_is_timed_without_breaking_its_graph(tmp_path: Path) -> None:
    # GIVEN `model.compile()`: every call of the model, gpudoctor's global module hooks included, runs
    # inside the graph (run in this process: dynamo's counters are this test's)
    from torch._dynamo.utils import counters

    counters.clear()
    record, _ = run_script(
        tmp_path,
        f"""
        import torch
        model = {MLP}.eval()
        model.compile(backend="eager")
        with torch.no_grad():
            for i in range(3000):
                model(torch.randn(16, 32))
        """,
    )
    # THEN the model's calls are the step, seen from outside the graph (`Module.compile` wraps the call
    # it compiles while gpudoctor watches; before, the step fell back to the loop), and the hooks, traced,
    # fold away: no graph break (dynamo stopped at sys._getframe in the root watcher before, and warned on
    # the user's stderr)
    assert record.step is not None and record.step.source == "module", record.step
    assert record.step.module == "Sequential" and record.light is not None and len(record.light.times_us) >= 3
    assert counters["frames"]["ok"] > 0 and not counters["graph_break"]


def test_a_compiled_optimizer_step_is_not_recompiled_by_the_step_hooks(tmp_path: Path) -> None:
    # GIVEN PyTorch's recipe for a compiled optimizer step: torch's global step hooks, gpudoctor's
    # among them, run inside the compiled function
    import runpy

    from torch._dynamo.utils import counters

    body = """
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        x = torch.randn(256, 64)

        @torch.compile(backend="eager")
        def step():
            opt.step()

        for i in range(300):
            model(x).sum().backward()
            step()
            opt.zero_grad()
        """
    plain = tmp_path / "plain.py"
    plain.write_text(textwrap.dedent(body))
    torch._dynamo.reset()
    counters.clear()
    runpy.run_path(str(plain), run_name="__main__")
    plain_frames, plain_breaks = counters["frames"]["total"], set(counters["graph_break"])
    torch._dynamo.reset()  # the optimizer's code objects compiled afresh for the script's own optimizer
    counters.clear()
    record, _ = run_script(tmp_path, body)
    # THEN the steps are found, and dynamo compiles about what it does for the plain script (a few more
    # frames: the hooks put in and taken out change what its guards check) where the hooks, traced,
    # recompiled it at nearly every step (646 frames for the plain script's 10) and broke its graph
    assert record.step is not None
    assert counters["frames"]["total"] <= 2 * plain_frames
    assert set(counters["graph_break"]) <= plain_breaks
