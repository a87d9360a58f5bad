"""A first try reads well (issue 28, measured on a fresh clone on a machine with no GPU): an option after
the script is named, a run says its step count one way and each memory figure once, the profiler's
options in plain words, piped output is neither hard-wrapped nor padded, and a fix figure one stall
dominates is flagged instead of printed. (The demo's order and its CPU sections: test_cli_demo.py; the
second run said before it happens and --no-rerun: test_run_steps.py.)"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import replace
from io import StringIO
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpudoctor.analysis.summary import Analysis
from gpudoctor.cli.main import app
from gpudoctor.fixes.attempt import Attempt, verdict_of
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.stalls import stall_of
from gpudoctor.report.console import SafeConsole
from gpudoctor.report.fix_view import saving_cell
from gpudoctor.report.memory_view import render_memory_run
from gpudoctor.report.terminal import profiler_options
from gpudoctor.timing.blocks import Block, Redone
from gpudoctor.timing.paired import Pair

FIXTURES = Path(__file__).parent / "fixtures"
TRAIN = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(200):
    model(torch.randn(8, 32)).sum().backward()
    opt.step(); opt.zero_grad()
"""


def invoke(*args: str) -> object:
    return CliRunner().invoke(app, list(args))


# -- an option of gpudoctor's after the script -----------------------------------------------------------
def test_an_option_of_fix_after_the_script_is_named_with_the_right_order(tmp_path: Path) -> None:
    # GIVEN `gpudoctor fix train.py --budget 2m`: the script would get --budget 2m
    result = invoke("fix", str(tmp_path / "train.py"), "--budget", "2m", "--lr", "3e-4")
    # THEN a warning names it and the order that gives it to gpudoctor (the script's own --lr stays)
    warning = next(line for line in result.stderr.splitlines() if "warning" in line)
    assert "--budget comes after the script" in warning and "not gpudoctor fix" in warning
    assert warning.endswith(f"gpudoctor fix --budget 2m {tmp_path / 'train.py'} --lr 3e-4")


def test_no_warning_when_the_scripts_arguments_are_its_own(tmp_path: Path) -> None:
    result = invoke("fix", "--budget", "2m", str(tmp_path / "train.py"), "--lr", "3e-4")
    assert "gpudoctor fix: warning" not in result.stderr


