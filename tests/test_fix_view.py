"""`gpudoctor fix`'s table in the terminal reads well at any width: piped to a log (120 columns) the
reason column was squeezed to one character, every reason printed a letter per line. Now the fix's name
and the reason wrap at words, the figures are never cut, and where the reason has too little room beside
them it goes on its own line under its row (narrower still: one block of lines per fix)."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from rich.console import Console

from gpudoctor.fixes.result import FixReport, FixVerdict
from gpudoctor.fixes.verify import NumericsCheck
from gpudoctor.report.console import SafeConsole
from gpudoctor.report.fix_view import fix_table_layout, render_fix_terminal, rows, saving_cell


def numerics(diff: float, tolerance: float | None, ok: bool) -> NumericsCheck:
    return NumericsCheck("loss", 5, diff, tolerance, 1e-7, ok, "")


def verdict(fix: str, title: str, predicted: float | None, measured: tuple[float, float, float] | None,
            check: NumericsCheck | None, kept: bool, reason: str) -> FixVerdict:  # fmt: skip
    saving, low, high = measured or (None, None, None)
    return FixVerdict(
        fix=fix, title=title, rules=("rule",), predicted_saving_pct=predicted, measured_saving_pct=saving,
        ci_low_pct=low, ci_high_pct=high, p_value=0.01, verdict="faster" if kept else "same",
        baseline_us=12_000.0, candidate_us=2_300.0, per_sample=False, numerics=check, compile_s=None,
        payback_steps=None, kept=kept, reason=reason, changes=(), rounds=4,
    )  # fmt: skip


REPORT = FixReport(
    argv=("train.py", "--epochs", "1"), started_at="2026-01-01T00:00:00Z", device="NVIDIA H100 80GB HBM3",
    torch="2.5.1", options={}, baseline_us=12_345.0, baseline_rounds=4, observations=None,
    verdicts=(
        verdict("workers:32", "DataLoader workers (32)", 79.5, (81.5, 81.2, 81.7), numerics(1.3e-6, 1e-5, True),
                True, "faster beyond noise"),
        verdict("workers:16", "DataLoader workers (16)", 79.5, (80.9, 80.1, 81.4), numerics(1.3e-6, None, False),
                False, "changes results: loss differs by 0.00013% from the baseline, beyond the noise floor"),
        verdict("autocast", "bfloat16 autocast", 30.0, (1.2, -3.4, 5.1), numerics(0.02, 0.05, True), False,
                "no significant difference (too noisy to tell: 95% CI of the saving -3.4% to +5.1%)"),
        verdict("pin_memory", "pin_memory=True", 5.0, None, None, False, "not timed"),
    ),
    combination=verdict("workers:16+autocast", "DataLoader workers (16) + bfloat16 autocast", 85.0,
                        (82.0, 81.0, 83.0), numerics(0.01, 0.05, True), False, "slower beyond noise"),
    final=("workers:32",), final_saving_pct=81.5, diff="", snippets=(), unplaced=(), manual=(), calibration=(),
    notes=(), complete=True, interrupted=False, elapsed_s=60.0,
)  # fmt: skip
VERDICTS = [v for v, _ in rows(REPORT)]


def rendered(width: int, console: type[Console]) -> str:
    out = StringIO()
    # as `gpudoctor fix ... > log` prints it (SafeConsole, soft-wrapped) and as rich does by default
    options = {"soft_wrap": True} if console is SafeConsole else {}
    render_fix_terminal(
        REPORT, console(file=out, width=width, force_terminal=False, color_system=None, **options)
    )
    return out.getvalue()


def reasons_column(text: str) -> str:
    """The reasons as printed, each line's part from the column they start in, joined."""
    lines = [line.rstrip() for line in text.splitlines()]
    head = next((i for i, line in enumerate(lines) if re.fullmatch(r"fix .* why", line)), None)
    if head is not None:  # a column of the table
        x = lines[head].rindex("why")
        return " ".join(line[x:] for line in lines[head + 1 :])
    # a line under each fix, `    why: ` and its wrapped lines under the first word
    return " ".join(line[9:] for line in lines if line.startswith("    why: ") or line.startswith(" " * 9))


