"""The user's files while gpudoctor runs their script many times (`runner.userfiles`): what the script
writes is named, and a file the user had that the script overwrites, appends to or deletes is put back
byte for byte — after `gpudoctor fix` ends, and after Ctrl-C."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpudoctor.cli.main import app
from gpudoctor.fixes.patches.base import PatchOutcome
from gpudoctor.fixes.result import FixReport
from gpudoctor.report.fix_view import render_fix_markdown, user_files_lines
from gpudoctor.runner.userfiles import BACKUP_DIR, LEFT_DIR, UserFiles

CKPT = b"the real checkpoint, three days of training" * 100
LOG = "real run, line 1\nreal run, line 2\n"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "ckpt.pt").write_bytes(CKPT)
    (work / "train.log").write_text(LOG)
    (work / "out").mkdir()
    (work / "out" / "notes.txt").write_text("user notes\n")
    return work


def contents(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def a_round_of_the_script(work: Path) -> None:
    """What a training script does to its folder: overwrites its checkpoint (truncated in place, as
    torch.save does), appends to its log, clears an output folder, starts a new run folder."""
    with open(work / "ckpt.pt", "wb") as f:
        f.write(b"a few steps' checkpoint")
    with open(work / "train.log", "a") as f:
        f.write("step 1 loss 2.3\n")
    (work / "out" / "notes.txt").unlink(missing_ok=True)
    run = work / "runs" / f"version_{len(list((work / 'runs').glob('*'))) if (work / 'runs').exists() else 0}"
    run.mkdir(parents=True)
    (run / "step-10.pt").write_bytes(b"x" * 100)


def test_what_the_script_changed_is_put_back_byte_for_byte_and_named(workdir: Path, tmp_path: Path) -> None:
    # GIVEN the user's files, copied before the script runs
    before = contents(workdir)
    out = workdir / "gpudoctor-fixes" / "x"  # gpudoctor's own output, under the working directory
    out.mkdir(parents=True)
    files = UserFiles.protect(None, out)
    assert files.warning() is None and len(files.copies) == 3
    # WHEN three processes of the script ran and gpudoctor wrote its own files
    for _ in range(3):
        a_round_of_the_script(workdir)
    (out / "fix.json").write_text("{}")
    written = files.finish()
    # THEN every file the user had is as it was; the new run folders stay, named as one entry
    after = contents(workdir)
    assert {k: v for k, v in after.items() if k in before} == before
    assert sorted(written.restored) == ["ckpt.pt", "out/notes.txt", "train.log"]
    assert written.lost == () and written.capped is None
    assert written.created == ("runs/ (3 files, 300 B)",) and written.created_files == 3
    # the versions the script left are kept beside the fix's results, not thrown away
    left = out / BACKUP_DIR / LEFT_DIR
    assert written.left_at == str(left)
    assert (left / "ckpt.pt").read_bytes() == b"a few steps' checkpoint"
    assert (left / "train.log").read_text() == LOG + "step 1 loss 2.3\n" * 3
    # the copies are gone once everything is back; gpudoctor's own output was neither copied nor named
    assert not (out / BACKUP_DIR / "originals").exists()
    assert not any("gpudoctor-fixes" in c for c in written.created)
    (line,) = user_files_lines(written)
    assert "ckpt.pt, out/notes.txt, train.log — changed or deleted, put back as before" in line
    assert "new: runs/ (3 files, 300 B), left in place" in line
    assert files.finish() is written  # once


def test_a_script_that_writes_nothing_gets_no_note(workdir: Path, tmp_path: Path) -> None:
    files = UserFiles.protect(None, tmp_path / "fix")
    written = files.finish()
    assert not written.wrote and user_files_lines(written) == []
    assert contents(workdir)["ckpt.pt"] == CKPT


def test_files_past_the_cap_are_named_before_and_said_lost_after(workdir: Path, tmp_path: Path) -> None:
    # GIVEN a copy cap below the checkpoint's size: the small files are copied, the checkpoint not
    files = UserFiles.protect(None, tmp_path / "fix", cap_bytes=len(CKPT) - 1)
    warning = files.warning()
    assert warning is not None and "ckpt.pt" in warning and "change them for good" in warning
    assert [Path(p).name for p in files.at_risk] == ["ckpt.pt"]
    a_round_of_the_script(workdir)
    written = files.finish()
    assert sorted(written.restored) == ["out/notes.txt", "train.log"]
    assert written.lost == ("ckpt.pt: changed, and not copied before (past the cap)",)
    assert "NOT put back, the script changed them: ckpt.pt" in user_files_lines(written)[1]


def test_the_walk_skips_git_caches_venvs_and_the_output_and_says_when_it_was_cut_short(
    workdir: Path, tmp_path: Path
) -> None:
    for folder in (".git", "__pycache__", "venv", "pkg/__pycache__"):
        (workdir / folder).mkdir(parents=True)
        (workdir / folder / "x").write_text("x")
    (workdir / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    files = UserFiles.protect(None, workdir / "fix")
    assert sorted(str(p.relative_to(workdir)) for p in files.before) == [
        "ckpt.pt",
        "out/notes.txt",
        "train.log",
    ]
    files.finish()
    cut = UserFiles.protect(None, workdir / "fix", walk_s=0.0)
    assert cut.capped is not None and cut.copies == {}
    written = cut.finish()
    assert any("cut short" in line for line in user_files_lines(written))


def test_earlier_gpudoctor_outputs_are_not_copied_as_the_users_files(workdir: Path) -> None:
    # GIVEN the traces and rounds of earlier gpudoctor sessions in the working directory
    for old in (
        "gpudoctor-runs/train-20261126-101010/trace.json.gz",
        "gpudoctor-fixes/train-1/rounds/a1.json",
    ):
        (workdir / old).parent.mkdir(parents=True)
        (workdir / old).write_bytes(b"x" * 1000)
    # WHEN a new session copies the user's files
    files = UserFiles.protect(None, workdir / "gpudoctor-fixes" / "train-2")
    # THEN those outputs are neither copied nor watched: only the user's own files are
    assert sorted(str(p.relative_to(workdir)) for p in files.before) == [
        "ckpt.pt",
        "out/notes.txt",
        "train.log",
    ]
    assert len(files.copies) == 3
    files.finish()


def test_gpudoctors_own_output_sent_to_a_file_here_is_not_put_back(workdir: Path, tmp_path: Path) -> None:
    # GIVEN `gpudoctor fix train.py > fix.log 2>&1` run where the script writes: gpudoctor's own log is
    # a file under the watched folder, and it grows while the script runs
    import subprocess
    import sys

    (workdir / "fix.log").write_text("an earlier session's log\n")
    program = (
        "import sys\n"
        "from pathlib import Path\n"
        "from gpudoctor.runner.userfiles import UserFiles\n"
        f"guard = UserFiles.protect(None, Path({str(tmp_path / 'out')!r}))\n"
        "print('copying the files here that the script may write', flush=True)\n"
        "Path('train.log').write_text('the script wrote this\\n')\n"
        "print('the report', flush=True)\n"
        "print('err line', file=sys.stderr, flush=True)\n"
        "w = guard.finish()\n"
        "print('restored', list(w.restored), 'created', list(w.created), flush=True)\n"
    )
    with open(workdir / "fix.log", "a") as log:  # as `>>`: what was there stays
        done = subprocess.run([sys.executable, "-c", program], stdout=log, stderr=subprocess.STDOUT, timeout=120,
                              cwd=workdir)  # fmt: skip
    text = (workdir / "fix.log").read_text()
    # THEN the log holds everything gpudoctor wrote, not the copy taken before it started
    assert done.returncode == 0, text
    assert text.startswith("an earlier session's log\ncopying") and "the report\nerr line\n" in text
    # AND the script's write is put back, the log is neither restored nor the script's
    assert "restored ['train.log'] created []" in text
    assert (workdir / "train.log").read_text() == LOG


def test_the_script_s_own_folder_is_watched_too(workdir: Path, tmp_path: Path) -> None:
    scripts = tmp_path / "code"
    scripts.mkdir()
    (scripts / "train.py").write_text("pass\n")
    (scripts / "best.pt").write_bytes(b"best")
    files = UserFiles.protect(str(scripts / "train.py"), workdir / "fix")
    (scripts / "best.pt").write_bytes(b"overwritten")
    written = files.finish()
    assert (scripts / "best.pt").read_bytes() == b"best"
    assert written.restored == (str(scripts / "best.pt"),)


# -- gpudoctor fix, end to end ----------------------------------------------------------------------------
SCRIPT = """\
import os
import torch

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
log = open("train.log", "a")
for step in range(1, 100000):
    loss = model(torch.randn(4, 8)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    log.write(f"step {step} loss {loss.item():.4f}\\n")
    if step % 5 == 0:
        torch.save(model.state_dict(), "ckpt.pt")
"""


def report_of(out: Path) -> FixReport:
    return FixReport.from_json(json.loads((out / "fix.json").read_text()))


@pytest.mark.slow
def test_gpudoctor_fix_leaves_the_checkpoint_and_the_log_as_they_were(workdir: Path) -> None:
    # GIVEN a script that saves ckpt.pt every 5 steps and appends to train.log, over a real run's
    (workdir / "train.py").write_text(SCRIPT)
    before = contents(workdir)
    # WHEN gpudoctor fix runs it: the diagnosis run, then the rounds
    result = CliRunner().invoke(
        app,
        ["fix", "--out", "fix", "--rounds", "1", "--blocks", "0", "--warmup", "1", "--steps", "3",
         "--warmup-s", "0", "--steps-s", "0", "--no-fork", "train.py"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    # THEN both are byte for byte what they were, and the report says the script wrote them
    after = contents(workdir)
    assert {k: after[k] for k in before} == before
    report = report_of(workdir / "fix")
    assert report.user_files is not None and sorted(report.user_files.restored) == ["ckpt.pt", "train.log"]
    assert "ckpt.pt, train.log — changed or deleted, put back as before" in " ".join(result.output.split())
    assert "ckpt.pt, train.log — changed or deleted" in render_fix_markdown(report)


def test_ctrl_c_puts_the_files_back_too(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudoctor.fixes import launch
    from gpudoctor.fixes.observe import Observations
    from gpudoctor.fixes.round import RoundResult

    (workdir / "train.py").write_text(SCRIPT)
    before = contents(workdir)
    seen = Observations(None, (), (), (), (), (), "highest", False, False, False, 1)
    calls = []

    def a_round(
        self: object, label: str, fixes: tuple[str, ...], exact_random: bool, switch: tuple[str, ...] = ()
    ) -> RoundResult:
        calls.append(label)
        a_round_of_the_script(workdir)  # each round writes, as the script would
        if len(calls) == 3:
            raise KeyboardInterrupt
        return RoundResult(fixes, "stopped", 0, "perf_counter", (10.0, 11.0, 10.5), 5, observations=seen,
                           patches={f: PatchOutcome(True, changes=(f,)) for f in fixes})  # fmt: skip

    monkeypatch.setattr(launch.SubprocessLauncher, "__call__", a_round)
    result = CliRunner().invoke(
        app,
        ["fix", "--no-diagnose", "--no-fork", "--blocks", "0", "--only", "tf32", "--out", "fix", "train.py"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 130
    after = contents(workdir)
    assert {k: after[k] for k in before} == before
    report = report_of(workdir / "fix")
    assert report.interrupted and report.user_files is not None
    assert sorted(report.user_files.restored) == ["ckpt.pt", "out/notes.txt", "train.log"]


def test_an_error_inside_the_session_puts_the_files_back(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpudoctor.fixes import api
    from gpudoctor.fixes.session import FixOptions

    def fails(*args: object, **kwargs: object) -> FixReport:
        a_round_of_the_script(workdir)
        raise RuntimeError("a bug in gpudoctor")

    monkeypatch.setattr(api, "_run_fix", fails)
    before = contents(workdir)
    with pytest.raises(RuntimeError):
        api.run_fix(api.FixTarget("train.py", ()), workdir / "fix", FixOptions(), diagnose=False)
    after = contents(workdir)
    assert {k: after[k] for k in before} == before


def test_an_old_fix_json_without_the_field_still_loads() -> None:
    fields = dict(argv=("t.py",), started_at="", device="cpu", torch=None, options={}, baseline_us=None,
                  baseline_rounds=0, observations=None, verdicts=(), combination=None, final=(),
                  final_saving_pct=None, diff="", snippets=(), unplaced=(), manual=(), calibration=(), notes=(),
                  complete=True, interrupted=False, elapsed_s=0.0)  # fmt: skip
    doc = FixReport(**fields).to_json()  # type: ignore[arg-type]
    del doc["user_files"]
    assert FixReport.from_json(doc).user_files is None
