"""The sorts `trace.links` takes shortcuts for give what `np.lexsort` gives: by start, the longest first
(rows in time order, ties anywhere), and by thread then start then longest first (threads few or one,
pids and tids of any size or sign), on random rows and on the ops of a recorded trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpudoctor.trace import load_trace
from gpudoctor.trace.links import _by_thread, start_then_longest
from gpudoctor.trace.model import Kind

TRACE = Path(__file__).parent / "fixtures" / "traces" / "sync_every_step_stack.json.gz"


def test_start_then_longest_is_lexsort_on_random_rows() -> None:
    rng = np.random.default_rng(7)
    for trial in range(500):
        n = int(rng.integers(0, 60))
        ts = rng.integers(0, 8, n).astype(float)
        ts = ts if trial % 3 == 0 else np.sort(ts)  # in time order, or not
        dur = rng.integers(0, 5, n).astype(float)
        assert np.array_equal(start_then_longest(ts, dur), np.lexsort((-dur, ts)))


def test_by_thread_is_lexsort_on_random_rows() -> None:
    rng = np.random.default_rng(8)
    for trial in range(500):
        n = int(rng.integers(0, 60))
        ts, dur = np.sort(rng.integers(0, 8, n).astype(float)), rng.integers(0, 5, n).astype(float)
        pid = rng.choice([0, 7, -3, 2**40], n).astype(np.int64)
        tid = rng.choice([1, 5, -2, 2**50], n).astype(np.int64)
        if trial % 4 == 0:
            pid[:], tid[:] = 3, 4
        want = np.lexsort((-dur, ts, tid, pid))
        assert np.array_equal(_by_thread(pid, tid, start_then_longest(ts, dur)), want)


def test_on_a_recorded_trace() -> None:
    trace = load_trace(TRACE)
    for kind in (Kind.CPU_OP, Kind.PYTHON):
        rows = trace.rows(kind)
        ts, dur, pid, tid = trace.ts[rows], trace.dur[rows], trace.pid[rows], trace.tid[rows]
        assert np.array_equal(start_then_longest(ts, dur), np.lexsort((-dur, ts)))
        assert np.array_equal(
            _by_thread(pid, tid, start_then_longest(ts, dur)), np.lexsort((-dur, ts, tid, pid))
        )