def words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("console", [SafeConsole, Console])
@pytest.mark.parametrize("width", [80, 100, 120, 160, 60])
def test_every_reason_reads_in_whole_words_at_any_width(width: int, console: type[Console]) -> None:
    # GIVEN a report of five fixes, the combination's name and some reasons long WHEN printed in `width`
    # columns
    text = rendered(width, console)
    lines = text.splitlines()
    # THEN no line is a lone character (a reason squeezed into a column one character wide)
    assert not [line for line in lines if len(line.strip()) == 1], text
    # AND every reason reads whole, in its column or on its own line
    column = words(reasons_column(text))
    for v in VERDICTS:
        assert words(v.reason) in column, (v.reason, text)
    # AND every figure is printed whole, none cut
    for v in VERDICTS:
        assert saving_cell(v) in text, text
    assert "0.00013% (too far)" in text and "0.00013% ≤ 0.001%" in text
    # AND the table stays short: a few lines per fix, not one per letter
    assert len(lines) < 10 * len(VERDICTS), text
    # AND no line is wider than the console (but the headline, one line where the console soft-wraps)
    assert max(len(line.rstrip()) for line in lines if not line.startswith("  NVIDIA")) <= width, text


def test_the_reason_is_a_column_where_it_fits_and_a_line_under_its_row_where_not() -> None:
    cells = [c for _, c in rows(REPORT)]
    assert fix_table_layout(cells, 240)[0] == "table"
    assert fix_table_layout(cells, 120)[0] == "table"  # `gpudoctor fix ... > log`: PIPE_WIDTH
    assert fix_table_layout(cells, 80)[0] == "reason below"
    assert fix_table_layout(cells, 60)[0] == "blocks"
    # wide enough, each fix is one line under the headers
    lines = rendered(240, SafeConsole).splitlines()
    assert len(lines) == 4 + len(VERDICTS)
    assert words(lines[3]) == "fix predicted saving measured saving (95% CI) numerics why"
    # at 80 columns, the reason is on the line under the figures
    lines = rendered(80, SafeConsole).splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("bfloat16 autocast "))
    assert lines[row].split()[-1] == "reverted"
    assert lines[row + 1].startswith("    why: no significant difference")


def test_a_loader_fix_held_only_to_stay_finite_is_not_called_too_far() -> None:
    from gpudoctor.report.fix_view import numerics_cell

    # judged on speed (no tolerance), finite: its difference is shown, not held against it
    assert numerics_cell(numerics(1.3e-6, None, True)) == "0.00013% (finite)"
    assert numerics_cell(numerics(1.3e-6, None, False)) == "0.00013% (too far)"
    assert numerics_cell(numerics(0.002, 0.01, True)) == "0.2% ≤ 1%"


def test_a_script_that_timed_no_step_gets_no_baseline_figure_and_no_empty_table() -> None:
    from dataclasses import replace

    from gpudoctor.report.fix_view import headline, render_fix_markdown, status_cell

    # GIVEN a script that failed before its first timed step (a syntax error, a crash in its set-up)
    failed = replace(REPORT, baseline_us=None, baseline_rounds=0, verdicts=(), combination=None, final=(),
                     final_saving_pct=None, notes=("the baseline did not run: exception: RuntimeError: NaN",))  # fmt: skip
    out = StringIO()
    render_fix_terminal(failed, Console(file=out, width=120, force_terminal=False, color_system=None))
    text = out.getvalue()
    # THEN it says nothing was measured, not "baseline n/a over 0 processes; no fix was faster"
    assert "nothing was measured" in headline(failed) and "n/a" not in text and "0 processes" not in text
    assert "predicted" not in text and "| fix |" not in render_fix_markdown(failed)  # no empty table
    assert "the baseline did not run: exception: RuntimeError: NaN" in text
    # AND one process is one process; a fix never applied was not run, not reverted
    assert "over 1 process;" in headline(replace(REPORT, baseline_rounds=1, baseline_spread_pct=None))
    never = replace(REPORT.verdicts[3], verdict=None, rounds=0, reason="does not apply: no CUDA device")
    assert status_cell(never) == "not run" and status_cell(REPORT.verdicts[2]) == "reverted"
    late = replace(never, reason="the time budget ran out after 0 of 4 rounds")
    failed = replace(never, reason="exception: RuntimeError: CUDA out of memory")  # applied, and it failed
    assert status_cell(late) == "not run" and status_cell(failed) == "reverted"


