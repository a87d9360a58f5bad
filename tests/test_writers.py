"""Every file gpudoctor writes goes through the one writer (`util.outfile`), and every file of a run, fix or
batch directory through the run-directory module (`runner.rundir`): an AST walk lists who writes, and the
list below is the whole of it, each entry with what it writes."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "gpudoctor"

ONE_WRITER = {"write_json", "write_text", "write_bytes", "open_output", "open_live"}

# module -> what it writes through the one writer
WRITERS = {
    "util/outfile.py": "the one writer itself",
    "runner/rundir.py": "every file of a run, fix and batch directory, and a child process's result and log",
    "runner/userfiles.py": "the list of the user's files copied aside (user-files/manifest.json)",
    "cli/report_files.py": "gpudoctor report -o FILE, analyze --html FILE: a file the user names",
    "cli/explore.py": "explore --json FILE",
    "cli/monitor_run.py": "monitor -- CMD: its summary --json FILE",
    "monitor/logfile.py": "monitor --log FILE, written as the samples come",
    "timing/measurement.py": "bench --save FILE: a measurement",
    "report/bench_plot.py": "bench/explore --plot FILE: an image",
    "device/ceilings.py": "the cache of measured ceilings (~/.cache/gpudoctor)",
    "fixes/shadow.py": "the proof's copy of the user's files: those the diff changes, written patched",
}
# writes that are not gpudoctor's own bytes: module -> why they may write directly
OTHERS = {
    "util/outfile.py": "the temporary file beside the target, renamed into place",
    "runner/profiler_session.py": "torch.profiler exports its raw trace; rundir.keep_trace makes it trace.json.gz",
    "runner/profile.py": "torch.profiler exports its raw trace; rundir.keep_trace makes it trace.json.gz",
    "timing/kernels.py": "a temporary trace of a timed kernel, read back and removed",
    "runner/userfiles.py": "the user's own files copied byte for byte before the script runs, and put back",
    "fixes/shadow.py": "the proof's copy: the user's script copied byte for byte, the patched files' modes kept",
    "fixes/stopwatch.py": "the stopwatch runs inside the user's plain process and imports nothing of gpudoctor: "
    "its result written beside the target and renamed into place, as the one writer does",
}


def _mode(call: ast.Call) -> str | None:
    for a in call.args[1:2]:
        if isinstance(a, ast.Constant) and isinstance(a.value, str):
            return a.value
    return next(
        (k.value.value for k in call.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)), None
    )


def raw_write(call: ast.Call) -> str | None:
    """What a call writes without the one writer, if it writes a file."""
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
    text = ast.unparse(call)
    if (
        name in ("write_text", "write_bytes")
        and isinstance(f, ast.Attribute)
        and owner not in ("outfile", "rundir")
    ):
        return text
    if (owner, name) in {("os", "replace"), ("os", "rename"), ("tempfile", "mkstemp"), ("json", "dump")}:
        return text
    if owner == "shutil" and name.startswith(("copy", "move")) and name != "copyfileobj":
        return text
    if name in ("export_chrome_trace", "GzipFile") and "rb" not in text:
        return text
    if (
        owner == "os"
        and name == "open"
        and ("O_WRONLY" in text or "O_CREAT" in text)
        and "devnull" not in text
    ):
        return text
    if name == "open":
        first = call.args[0] if call.args else None
        if isinstance(first, ast.Constant) and isinstance(first.value, int):
            return None  # a descriptor of this process (stdout), not a file
        mode = _mode(call) if isinstance(f, ast.Name) or owner == "gzip" else None
        if isinstance(f, ast.Attribute) and owner != "gzip" and first is not None:
            mode = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
        if mode and any(c in mode for c in "wax"):
            return text
    return None


def writers() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    through, raw = {}, {}
    for module in sorted(SRC.rglob("*.py")):
        name = str(module.relative_to(SRC))
        for node in ast.walk(ast.parse(module.read_text())):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Name) and node.func.id in ONE_WRITER:
                through.setdefault(name, []).append(f"{node.lineno}: {ast.unparse(node)[:80]}")
            elif (what := raw_write(node)) is not None:
                raw.setdefault(name, []).append(f"{node.lineno}: {what[:80]}")
    return through, raw


def test_the_modules_that_write_are_the_listed_ones() -> None:
    through, _ = writers()
    assert set(through) == set(WRITERS), {
        m: through.get(m, "(writes nothing)") for m in set(through) ^ set(WRITERS)
    }


def test_nothing_writes_around_the_one_writer() -> None:
    _, raw = writers()
    assert {m: calls for m, calls in raw.items() if m not in OTHERS} == {}
    assert set(raw) == set(OTHERS)  # and each exception still exists


def test_the_run_and_fix_directories_are_named_in_one_module() -> None:
    """The files of a run and a fix directory are spelled in `runner.rundir` alone."""
    names = (
        '"record.json"',
        '"analysis.json"',
        '"observer.json"',
        '"memory.json"',
        '"fix.json"',
        '"rank.json"',
    )
    spelled = {
        str(m.relative_to(SRC)): [n for n in names if n in m.read_text()]
        for m in SRC.rglob("*.py")
        if any(n in m.read_text() for n in names)
    }
    assert spelled == {"runner/rundir.py": list(names)}


def test_the_scan_sees_the_writes_it_forbids(tmp_path: Path) -> None:
    source = (
        "import json, os\n"
        "path.write_text('x')\n"
        "open(p, 'w')\n"
        "with p.open('a') as f: pass\n"
        "os.replace(a, b)\n"
        "json.dump(doc, f)\n"
        "open(p)\n"
        "open(1, 'w', closefd=False)\n"
        "outfile.write_text(p, 'x')\n"
    )
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    found = [raw_write(c) for c in calls]
    assert sum(w is not None for w in found) == 5
