"""gpudoctor's events in the annotated trace keep to what the viewers' JSON importers accept (Perfetto's
trace processor, chrome://tracing's Catapult importer): the phases and fields they read, numbers where
they want numbers, µs with at most ns decimals, idle spans that never overlap once parsed to ns, and
UTF-8 text instead of \\u escapes. Needs no browser; test_annotated_trace_viewers.py opens the file in
the viewers themselves."""

from __future__ import annotations

import gzip
import itertools
import json
import math
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpudoctor.cli.main import app
from gpudoctor.report.annotated_trace import CATEGORY, GAP_NS, PID, TID_IDLE

FIXTURES = Path(__file__).parent / "fixtures"
TRACES = [
    *sorted((FIXTURES / "traces").glob("*.json.gz")),
    FIXTURES / "zoo" / "input_pipeline__slow.json.gz",
    FIXTURES / "zoo" / "launch_overhead__slow.json.gz",
]
METADATA_ARGS = {
    "process_name": ("name", str),
    "process_sort_index": ("sort_index", int),
    "thread_name": ("name", str),
}
US_NUMBER = re.compile(r"-?\d+(\.\d{1,3})?")  # µs in plain notation, ns at most: no exponent


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def ns(v: float | int) -> int:
    """A time as a viewer reads it from the file's text: exactly, in ns."""
    return int(Decimal(json.dumps(v)) * 1000)


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.name.split(".")[0])
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list]:
    out = tmp_path_factory.mktemp("annotated") / "annotated.json.gz"
    result = CliRunner().invoke(app, ["report", str(request.param), "--format", "trace", "-o", str(out)])
    assert result.exit_code == 0, result.output
    raw = gzip.decompress(out.read_bytes())
    return raw, [e for e in json.loads(raw)["traceEvents"] if e.get("pid") == PID]


def test_every_event_has_a_phase_the_importers_know_and_integer_ids(written: tuple[bytes, list]) -> None:
    _, ours = written
    assert ours and {e["ph"] for e in ours} <= {"M", "X", "i", "C"}
    for e in ours:
        assert type(e["pid"]) is int and type(e["tid"]) is int and isinstance(e["name"], str)
        if e["ph"] != "M":
            assert e["cat"] == CATEGORY


def test_times_are_plain_us_numbers_with_at_most_ns_decimals(written: tuple[bytes, list]) -> None:
    _, ours = written
    for e in ours:
        for key in ("ts", "dur"):
            if key in e:
                assert is_number(e[key]) and US_NUMBER.fullmatch(json.dumps(e[key])), e
        if e["ph"] == "X":
            assert e["dur"] > 0


def test_idle_spans_never_overlap_once_read_as_ns(written: tuple[bytes, list]) -> None:
    # A double holds a 1e12 µs time to about 1 ns, and Perfetto drops a span that overlaps the one
    # before it on its thread: touching spans keep GAP_NS apart so no rounding can make them overlap.
    _, ours = written
    spans = sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in ours if e["ph"] == "X")
    assert all(e["tid"] == TID_IDLE for e in ours if e["ph"] == "X")
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start - end >= GAP_NS


def test_instants_have_a_scope_and_counters_numeric_series(written: tuple[bytes, list]) -> None:
    _, ours = written
    assert all(e["s"] in ("g", "p", "t") for e in ours if e["ph"] == "i")
    series: dict[str, set[str]] = {}
    for e in (e for e in ours if e["ph"] == "C"):
        assert e["args"] and all(is_number(v) for v in e["args"].values()), e
        series.setdefault(e["name"], set()).add(tuple(e["args"]))  # type: ignore[arg-type]
    assert all(len(keys) == 1 for keys in series.values())  # one series per counter, every sample


def test_metadata_names_the_process_and_its_threads(written: tuple[bytes, list]) -> None:
    _, ours = written
    meta = [e for e in ours if e["ph"] == "M"]
    for e in meta:
        key, kind = METADATA_ARGS[e["name"]]
        assert type(e["args"][key]) is kind
    assert {"process_name", "thread_name"} <= {e["name"] for e in meta}


def test_text_is_utf8_not_unicode_escapes(written: tuple[bytes, list]) -> None:
    # Perfetto shows "\u00b5" in an arg as those six characters, not as µ. (Control characters
    # stay escaped: JSON allows them no other way.)
    raw, ours = written
    assert not re.search(rb"(?<!\\)\\u(?!00[01])[0-9a-fA-F]{4}", raw)
    text = json.dumps(ours, ensure_ascii=False)
    assert all(c.encode() in raw for c in {c for c in text if ord(c) > 127})


def test_an_annotated_trace_read_back_knows_gpudoctors_category(tmp_path: Path) -> None:
    # GIVEN a trace and the annotated trace gpudoctor wrote from it
    from gpudoctor.trace.load import load_trace

    source = FIXTURES / "zoo" / "launch_overhead__slow.json.gz"
    out = tmp_path / "annotated.json.gz"
    result = CliRunner().invoke(app, ["report", str(source), "--format", "trace", "-o", str(out)])
    assert result.exit_code == 0, result.output
    # WHEN it is read back THEN gpudoctor's rows are kept on their own process (test_report_cli) and its
    # category is a known one: no "unknown category 'gpudoctor'" among what the loader notes
    annotated = load_trace(out)
    assert len(annotated) > len(load_trace(source))
    assert CATEGORY not in annotated.meta.other_categories
    assert not [r for r in annotated.skipped if "unknown category" in r]