def test_a_fix_not_kept_has_no_payback_and_nothing_tried_is_not_nothing_faster() -> None:
    from dataclasses import replace

    from gpudoctor.report.fix_view import compile_lines, headline

    compiled = replace(REPORT.verdicts[2], compile_s=3.1, payback_steps=66_589.0)  # autocast, not kept
    lines = compile_lines(replace(REPORT, verdicts=(compiled,), combination=None))
    assert lines == ["bfloat16 autocast: compiling took 3.1 s (not in the step times)"]
    kept = replace(compiled, kept=True)
    assert (
        "paid back after 66,589 steps"
        in compile_lines(replace(REPORT, verdicts=(kept,), combination=None))[0]
    )
    nothing = replace(REPORT, verdicts=(), combination=None, final=(), final_saving_pct=None)
    from gpudoctor.fixes.candidates import ManualFix

    left = ManualFix("activation_checkpointing", "Checkpoint the blocks", None, None, "Checkpoint them.")
    listed = replace(nothing, manual=(left,))  # a change left to the user, listed below the table
    assert headline(listed).endswith("no fix applies to this script (see below for what is left to you).")
    # where none is listed (an inference loop, an LBFGS closure), the headline promises none: it points to
    # the notes that say why, or to nothing
    bare = replace(nothing, manual=())
    assert headline(bare).endswith("no fix applies to this script (see below for why).") == bool(bare.notes)
    assert headline(replace(bare, notes=())).endswith("no fix applies to this script.")


def test_one_change_found_in_several_places_is_listed_once_with_its_places() -> None:
    from dataclasses import replace

    from gpudoctor.fixes.candidates import ManualFix
    from gpudoctor.report.fix_view import render_fix_html, render_fix_markdown

    # GIVEN the syncs of an actor-critic loop, found in four functions (the profiler names each by the line
    # it starts on, its file by name alone: no line to read), one of them twice, and a change of another kind
    sync = "keep the value on the GPU"
    places = ("rl.py:80", "rl.py:102", "rl.py:102", "rl.py:121")
    manual = tuple(ManualFix("host_sync", "Host-device synchronizations", p, None, sync) for p in places)
    manual += (ManualFix("memory_held", "Tensors held", None, None, "Drop them."),)
    report = replace(REPORT, manual=manual)
    out = StringIO()
    render_fix_terminal(report, Console(file=out, width=120, force_terminal=False, color_system=None))
    text = out.getvalue()
    # THEN the advice is given once, with its three places, and the other after it
    assert text.count("Host-device synchronizations [host_sync]") == 1 and text.count(sync) == 1
    assert re.search(r"rl\.py:80\n\s+rl\.py:102\n\s+rl\.py:121\n\s+→ keep the value", text)
    assert "Tensors held [memory_held]\n    → Drop them." in text
    md = render_fix_markdown(report)
    assert "(`host_sync`) at `rl.py:80`; `rl.py:102`; `rl.py:121` — keep the value" in md
    assert render_fix_html(report).count("Host-device synchronizations") == 1