# -- a run's step count, one way -------------------------------------------------------------------------
def test_a_run_says_its_step_count_once_and_consistently(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    out = tmp_path / "run"
    result = invoke("run", "--out", str(out), "--warmup", "2", "--warmup-seconds", "0", "--light-steps", "5",
                    "--light-seconds", "0", "--steps", "2", "--no-nvml", str(script))  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads((out / "record.json").read_text())
    analysis = Analysis.from_json(json.loads((out / "analysis.json").read_text())["analysis"])
    timed, traced = len(record["light"]["times_us"]), len(analysis.steps)
    # a first traced step the analysis sets aside as warm-up (slow under load) was traced all the same
    traced_all = traced + len(analysis.warmup_steps)
    # THEN one sentence says how many steps ran, were timed and traced, and those are the figures
    counts = re.findall(
        r"after (\d+) steps: (\d+) timed without the profiler(?: \(\d+ before them left out: not yet "
        r"settled\))?, (\d+) traced",
        result.output,
    )
    assert counts == [(str(record["steps_seen"]), str(timed), str(traced_all))]
    assert "light phase (no profiler)" not in result.output and "traced phase:" not in result.output
    assert f"{traced} steps (#" in result.output  # the step-time section agrees
    # and the profiler's options, all off here, never read as the profiler being off
    assert "profiler: off" not in result.output
    assert "torch.profiler recorded without with_stack, profile_memory, record_shapes" in result.output


# -- memory: each figure once ----------------------------------------------------------------------------
def test_the_memory_section_gives_each_category_one_figure() -> None:
    from test_memory_fixtures import CASES, analysis_of

    case = next((c for c in sorted(CASES) if c != "oom"), None)
    if case is None:
        pytest.skip("no recorded memory fixtures (tools/record_memory.py)")
    m = analysis_of(case)
    assert m.census is not None and m.breakdown is not None  # both counted: they may differ
    text = StringIO()
    render_memory_run(m, SafeConsole(file=text, width=120))
    assert len(re.findall(r"^\s*parameters\b", text.getvalue(), re.M)) == 1
    assert "counted at step" not in text.getvalue()


# -- the profiler's options in words ---------------------------------------------------------------------
def test_profiler_options_read_as_recorded_with_and_without() -> None:
    said = profiler_options({"with_stack": False, "record_shapes": True, "profile_memory": False})
    assert said == "torch.profiler recorded with record_shapes; without with_stack, profile_memory"
    assert profiler_options({"with_stack": False}) == "torch.profiler recorded without with_stack"
    assert profiler_options({}) == ""


# -- piped output ----------------------------------------------------------------------------------------
def test_piped_output_is_neither_hard_wrapped_nor_padded() -> None:
    # GIVEN output that is not a terminal (CliRunner's) WHEN a trace with long findings is analyzed
    result = invoke("analyze", str(FIXTURES / "traces" / "conv_bf16_train.json.gz"))
    lines = result.stdout.splitlines()
    # THEN no line ends in spaces (code snippets and table cells are not padded)
    assert not [line for line in lines if line.endswith(" ")]
    # and each sentence of a finding is one line, however long
    bound = next(line for line in lines if "The GPU idles" in line)
    assert len(bound) > 120 and bound.rstrip().endswith(".")
    assert all(
        len(line) <= 120 for line in lines if line.startswith(("step ", "kernel ", "op "))
    )  # tables fit


# -- a fix figure one stall dominates --------------------------------------------------------------------
def test_two_stalled_processes_of_three_are_flagged_not_a_figure() -> None:
    # GIVEN three process pairs, two candidates stalled (as under CPU contention)
    pairs = [Pair(10_000, 9_500), Pair(10_200, 540_000), Pair(9_900, 610_000)]
    why = stall_of(pairs, "process pair")
    assert why is not None and "2 candidate processes of 6" in why and "stall" in why
    # on the fix's side alone, the fix may have brought it (new shapes meeting kernels not loaded yet)
    assert "on the fix's side alone" in why and "--warmup" in why
    baseline = stall_of([Pair(10_000, 9_500), Pair(540_000, 10_200), Pair(9_900, 9_600)], "process pair")
    assert baseline is not None and "a stall of the machine, not the fix" in baseline


def test_no_stall_flag_for_a_real_slowdown_or_a_stall_that_moves_nothing() -> None:
    assert stall_of([Pair(10_000, 30_000), Pair(10_100, 31_000), Pair(9_900, 29_000)], "process pair") is None
    calm = [Pair(10_000 + 10 * i, 9_000 + 10 * i) for i in range(16)]
    assert stall_of(calm, "block pair") is None
    # a stall of the machine across both blocks of a pair: there, and the figure stands without it
    assert stall_of([*calm, Pair(60_000, 54_000)], "block pair") is None
    # ...but one stalled block alone reads as a 10-point larger saving: that is the stall's
    assert stall_of([*calm, Pair(60_000, 9_000)], "block pair") is not None


def round_of(mean_us: float) -> RoundResult:
    return RoundResult((), "completed", 0, step_times_us=(mean_us,) * 5)


def test_a_stall_dominated_fix_is_not_kept_and_its_table_cell_says_so() -> None:
    at = Attempt(("workers:2",), None, base=[round_of(m) for m in (10_000, 10_200, 9_900)],
                 runs=[round_of(m) for m in (9_500, 540_000, 610_000)], b_first=[False, True, False])  # fmt: skip
    v = verdict_of(at, 0.02)
    assert v.stalled is not None and not v.kept and v.reason == v.stalled
    assert saving_cell(v) == "stalled: no figure" and "%" not in saving_cell(v)


def test_a_fix_whose_blocks_recompiled_is_judged_on_the_blocks_timed_again_and_says_so() -> None:
    # GIVEN compile switched in blocks (8 ms against 10 ms a step), one compiled block set aside: it
    # recompiled for 20 s on a new batch shape (Lightning's epoch end on the H200 read "stalled")
    blocks = tuple(
        Block(on, 50, 50 * (8_000.0 if on else 10_000.0), (8_000.0 if on else 10_000.0,) * 50, "cuda_events")
        for _ in range(8)
        for on in (False, True)
    )
    run = RoundResult(("compile",), "stopped", 0, switch=("compile",), blocks=blocks,
                      redone=(Redone(True, 50, 20.4e6, 20.0),))  # fmt: skip
    v = verdict_of(Attempt(("compile",), None, runs=[run], in_blocks=True), 0.02)
    # THEN the figure is the blocks' (20% saved), no stall, and the verdict says what was timed again
    assert v.stalled is None and v.measured_saving_pct == pytest.approx(20.0) and v.verdict == "faster"
    assert any("1 block timed again: the process compiled inside it (20.0 s" in c for c in v.changes)


def test_a_fix_whose_processes_restarted_their_light_phase_says_so() -> None:
    # GIVEN process pairs for a worker count on top of a kept compile, one candidate process having
    # recompiled in its light phase (started again after it)
    base = [round_of(m) for m in (10_000, 10_100, 9_900)]
    runs = [round_of(m) for m in (8_000, 8_100, 7_900)]
    runs[1] = replace(runs[1], restarted_s=(19.6,))
    v = verdict_of(Attempt(("workers:8",), None, base=base, runs=runs, b_first=[False, True, False]), 0.02)
    # THEN the figure stands and the verdict says what was left out of the step times
    assert v.stalled is None and v.verdict == "faster"
    assert any("the light phase started again after a recompilation, 1 time (19.6 s" in c for c in v.changes)
