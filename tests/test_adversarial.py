"""gpudoctor against an attacker and a careless user (issue 15): every input that once broke it, and the
class it stands for, now ends in one line on stderr with exit 2, or in a correct result — never a
traceback, never a hang — and the user's files are byte for byte what they were. The large versions
of these inputs (linear time, bounded memory) are in benchmarks/adversarial_scaling.py."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from adversarial_inputs import (
    ESCAPES,
    MARKUP,
    chrome_trace,
    deep_json,
    equal_timestamps,
    gpu_step_trace,
    gzip_bomb,
    jax_trace,
    whitespace_trace,
    write_doc,
    write_stream,
    zero_length_steps,
)
from gpudoctor.analysis.cpu import _not_inside_same_name, _roll_up
from gpudoctor.analysis.summary import analyze
from gpudoctor.cli.main import app
from gpudoctor.rules import diagnose
from gpudoctor.trace import Kind, load_trace
from gpudoctor.trace.links import op_parents

FIXTURES = Path(__file__).parent / "fixtures"
TRACE = FIXTURES / "traces" / "sync_every_step.json.gz"
SRC = Path(__file__).parent.parent / "src"


def run(*args: str | Path) -> Result:
    return CliRunner(env={"COLUMNS": "120"}).invoke(app, [str(a) for a in args])


def one_line_error(result: Result, *contains: str) -> str:
    """The result is exit 2 with one line on stderr that names what is wrong; nothing else."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpudoctor: error: ") and "Traceback" not in result.output
    for text in contains:
        assert text in lines[0], lines[0]
    return lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def user_trace(tmp_path: Path) -> Iterator[Path]:
    """A copy of a real trace that the test must leave exactly as it found it."""
    path = tmp_path / "trace.json.gz"
    shutil.copy(TRACE, path)
    before = digest(path)
    yield path
    assert digest(path) == before, "the user's trace was changed"


# ---- nothing the user has is lost: an output that is an input is refused ----------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("report", "{t}", "-o", "{t}"),
        ("report", "{t}", "-f", "md", "-o", "{t}"),
        ("report", "{t}", "-f", "trace", "-o", "{t}"),
        ("report", "{t}", "-o", "{link}"),
        ("analyze", "{t}", "--html", "{t}"),
        ("analyze", "{t}", "--html", "{link}"),
    ],
    ids=["html", "md", "annotated", "html-via-symlink", "analyze-html", "analyze-html-via-symlink"],
)
def test_an_output_that_is_the_input_is_refused(user_trace: Path, args: tuple[str, ...]) -> None:
    link = user_trace.with_name("link.json.gz")
    link.symlink_to(user_trace)
    result = run(*(a.format(t=user_trace, link=link) for a in args))
    one_line_error(result, "refusing to write", "input")


