"""The run directory (`gpudoctor run`, `gpudoctor.profile()`), the fix directory (`gpudoctor fix`) and the
batch directory (`gpudoctor batch`): every file name in them, and every read and write of them, is here.
Writes go through `util.outfile` (whole or not at all, never over an input); documents are read back
through `util.jsonfile` (a damaged one is a one-line `UsageError`). Keeping a run directory whole while
the run goes on is `runner.livedir`'s."""

from __future__ import annotations

import contextlib
import gzip
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpudoctor.runner.record import SCHEMA, RunRecord
from gpudoctor.util.errors import MemoryFormatError, OutputError, UsageError
from gpudoctor.util.jsonfile import read_json, read_json_object
from gpudoctor.util.outfile import open_live, open_output, write_bytes, write_json, write_text
from gpudoctor.util.text import printable

# -- the run directory ---------------------------------------------------------------------------------
RECORD_FILE = "record.json"  # RunRecord, written as the run goes
ANALYSIS_FILE = "analysis.json"  # gpudoctor.findings/1 with the analysis, or gpudoctor.ranks/1
OBSERVER_FILE = "observer.json"  # the profiler's distortion in numbers
MEMORY_FILE = "memory.json"  # gpudoctor.memory/1 with the memory findings
REPORT_FILE = "report.html"
TRACE_FILE = "trace.json.gz"  # the traced phase's Kineto trace (kept raw as trace.json if gzip fails)
PROFILER_LOG = "profiler.log"  # Kineto's own lines, kept off the terminal
MEMORY_DIR = "memory"  # torch's allocator snapshots and the memory timeline, gzipped JSON
RANK_DIR = "rank-{rank}"  # one per rank under torchrun: its record, trace and rank.json
RANK_INFO = "rank.json"
# What a run writes: the files a new run in the same directory replaces (nothing else is touched).
RUN_FILES = (RECORD_FILE, ANALYSIS_FILE, OBSERVER_FILE, REPORT_FILE, PROFILER_LOG, TRACE_FILE,
             TRACE_FILE.removesuffix(".gz"), MEMORY_FILE)  # fmt: skip
# A run's own JSON, never taken for a trace when its folder is searched for one.
NOT_TRACES = frozenset({RECORD_FILE, RANK_INFO, ANALYSIS_FILE, OBSERVER_FILE, MEMORY_FILE})
# trace.load.TRACE_SUFFIXES, spelled again: importing the trace package here would pull numpy into every run
TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")
MAX_SNAPSHOT_BYTES = 1 << 30  # decompressed
_RANK_FOLDER = re.compile(r"^rank-(\d+)$")
_SNAPSHOT_NAME = re.compile(r"memory/[a-z_]+\.json\.gz")

# -- the fix directory ---------------------------------------------------------------------------------
FIX_FILE = "fix.json"  # gpudoctor.fix/1, rewritten after every fix
FIX_MARKDOWN = "fix.md"
FIX_HTML = "fix.html"
FIX_DIFF = "fix.diff"
CALIBRATION_FILE = "calibration.json"
AA_FILE = "aa.json"  # gpudoctor.fix-aa/1 of `fix --aa`
ROUNDS_DIR = "rounds"  # each round's result and log
DIAGNOSIS_RUN = "run"  # the diagnosis run's directory
FORKSERVER_LOG = "forkserver.log"
PROOF_DIR = (
    "proof"  # the proof: the patched copy, the stopwatch's folder, each plain process's result and log
)
PROOF_COPY = "copy"
PROOF_BOOT = "stopwatch"  # holds sitecustomize.py, first on the plain processes' PYTHONPATH

# -- the batch directory -------------------------------------------------------------------------------
BATCH_FILE = "batch.json"
BATCH_HTML = "batch.html"


# -- the run directory: checks ------------------------------------------------------------------------
def prepare_run_dir(out: Path) -> None:
    """Make `out` ready for a run: a new or empty directory, or an earlier run's (whose files this run
    replaces); a file there, or a directory of other files, is a one-line error."""
    shown = printable(str(out))
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {shown}: a file is there, not a run directory; choose another path")
    if out.is_dir() and any(out.iterdir()):
        if not is_run_dir(out) and not _holds_only_runs(out):
            raise UsageError(
                f"--out {shown}: this directory holds other files and no gpudoctor run; "
                f"choose a new or empty directory"
            )
        for name in RUN_FILES:
            with contextlib.suppress(FileNotFoundError):
                (out / name).unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot make the run directory {shown}: {err.strerror or err}") from None


