"""Where the rank traces of a directory are: trace files in it (`rank0.json.gz`, `worker3.pt.trace.json`),
or, in a `gpudoctor run` of several ranks, one `rank-K/` folder per rank holding its trace and its
`record.json`. Finds files only; loading is `trace.load`'s."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")
RANK_DIR = re.compile(r"^rank-(\d+)$")
RECORD = "record.json"
NOT_TRACES = frozenset({RECORD, "rank.json", "analysis.json", "observer.json"})  # a run's other files


@dataclass(frozen=True)
class RankFile:
    trace: Path
    record: Path | None = None  # the rank's `gpudoctor run` record, where there is one
    rank: int | None = None  # from its folder's name (rank-K), where it has one


def rank_files(directory: Path) -> list[RankFile]:
    """The traces in a directory's `rank-K/` folders, by K (a `gpudoctor run` of several ranks, whose
    own analysis.json sits beside them); without any, its candidate trace files, in name order (their
    rank is read from the traces). JSON of another kind (a record, a manifest) among them is for the
    loader to pass over."""
    in_folders = _rank_folders(directory)
    if in_folders:
        return in_folders
    return [
        RankFile(f) for f in sorted(directory.iterdir()) if f.is_file() and f.name.endswith(TRACE_SUFFIXES)
    ]


def _rank_folders(directory: Path) -> list[RankFile]:
    out = []
    folders = sorted(
        (int(m.group(1)), d) for d in directory.iterdir() if d.is_dir() and (m := RANK_DIR.match(d.name))
    )
    for rank, folder in folders:
        traces = sorted(  # trace.json.gz first; never the run's own JSON
            (not f.name.startswith("trace"), f.name, f)
            for f in folder.iterdir()
            if f.is_file() and f.name.endswith(TRACE_SUFFIXES) and f.name not in NOT_TRACES
        )
        record = folder / RECORD
        for *_, trace in traces[:1]:
            out.append(RankFile(trace, record if record.is_file() else None, rank))
    return out