def test_a_rank_file_of_an_input_directory_is_an_input(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for r in (0, 1):
        shutil.copy(TRACE, ranks / f"rank{r}.json.gz")
    before = {p.name: digest(p) for p in ranks.iterdir()}
    one_line_error(run("report", ranks, "-f", "trace", "--rank", "1", "-o", ranks / "rank1.json.gz"), "input")
    one_line_error(run("report", ranks, "-o", ranks / "rank0.json.gz"), "input")
    assert {p.name: digest(p) for p in ranks.iterdir()} == before


def test_a_report_written_over_an_old_one_replaces_it_whole(user_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    out.write_text("an old report")
    assert run("report", user_trace, "-f", "md", "-o", out).exit_code == 0
    assert (
        out.read_text().startswith("## gpudoctor") and [p.name for p in tmp_path.glob(".gpudoctor-*")] == []
    )


# ---- an output that cannot be written is one line naming it -------------------------------------------


def unwritable(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "a-file").write_text("")
    cases = {
        "it is a directory": tmp_path,
        "a-file is not a directory": tmp_path / "a-file" / "report.html",
        "file name too long": tmp_path / ("r" * 300 + ".html"),
    }
    if Path("/dev/full").exists():
        cases["no space left on device"] = Path("/dev/full")
    return cases


def test_report_and_analyze_html_to_an_unwritable_place(user_trace: Path, tmp_path: Path) -> None:
    for reason, target in unwritable(tmp_path).items():
        for args in (("report", user_trace, "-o", target), ("analyze", user_trace, "--html", target)):
            one_line_error(run(*args), "cannot write", reason)


def test_bench_save_and_explore_json_to_an_unwritable_place_fail_before_measuring(tmp_path: Path) -> None:
    for reason, target in unwritable(tmp_path).items():
        if reason == "no space left on device":
            continue  # a device passes the early check; its write fails after the measuring
        one_line_error(run("bench", "pass", "--device", "cpu", "--save", target), reason)
        one_line_error(run("explore", "--cpu-only", "--quick", "--json", target), reason)


def test_bench_save_to_dev_full_is_one_line_after_measuring(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    result = run("bench", "pass", "--device", "cpu", "--min-time", "0.01", "--save", "/dev/full")
    one_line_error(result, "cannot write /dev/full: no space left on device")


def test_a_closed_stdout_is_one_line(user_trace: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "analyze", str(user_trace)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        pass_fds=(),
        preexec_fn=lambda: os.close(1),
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "gpudoctor: error: stdout is closed: redirect it (> /dev/null to discard)"
    ]


# ---- nothing from a trace reaches the terminal as an escape sequence or as markup ---------------------


@pytest.fixture
def hostile_trace(tmp_path: Path) -> Path:
    names = (f"aten::mm{ESCAPES}", f"aten::add {MARKUP}", "[/]", "aten::relu\x00\x9b")
    doc = gpu_step_trace(steps=3, names=names)
    doc["deviceProperties"][0]["name"] = f"H100{ESCAPES}"
    return write_doc(tmp_path / f"evil{ESCAPES[:5]}.json", doc)


def has_control(text: str) -> bool:
    return any((ord(c) < 32 and c not in "\n") or 0x7F <= ord(c) <= 0x9F or c == "\u202e" for c in text)


def test_analyze_shows_hostile_names_escaped_and_markup_as_text(hostile_trace: Path) -> None:
    result = run("analyze", hostile_trace)
    assert result.exit_code == 0, result.output
    assert not has_control(result.output)
    assert "\\x1b]52;c;cHduZWQ=\\x07" in result.output  # the clipboard write, shown not done
    assert "[bold red]loud[/bold red]" in result.output and "[link=https://evil.example]" in result.output


def test_analyze_on_a_color_terminal_writes_only_style_escapes(hostile_trace: Path) -> None:
    result = CliRunner(env={"COLUMNS": "120", "FORCE_COLOR": "1", "TERM": "xterm-256color"}).invoke(
        app, ["analyze", str(hostile_trace)]
    )
    assert result.exit_code == 0, result.output
    assert "\x1b[" in result.output  # colors: rich's own SGR sequences
    without_styles = re.sub(r"\x1b\[[0-9;]*m", "", result.output)
    assert not has_control(without_styles)


def test_markdown_and_annotated_trace_show_hostile_names_escaped(hostile_trace: Path, tmp_path: Path) -> None:
    assert run("report", hostile_trace, "-f", "md", "-o", tmp_path / "r.md").exit_code == 0
    assert not has_control((tmp_path / "r.md").read_text())
    assert run("report", hostile_trace, "-f", "trace", "-o", tmp_path / "a.json.gz").exit_code == 0
    doc = json.loads(gzip.decompress((tmp_path / "a.json.gz").read_bytes()))
    texts = [e.get("name", "") for e in doc["traceEvents"]] + [
        str(e.get("args", "")) for e in doc["traceEvents"]
    ]
    assert not any(has_control(t) for t in texts)
    assert any("aten::mm\\x1b]0;pwned" in t for t in texts)


def test_json_output_keeps_names_exactly(hostile_trace: Path) -> None:
    # JSON escapes control characters itself: a consumer gets the names as the trace has them
    result = run("analyze", hostile_trace, "--json")
    assert result.exit_code == 0 and "\x1b" not in result.stdout
    assert f"aten::mm{ESCAPES}" in strings(json.loads(result.stdout))


def strings(value: object) -> set[str]:
    if isinstance(value, str):
        return {value}
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return set().union(*(strings(v) for v in items))


def test_an_error_message_naming_a_hostile_file_is_escaped(tmp_path: Path) -> None:
    path = tmp_path / f"bad{ESCAPES}.json"
    path.write_text("{not json")
    line = one_line_error(run("analyze", path))
    assert not has_control(line) and "\\x1b]0;pwned" in line


# ---- loader: depth, whitespace, size, non-regular files, BOM, what a file is -------------------------


@pytest.mark.parametrize("where", ["arg", "event", "top"])
@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_json_nested_deeper_than_python_can_recurse_is_read(tmp_path: Path, where: str, depth: int) -> None:
    path = tmp_path / "deep.json"
    path.write_bytes(deep_json(depth, where))
    trace = load_trace(path)
    assert [trace.name_of(i) for i in range(len(trace))] == ["aten::mm"] * (2 if where == "arg" else 1)
    assert where == "top" or any("nested deeper" in why for why in trace.skipped)
    assert run("analyze", path).exit_code == 0
    assert run("report", path, "-f", "trace", "-o", tmp_path / "a.json.gz").exit_code == 0


@pytest.mark.parametrize("where", ["before", "between", "after"])
def test_whitespace_anywhere_is_read_in_one_pass(tmp_path: Path, where: str) -> None:
    path = write_stream(tmp_path / "ws.json.gz", whitespace_trace(24 << 20, where))
    plain = load_trace(write_doc(tmp_path / "plain.json", gpu_step_trace(steps=2)))
    trace = load_trace(path)
    assert trace.names == plain.names and np.array_equal(trace.ts, plain.ts)


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = write_doc(tmp_path / "bom.json", gpu_step_trace(), bom=True)
    assert len(load_trace(path)) == len(load_trace(write_doc(tmp_path / "no.json", gpu_step_trace())))
    assert run("report", path, "-f", "trace", "-o", tmp_path / "a.json.gz").exit_code == 0


def test_a_gzip_bomb_stops_at_the_size_limit_and_the_limit_can_be_raised(tmp_path: Path) -> None:
    bomb = gzip_bomb(tmp_path / "bomb.json.gz", 64 << 20)
    assert bomb.stat().st_size < 1 << 20
    one_line_error(
        run("analyze", bomb, "--max-trace-size", "16M"), "over the 16 MiB limit", "--max-trace-size"
    )
    plain = tmp_path / "plain.json"
    plain.write_bytes(gzip.decompress(bomb.read_bytes()))
    one_line_error(run("analyze", plain, "--max-trace-size", "16M"), "its JSON is 65 MiB")
    assert run("analyze", plain, "--max-trace-size", "0").exit_code == 0  # 0: no limit
    one_line_error(run("analyze", plain, "--max-trace-size", "lots"))


@pytest.mark.parametrize("engine", ["serial", "processes"])
def test_the_size_limit_holds_for_every_rank_of_a_directory(tmp_path: Path, engine: str) -> None:
    # GIVEN a directory of rank traces, one of them a gzip bomb (4 MiB of JSON in a few KB)
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    write_doc(ranks / "rank0.json", gpu_step_trace())
    gzip_bomb(ranks / "rank1.json.gz", 4 << 20)
    # WHEN the directory is analyzed or reported under a 1 MiB limit
    # THEN the limit stops the bomb as it does for a single file (it was not passed to the ranks' workers)
    for args in (("analyze", ranks), ("report", ranks, "-o", tmp_path / "r.html")):
        one_line_error(
            run(*args, "--max-trace-size", "1M", "--engine", engine), "rank1.json.gz", "over the 1 MiB limit"
        )
    assert not (tmp_path / "r.html").exists()
    # AND raised, it lets the same directory through
    assert run("analyze", ranks, "--max-trace-size", "0", "--engine", engine).exit_code == 0


def test_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    done: list[Result] = []
    worker = threading.Thread(target=lambda: done.append(run("analyze", fifo)), daemon=True)
    worker.start()
    worker.join(timeout=20)
    if not done:  # unblock the reader so that the thread can end, then fail
        with open(fifo, "w") as f:
            f.write("{}")
        pytest.fail("analyze waited on a FIFO")
    one_line_error(done[0], "not a regular file")
    one_line_error(run("report", fifo, "-o", tmp_path / "r.html"))
    if Path("/dev/zero").exists():
        one_line_error(run("analyze", "/dev/zero"), "not a regular file")


def test_an_empty_path_is_an_error_not_the_current_directory() -> None:
    one_line_error(run("analyze", ""), "empty")
    one_line_error(run("report", ""), "empty")


def test_two_files_claiming_one_rank_are_an_error(tmp_path: Path) -> None:
    for name in ("a.json.gz", "b.json.gz"):  # neither says its rank: both are rank 0
        shutil.copy(TRACE, tmp_path / name)
    one_line_error(run("analyze", tmp_path), "a.json.gz and b.json.gz both claim rank 0")


def _begin_end_trace() -> dict:
    """A Chrome trace-event file of another tool made of begin/end pairs only (no "X" event at all)."""
    events = [{"ph": ph, "pid": 1, "tid": 1, "name": "work", "ts": 10.0 * i + (5 if ph == "E" else 0)}
              for i in range(20) for ph in ("B", "E")]  # fmt: skip
    return {"traceEvents": events, "displayTimeUnit": "ms"}


@pytest.mark.parametrize(
    ("doc", "kind"),
    [
        (jax_trace(), "a JAX (XLA profiler) trace"),
        (chrome_trace(), "a Chrome browser (DevTools) trace"),
        (_begin_end_trace(), "a trace in Chrome's trace-event format from another tool"),
    ],
)
def test_a_trace_of_another_tool_says_what_it_is_and_what_gpudoctor_needs(
    tmp_path: Path, doc: dict, kind: str
) -> None:
    # GIVEN a trace another tool wrote: no PyTorch op, GPU kernel or CUDA call, no Kineto field
    path = write_doc(tmp_path / "other.json", doc)
    # WHEN analyzed THEN one line says what the file is, that it is not a Kineto trace (not merely one
    # without GPU activity), and what gpudoctor reads instead — never an analysis of nothing
    line = one_line_error(run("analyze", path), f"this is {kind}, not a PyTorch profiler (Kineto) trace")
    assert "with GPU activity" not in line
    assert "torch.profiler" in line and "export_chrome_trace" in line


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-5", "-inf"])
def test_a_step_time_that_is_not_a_positive_number_is_refused(user_trace: Path, value: str) -> None:
    one_line_error(run("analyze", user_trace, "--step-time-ms", value), "--step-time-ms")
    one_line_error(run("report", user_trace, "--step-time-ms", value), "--step-time-ms")


# ---- saved documents edited or truncated ----------------------------------------------------------------


@pytest.fixture
def saved_analysis(user_trace: Path, tmp_path: Path) -> dict:
    result = run("analyze", user_trace, "--json")
    assert result.exit_code == 0
    return json.loads(result.stdout)


def edits(doc: dict) -> Iterator[tuple[str, object]]:
    text = json.dumps(doc)
    yield "truncated", text[: len(text) // 2]
    yield "not an object", "[1, 2, 3]"
    yield "deeply nested", '{"schema": "gpudoctor.findings/1", "x": ' + "[" * 5000 + "]" * 5000 + "}"
    for path, value in [
        (("analysis", "steps"), "many"),
        (("analysis", "kernels"), None),
        (("analysis", "trace"), 7),
        (("findings",), [{"id": 1}]),
        (("analysis", "steps"), [{"number": "x"}]),
        (("analysis", "timeline", "gpu_window"), {"window_us": "long"}),
    ]:
        edited = json.loads(text)
        target = edited
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        yield f"{'.'.join(path)}={value!r}", json.dumps(edited)


def test_a_hand_edited_or_truncated_analysis_is_one_line(saved_analysis: dict, tmp_path: Path) -> None:
    for what, text in edits(saved_analysis):
        path = tmp_path / "analysis.json"
        path.write_text(text if isinstance(text, str) else json.dumps(text))
        for fmt in ("html", "md"):
            result = run("report", path, "-f", fmt, "-o", tmp_path / f"r.{fmt}")
            if result.exit_code != 0:
                one_line_error(result)
            assert "Traceback" not in result.output, what


def test_a_damaged_run_record_is_one_line(user_trace: Path, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(user_trace, folder / "trace.json.gz")
    (folder / "record.json").write_text('{"schema": "gpudoctor.run/1", "nvml_samples": 5')
    one_line_error(run("report", folder, "-o", tmp_path / "r.html"), "record.json")


# ---- analysis: linear on equal timestamps and deep nesting; no division by a zero step ----------------


def naive_roll_up(values: np.ndarray, parent: np.ndarray) -> np.ndarray:
    total = values.astype(float).copy()
    for i in np.argsort(-_depths(parent), kind="stable"):
        if parent[i] >= 0:
            total[parent[i]] += total[i]
    return total


def _depths(parent: np.ndarray) -> np.ndarray:
    depth = np.zeros(len(parent), dtype=int)
    for i in range(len(parent)):
        j = parent[i]
        while j >= 0:
            depth[i] += 1
            j = parent[j]
    return depth


def naive_outer(names: np.ndarray, parent: np.ndarray) -> np.ndarray:
    outer = np.ones(len(names), dtype=bool)
    for i in range(len(names)):
        j = parent[i]
        while j >= 0:
            outer[i] &= names[j] != names[i]
            j = parent[j]
    return outer


@pytest.mark.parametrize("seed", range(12))
def test_subtree_sums_and_same_name_nesting_match_a_walk_up_every_chain(tmp_path: Path, seed: int) -> None:
    # random intervals: nested, overlapping, equal starts, zero length, on two threads
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{rng.integers(0, 3)}", "pid": 1, "tid": int(rng.integers(0, 2)),
         "ts": float(rng.integers(0, 20)), "dur": float(rng.integers(0, 12))}
        for _ in range(n)
    ]  # fmt: skip
    trace = load_trace(write_doc(tmp_path / "t.json", {"traceEvents": events}))
    ops = trace.rows(Kind.CPU_OP)
    parent = op_parents(trace, ops)
    values = rng.random(len(ops))
    np.testing.assert_allclose(_roll_up(values, trace, ops), naive_roll_up(values, parent))
    np.testing.assert_array_equal(_not_inside_same_name(trace, ops), naive_outer(trace.name[ops], parent))


def test_equal_timestamps_nesting_thousands_deep_analyze_in_linear_time(tmp_path: Path) -> None:
    # 20,000 ops in one chain: the walks up it that this replaced took minutes here
    trace = load_trace(write_doc(tmp_path / "eq.json", equal_timestamps(20_000)))
    analysis = analyze(trace)
    diagnose(analysis)
    top = analysis.ops[0]
    assert (top.name, top.calls) == ("aten::to", 20_000)
    assert top.cpu_total_us == 20_000  # the outermost only: nested same-name ops do not count twice
    assert top.gpu_total_us == pytest.approx(top.gpu_self_us) == pytest.approx(0.5 * 20_000)
    assert analysis.syncs.sites[0].op == "aten::to" and analysis.syncs.sites[0].count == 5_000


def test_a_traced_step_of_zero_length_is_diagnosed(tmp_path: Path) -> None:
    path = write_doc(tmp_path / "zero.json", zero_length_steps())
    assert run("analyze", path).exit_code == 0
    assert run("analyze", path, "--step-time-ms", "0.5").exit_code == 0


# ---- run: the run directory exists from the first moment, and survives how the run ends --------------

SLOW_TRAIN = """\
import os, sys, time
import torch
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(int(sys.argv[1])):
    loss = model(torch.randn(8, 16)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {i}", flush=True)
    if len(sys.argv) > 2 and i == int(sys.argv[2]):
        os._exit(3)
    time.sleep(0.02)
"""


def gpudoctor(*args: str | Path, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpudoctor", *map(str, args)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )


def test_sigterm_mid_run_leaves_the_run_directory_with_what_was_measured(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SLOW_TRAIN)
    proc = gpudoctor("run", "-o", "out", "--warmup", "1", "--warmup-seconds", "0", "--light-steps", "3", "--light-seconds", "0", "--steps", "100",
                     "train.py", "100000", cwd=tmp_path)  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:  # the script prints every step: the traced phase starts after step 4
        if line.strip() == "step 12":
            break
    else:
        pytest.fail(f"the run ended early: {proc.communicate()}")
    record = json.loads((tmp_path / "out" / "record.json").read_text())  # written long before the end
    assert record["outcome"] == "running" and len(record["light"]["times_us"]) == 3
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "what was measured is in out" in out
    record = json.loads((tmp_path / "out" / "record.json").read_text())
    assert record["outcome"] == "terminated" and record["exit_code"] == 143
    assert len(record["light"]["times_us"]) == 3 and len(record["traced"]["times_us"]) >= 5
    assert record["trace_files"] == ["trace.json.gz"]
    assert load_trace(tmp_path / "out" / "trace.json.gz").meta.profiler_config  # a whole trace
    assert run("report", tmp_path / "out", "-o", tmp_path / "r.html").exit_code == 0


def test_os_exit_mid_run_leaves_the_record_as_it_last_stood(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SLOW_TRAIN)
    proc = gpudoctor("run", "-o", "out", "--warmup", "1", "--warmup-seconds", "0", "--light-steps", "3", "--light-seconds", "0", "--steps", "2",
                     "--run-to-end", "train.py", "40", "15", cwd=tmp_path)  # fmt: skip
    proc.communicate(timeout=120)
    assert proc.returncode == 3  # os._exit(3): no Python cleanup at all ran
    record = json.loads((tmp_path / "out" / "record.json").read_text())
    assert record["outcome"] == "running" and "os._exit" in record["notes"][-1]
    assert len(record["light"]["times_us"]) == 3 and record["trace_files"] == ["trace.json.gz"]


def test_run_refuses_an_out_path_that_is_not_a_run_directory(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SLOW_TRAIN)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "trace.json.gz").write_bytes(b"someone's trace")
    for out in (tmp_path / "notes.txt", tmp_path / "theirs"):
        before = {p: digest(p) for p in [out, *out.glob("*")] if p.is_file()}
        one_line_error(run("run", "-o", out, str(tmp_path / "train.py"), "5"), "--out")
        assert {p: digest(p) for p in before} == before


def test_a_missing_module_or_script_is_a_usage_error_and_makes_no_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    one_line_error(run("run", "-m", "no.such.module"), "no module named 'no.such.module'")
    one_line_error(run("run", "no_such_script.py"), "no such script")
    assert list(tmp_path.iterdir()) == []


def test_a_script_that_does_not_compile_is_a_usage_error_of_every_command_that_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a script with a syntax error (a colon left out)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import torch\nfor i in range(3)\n    print(i)\n")
    # THEN run, fix and batch say so in one line, where Python would point, before starting anything
    for command in ("run", "fix", "batch"):
        one_line_error(run(command, "train.py"), "does not compile", "SyntaxError", "train.py, line 2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_a_trace_that_cannot_be_gzipped_is_kept_raw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudoctor.runner import rundir

    raw = tmp_path / "trace.json"
    raw.write_text('{"traceEvents": []}')

    def full(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rundir.shutil, "copyfileobj", full)
    kept, note = rundir.keep_trace(raw, "trace.json.gz")
    assert kept == "trace.json" and raw.exists() and "no space left" in str(note)
    assert not (tmp_path / "trace.json.gz").exists()


# ---- bench: the timeout holds while a call runs; a measurement prints short ---------------------------


@pytest.mark.parametrize("stmt", ["time.sleep(30)", "while True: pass"])
def test_bench_stops_a_statement_that_never_returns_at_the_timeout(stmt: str) -> None:
    run("bench", "pass", "--device", "cpu", "--min-time", "0.01")  # torch imported before the clock starts
    start = time.monotonic()
    result = run("bench", stmt, "-s", "import time", "--timeout", "1", "--device", "cpu")
    assert time.monotonic() - start < 5  # 1 s, a tenth more for the watchdog, and the CLI's own work
    one_line_error(result, "no call finished within the 1 s timeout")
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL  # the watchdog's handler is gone


def test_bench_reports_what_it_had_when_the_timeout_cuts_a_slow_call_short() -> None:
    import gpudoctor

    calls = []

    def slow() -> None:  # quick at first, then one call that would take a minute
        calls.append(1)
        time.sleep(60 if len(calls) > 30 else 0.01)

    m = gpudoctor.bench(
        slow, device="cpu", timeout_s=1.0, min_time_s=10, warmup_max_s=0.2, host_latency=False
    )
    assert m.elapsed_s < 2  # the measuring itself: 1 s, a tenth more for the watchdog
    assert m.stop_reason == "timeout" and len(m.samples_us) >= 1
    assert m.median_us == pytest.approx(10_000, rel=0.5) and any("timeout" in n for n in m.notes)


def test_the_watchdog_stops_a_measurement_in_another_thread_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    import gpudoctor
    from gpudoctor.timing.runner import BenchTimeout

    real = ctypes.pythonapi.PyThreadState_SetAsyncExc
    sent: list[object] = []

    def set_async_exc(thread: object, exc: object) -> int:
        sent.append(exc)
        return real(thread, exc)

    monkeypatch.setattr(ctypes.pythonapi, "PyThreadState_SetAsyncExc", set_async_exc)
    errors: list[BaseException] = []

    def spin() -> None:
        while True:
            pass

    def measure() -> None:
        try:
            gpudoctor.bench(spin, device="cpu", timeout_s=0.5)
        except BaseException as err:
            errors.append(err)

    worker = threading.Thread(target=measure, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive() and isinstance(errors[0], BenchTimeout) and "spin" in str(errors[0])
    # one exception sent, and never a NULL one to "clear" it: CPython 3.11 then keeps the
    # interpreter's pending flag up for good, and every thread runs slowly from then on
    assert len(sent) == 1 and sent[0] is not None


def test_a_measurement_prints_a_short_summary_not_its_samples() -> None:
    import gpudoctor

    m = gpudoctor.bench(lambda: sum(range(100)), device="cpu", min_time_s=0.05, label="sum")
    text = repr(m)
    assert text == str(m) and text.startswith("<gpudoctor.Measurement 'sum' on cpu")
    assert len(text.splitlines()) <= 6 and len(text) < 600 and len(m.samples_us) > 20
    assert f"{len(m.samples_us):,} samples" in text and "median" in text and "IQR" in text


# ---- start fast ----------------------------------------------------------------------------------------


def test_the_command_line_starts_without_importing_the_heavy_parts() -> None:
    # `gpudoctor --help` and the parsing of every command import typer and gpudoctor's small modules;
    # numpy, rich, msgspec, torch and the analysis come when a command runs
    # (benchmarks/analyze_vs_hta.py measures the wall time)
    code = (
        "import sys; from gpudoctor.cli.main import app; import typer.main; typer.main.get_command(app); "
        "print(' '.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    ).stdout.split()
    heavy = ("numpy", "rich", "msgspec", "torch", "gpudoctor.analysis", "gpudoctor.report", "gpudoctor.trace",
             "gpudoctor.timing", "gpudoctor.monitor", "gpudoctor.rules")  # fmt: skip
    assert [m for m in loaded if m.split(".")[0] in heavy or m.startswith(heavy)] == []
    help_text = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    ).stdout
    assert all(
        name in help_text for name in ("analyze", "report", "run", "demo", "bench", "explore", "monitor")
    )