def prepare_fix_dir(out: Path) -> None:
    """Make `out` ready for `gpudoctor fix`: a new or empty directory, or an earlier fix's (its files
    replaced as this one goes); a file there, or a directory of other files, is a one-line error."""
    shown = printable(str(out))
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {shown}: a file is there, not a fix directory; choose another path")
    ours = (FIX_FILE, ROUNDS_DIR, AA_FILE, DIAGNOSIS_RUN)
    if out.is_dir() and any(out.iterdir()) and not any((out / name).exists() for name in ours):
        raise UsageError(
            f"--out {shown}: this directory holds other files and no gpudoctor fix; "
            f"choose a new or empty directory"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot make the fix directory {shown}: {err.strerror or err}") from None


def _holds_only_runs(folder: Path) -> bool:
    """A folder of gpudoctor runs alone (the demo's recorded run beside its own)."""
    return all(child.is_dir() and is_run_dir(child) for child in folder.iterdir())


def is_run_dir(folder: Path) -> bool:
    record = folder / RECORD_FILE
    if not record.is_file():
        return False
    try:
        doc = read_json(record, "gpudoctor run record")
    except UsageError:
        return False
    return isinstance(doc, dict) and doc.get("schema") == SCHEMA


# -- the run directory: the record and the documents -------------------------------------------------
def write_record(folder: Path, record: RunRecord) -> None:
    write_json(folder / RECORD_FILE, record.to_json())


def read_record(folder: Path) -> RunRecord | None:
    """The run's record; None when there is none; a damaged one is a one-line error."""
    path = folder / RECORD_FILE
    if not path.is_file():
        return None
    doc = read_json_object(path, "gpudoctor run record")
    try:
        return RunRecord.from_json(doc)
    except UsageError as err:
        raise UsageError(f"{printable(str(path))}: {err}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise UsageError(
            f"{printable(str(path))} is a damaged gpudoctor run record: {type(err).__name__}: {err}"
        ) from None


def record_fields(record_path: Path | None) -> dict[str, Any]:
    """A record's JSON as it is, for the figures a worker reads from it (the light phase's median, the
    NVML summary); empty when it is missing or unreadable: those figures are then unknown."""
    if record_path is None:
        return {}
    try:
        doc = read_json(record_path, "gpudoctor run record")
    except UsageError:
        return {}
    return doc if isinstance(doc, dict) else {}


def write_analysis(folder: Path, doc: dict[str, Any]) -> None:
    write_json(folder / ANALYSIS_FILE, doc)


def saved_analysis(path: Path) -> Path | None:
    """The analysis.json of a run directory, or PATH itself when it is a gpudoctor JSON document."""
    if path.is_dir():
        return path / ANALYSIS_FILE if (path / ANALYSIS_FILE).is_file() else None
    if path.suffix != ".json" or not path.is_file():  # not a FIFO: reading its head would wait
        return None
    with path.open("rb") as f:
        head = f.read(256)
    return path if b'"gpudoctor.' in head and b'"schema"' in head else None


def read_analysis(path: Path) -> dict[str, Any]:
    """A saved analysis (analysis.json, or `analyze --json` output) as a JSON object."""
    return read_json_object(path, "gpudoctor analysis")


def write_observer(folder: Path, doc: dict[str, Any]) -> None:
    write_json(folder / OBSERVER_FILE, doc)


def read_observer(folder: Path) -> dict[str, Any] | None:
    path = folder / OBSERVER_FILE
    return read_json_object(path, "gpudoctor observer effect") if path.is_file() else None


def write_memory(folder: Path, doc: dict[str, Any]) -> None:
    write_json(folder / MEMORY_FILE, doc)


def read_memory(folder: Path) -> dict[str, Any] | None:
    path = folder / MEMORY_FILE
    return read_json_object(path, "gpudoctor memory analysis") if path.is_file() else None


def write_report(folder: Path, html: str) -> Path:
    return write_text(folder / REPORT_FILE, html)


def copy_recorded_run(dest: Path, files: dict[str, bytes]) -> None:
    """A recorded run's files (its record and trace, shipped with gpudoctor) copied into `dest`."""
    for name, data in files.items():
        write_bytes(dest / name, data)


# -- the run directory: the trace and memory recordings -----------------------------------------------
def keep_trace(raw: Path, gz_name: str) -> tuple[str, str | None]:
    """Gzip the profiler's raw trace beside it as `gz_name`; (the file kept, a note). If it cannot be
    gzipped (a full disk, say), the raw trace is kept as it is and the note says why."""
    dest = raw.with_name(gz_name)
    try:
        with raw.open("rb") as src, open_output(dest, text=False) as dst:  # gzipped: the name says .gz
            shutil.copyfileobj(src, dst, length=1 << 20)
    except (OSError, OutputError) as err:
        return raw.name, f"the trace is kept uncompressed ({raw.name}): it could not be gzipped: {err}"
    with contextlib.suppress(OSError):
        raw.unlink()
    return dest.name, None


def snapshot_name(name: str) -> str:
    """Where a memory recording named `name` ("detail", "oom", "timeline") goes, relative to the run."""
    return f"{MEMORY_DIR}/{name}.json.gz"


def write_snapshot(folder: Path, name: str, doc: Any) -> None:
    write_json(folder / snapshot_name(name), doc, indent=None, default=str, allow_nan=True)  # torch's format


def read_snapshot(folder: Path, name: Any) -> Any:
    """A memory recording the record names (`memory/<name>.json.gz`); None when it is missing. Only
    names under memory/ are read, and at most MAX_SNAPSHOT_BYTES of JSON."""
    if not isinstance(name, str) or not _SNAPSHOT_NAME.fullmatch(name):
        return None
    path = folder / name
    if not path.is_file():
        return None
    import json

    try:
        with gzip.open(path, "rb") as f:
            data = f.read(MAX_SNAPSHOT_BYTES + 1)
        if len(data) > MAX_SNAPSHOT_BYTES:
            raise MemoryFormatError(f"{path}: more than {MAX_SNAPSHOT_BYTES >> 20} MiB of JSON")
        return json.loads(data)
    except (OSError, EOFError, ValueError) as err:
        raise MemoryFormatError(f"{path}: {err}") from None


# -- the run directory: ranks -------------------------------------------------------------------------
@dataclass(frozen=True)
class RankFile:
    trace: Path
    record: Path | None = None  # the rank's `gpudoctor run` record, where there is one
    rank: int | None = None  # from its folder's name (rank-K), where it has one


def rank_dir(out: Path, rank: int) -> Path:
    return out / RANK_DIR.format(rank=rank)


def rank_files(directory: Path) -> list[RankFile]:
    """The traces in a directory's `rank-K/` folders, by K (a `gpudoctor run` of several ranks, whose
    own analysis.json sits beside them); without any, its candidate trace files, in name order (their
    rank is read from the traces). JSON of another kind among them is for the loader to pass over."""
    folders = sorted(
        (int(m.group(1)), d) for d in directory.iterdir() if d.is_dir() and (m := _RANK_FOLDER.match(d.name))
    )
    out = []
    for rank, folder in folders:
        traces = sorted(  # trace.json.gz first; never the run's own JSON
            (not f.name.startswith("trace"), f.name, f)
            for f in folder.iterdir()
            if f.is_file() and f.name.endswith(TRACE_SUFFIXES) and f.name not in NOT_TRACES
        )
        record = folder / RECORD_FILE
        for *_, trace in traces[:1]:
            out.append(RankFile(trace, record if record.is_file() else None, rank))
    if out:
        return out
    return [
        RankFile(f) for f in sorted(directory.iterdir()) if f.is_file() and f.name.endswith(TRACE_SUFFIXES)
    ]


def has_rank_traces(out: Path) -> bool:
    return any(out.glob("rank-*/trace*.json*"))


def rank_count(out: Path) -> int:
    return sum(1 for d in out.glob("rank-*") if d.is_dir())


def write_rank_info(folder: Path, doc: dict[str, Any]) -> None:
    write_json(folder / RANK_INFO, doc, default=str)


def rank_info_beside(record_path: Path | None) -> dict[str, Any]:
    """The rank.json beside a rank's record (its GPU's link, its phases); empty without one."""
    return record_fields(record_path.with_name(RANK_INFO)) if record_path is not None else {}


def rank_infos(out: Path) -> dict[int, dict[str, Any]]:
    """Every rank's rank.json, by rank; the unreadable left out."""
    infos = {}
    for path in sorted(out.glob(f"rank-*/{RANK_INFO}")):
        info = record_fields(path)
        with contextlib.suppress(KeyError, TypeError, ValueError):
            infos[int(info["rank"])] = info
    return infos


def rank_records(out: Path) -> list[RunRecord]:
    """Every rank's record that can be read."""
    records = []
    for folder in sorted(out.glob("rank-*")):
        with contextlib.suppress(UsageError):
            record = read_record(folder)
            if record is not None:
                records.append(record)
    return records


def traced_ranks(out: Path, ranks: list[int]) -> list[int]:
    return sorted(r for r in ranks if any(rank_dir(out, r).glob("trace*.json*")))


# -- the fix directory --------------------------------------------------------------------------------
def write_fix_progress(out: Path, doc: dict[str, Any]) -> None:
    """fix.json as it stands (after every fix): a run cut short keeps what it measured."""
    write_json(out / FIX_FILE, doc)


def write_fix(
    out: Path,
    doc: dict[str, Any],
    *,
    markdown: str,
    html: str,
    calibration: dict[str, Any],
    diff: str | None,
) -> None:
    write_json(out / FIX_FILE, doc)
    write_text(out / FIX_MARKDOWN, markdown)
    write_text(out / FIX_HTML, html)
    write_json(out / CALIBRATION_FILE, calibration)
    if diff:
        write_text(out / FIX_DIFF, diff)
    else:  # nothing recommended as a diff: an earlier run's fix.diff is not this one's
        with contextlib.suppress(OSError):
            (out / FIX_DIFF).unlink(missing_ok=True)


def write_aa(out: Path, doc: dict[str, Any]) -> Path:
    return write_json(out / AA_FILE, doc)


def round_files(rounds_dir: Path, label: str) -> tuple[Path, Path]:
    """A round's result file and log, in the fix directory's rounds/."""
    rounds_dir.mkdir(parents=True, exist_ok=True)
    return rounds_dir / f"{label}.json", rounds_dir / f"{label}.log"


def diagnosis_files(run_dir: Path) -> tuple[Path, Path]:
    """The diagnosis run's result and log, beside its run directory (`run/`) in the fix directory."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return run_dir.with_name(run_dir.name + ".json"), run_dir.with_name(run_dir.name + ".log")


def forkserver_log(rounds_dir: Path) -> Path:
    rounds_dir.mkdir(parents=True, exist_ok=True)
    return rounds_dir / FORKSERVER_LOG


def proof_folders(out: Path) -> tuple[Path, Path]:
    """The proof's patched copy and the stopwatch's folder, in the fix directory's proof/."""
    (out / PROOF_DIR / PROOF_BOOT).mkdir(parents=True, exist_ok=True)
    return out / PROOF_DIR / PROOF_COPY, out / PROOF_DIR / PROOF_BOOT


def write_stopwatch(out: Path, source: str) -> Path:
    """The stopwatch as `sitecustomize.py` in the proof's folder for it; returns that folder."""
    boot = proof_folders(out)[1]
    write_text(boot / "sitecustomize.py", source)
    return boot


def proof_files(out: Path, label: str) -> tuple[Path, Path]:
    """A plain process's result file and log, in the fix directory's proof/."""
    return round_files(out / PROOF_DIR, label)


def read_fix(out: Path) -> dict[str, Any] | None:
    path = out / FIX_FILE
    return read_json_object(path, "gpudoctor fix report") if path.is_file() else None


# -- the batch directory, and what every child process writes ----------------------------------------
def write_batch(out: Path, doc: dict[str, Any], html: str) -> tuple[Path, Path]:
    return write_json(out / BATCH_FILE, doc), write_text(out / BATCH_HTML, html)


def write_child_result(path: str | Path, doc: dict[str, Any]) -> None:
    """The result JSON of a child process (`runner.child`'s protocol): whole or not at all."""
    write_json(path, doc, indent=None, default=str)


def open_log(path: Path, *, append: bool = False) -> IO[str]:
    """A log written as it goes by a process of ours (a crash keeps what it wrote): a child's output,
    the profiler's lines (`profiler.log`, added to by each traced phase)."""
    return open_live(path, append=append)
