"""Inductor's compile workers are stopped before steps are timed: where a pool exists it is shut down
(once, at the warm-up's end of a timed round), and where torch has none, or shutting it down fails,
nothing else changes."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from gpudoctor.fixes.child import parse, run_round
from gpudoctor.runner import capture
from gpudoctor.runner.compile_workers import stop_compile_workers

MODULE = "torch._inductor.async_compile"


def fake_inductor(monkeypatch: pytest.MonkeyPatch, pools: set[object], shutdown: object) -> None:
    fake = types.SimpleNamespace(_pool_set=pools, shutdown_compile_workers=shutdown)
    monkeypatch.setitem(sys.modules, MODULE, fake)


def test_a_running_pool_is_shut_down(monkeypatch: pytest.MonkeyPatch) -> None:
    pools: set[object] = {object()}
    fake_inductor(monkeypatch, pools, pools.clear)
    assert stop_compile_workers() and not pools


def test_no_pool_or_no_inductor_is_nothing_to_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    fake_inductor(monkeypatch, set(), lambda: calls.append(1))
    assert not stop_compile_workers() and not calls
    monkeypatch.delitem(sys.modules, MODULE)
    assert not stop_compile_workers()


def test_a_shutdown_that_fails_is_not_the_users_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise RuntimeError("SubprocPool closed")

    fake_inductor(monkeypatch, {object()}, broken)
    assert not stop_compile_workers()


def test_a_timed_round_stops_them_once_when_its_warm_up_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a training loop timed as `gpudoctor fix` times a round
    seen: list[str] = []
    monkeypatch.setattr(capture, "stop_compile_workers", lambda: seen.append("stop") or False)
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nm = torch.nn.Linear(4, 1)\nfor _ in range(50):\n    m(torch.randn(8, 4)).sum().backward()\n"
    )
    # WHEN the round runs
    r = run_round(
        parse(["--out", str(tmp_path / "r.json"), "--warmup", "2", "--steps", "4", "--", str(script)])
    )
    # THEN the workers were stopped once, between the warm-up and the timed steps
    assert r.outcome == "stopped" and len(r.step_times_us) == 4 and seen == ["stop"]
