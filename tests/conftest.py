"""Shared fixtures: the H200-recorded Kineto traces under tests/fixtures/traces, their parsed JSON, and a
writer for variants of them in tmp_path."""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

TRACES_DIR = Path(__file__).parent / "fixtures" / "traces"
TRACE_NAMES = (
    "conv_bf16_train",
    "transformer_train",
    "dataloader_bound",
    "sync_every_step",
    "sync_every_step_stack",
    "inference",
)

WriteTrace = Callable[..., Path]


@cache
def _parsed(name: str) -> Any:
    with gzip.open(TRACES_DIR / f"{name}.json.gz", "rb") as f:
        return json.load(f)


@pytest.fixture(scope="session")
def trace_paths() -> dict[str, Path]:
    """Every recorded fixture trace (`.json.gz`), by name."""
    return {name: TRACES_DIR / f"{name}.json.gz" for name in TRACE_NAMES}


@pytest.fixture
def trace_doc() -> Callable[[str], dict[str, Any]]:
    """`trace_doc(name)`: a fresh deep copy of a fixture's JSON document, free to mutate."""
    return lambda name: copy.deepcopy(_parsed(name))


def write_json(path: Path, doc: Any, *, indent: int | None = None, compact: bool = False) -> Path:
    """Write `doc` as JSON (gzipped when the name ends in .gz); compact means on one line, no spaces."""
    separators = (",", ":") if compact else None
    text = json.dumps(doc, indent=indent, separators=separators, ensure_ascii=False).encode()
    return write_bytes(path, text)


def write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


@pytest.fixture
def write_trace(tmp_path: Path) -> WriteTrace:
    """`write_trace(doc, name="trace.json", indent=None, compact=False)` -> the path written in tmp_path.
    `doc` may also be `bytes` (written as is, gzipped for a .gz name)."""

    def write(doc: Any, name: str = "trace.json", indent: int | None = None, compact: bool = False) -> Path:
        path = tmp_path / name
        if isinstance(doc, bytes):
            return write_bytes(path, doc)
        return write_json(path, doc, indent=indent, compact=compact)

    return write


# Test files whose verdicts rest on wall-clock time measured in real processes (fix rounds' A/B, loader
# waits, timers, timeouts, grace periods): they run alone after the rest, which runs two at a time
# (`make test`), so that a neighbour's load on a two-core machine cannot move what they measure.
SERIAL_FILES = frozenset(
    {
        "test_bench_cli.py",
        "test_bench_plugin.py",
        "test_fix_loader.py",
        "test_fix_proof_cli.py",
        "test_monitor.py",
        "test_plain_timer.py",
        "test_procgroup.py",
        "test_run_steps.py",
        "test_timing_cpu.py",
        "test_timing_runner.py",
    }
)


# ... and single tests of files whose others measure nothing by the clock
SERIAL_TESTS = {
    "test_fix_cli.py": {
        "test_fix_keeps_the_worker_fix_with_its_diff_and_reverts_the_rest",
        "test_from_a_run_directory_the_script_and_findings_are_reused",
        "test_aa_times_the_script_against_itself_beside_plain_processes",
        "test_ctrl_c_or_sigterm_writes_the_results_so_far_and_exits_130_or_143",
    },
    "test_fix_forkserver.py": {
        "test_a_round_past_its_time_limit_is_ended_with_what_it_started",
        "test_a_round_whose_way_out_hangs_is_ended_soon_after_its_result",
    },
    "test_adversarial.py": {
        "test_bench_stops_a_statement_that_never_returns_at_the_timeout",
        "test_bench_reports_what_it_had_when_the_timeout_cuts_a_slow_call_short",
        "test_the_watchdog_stops_a_measurement_in_another_thread_too",
        "test_sigterm_mid_run_leaves_the_run_directory_with_what_was_measured",
    },
    "test_fix_ranks.py": {
        "test_a_loader_starved_ddp_loop_keeps_the_workers_fix_proved_by_plain_torchrun_groups",
    },
    "test_run_frameworks.py": {
        "test_traces_recorded_by_lightning_or_a_callback_analyze_into_steps",
    },
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = getattr(item, "originalname", None) or item.name
        if item.path.name in SERIAL_FILES or name in SERIAL_TESTS.get(item.path.name, ()):
            item.add_marker(pytest.mark.serial)
