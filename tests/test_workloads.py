"""The built-in workloads build and run on the CPU at small scale, and the fixture recorder turns one into a
gzipped Kineto trace with ProfilerStep annotations and a manifest entry."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpudoctor import workloads
from gpudoctor.util import UsageError

REPO = Path(__file__).resolve().parents[1]
EXPECTED = ["conv_bf16_train", "transformer_train", "dataloader_bound", "sync_every_step", "inference"]


def test_registry_lists_every_builtin_workload_in_order() -> None:
    assert workloads.names() == EXPECTED
    assert all(workloads.get(n).name == n and workloads.get(n).description for n in EXPECTED)


def test_unknown_workload_is_a_usage_error_naming_the_known_ones() -> None:
    with pytest.raises(UsageError, match="conv_bf16_train"):
        workloads.get("no_such_workload")


@pytest.mark.parametrize("name", EXPECTED)
def test_workload_builds_and_runs_two_small_steps_on_cpu(name: str) -> None:
    # GIVEN a small build on the CPU
    step = workloads.get(name).build(torch.device("cpu"), small=True)
    try:
        # WHEN two steps run THEN they complete and the build describes itself
        step.run()
        step.run()
        assert step.info.get("model")
    finally:
        step.close()


@pytest.mark.parametrize("name", EXPECTED)
def test_build_seeds_itself_whatever_the_caller_did_before(name: str) -> None:
    # GIVEN two builds after different global seeds
    states = []
    for caller_seed in (123, 456):
        torch.manual_seed(caller_seed)
        workloads.get(name).build(torch.device("cpu"), small=True).close()
        states.append(torch.get_rng_state())
    # THEN each consumed the same random stream from its own seed, so both initialised the same weights
    assert torch.equal(states[0], states[1])


def _run_recorder(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "record_fixtures.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_recorder_writes_a_gzipped_trace_with_profiler_steps_and_a_manifest(tmp_path: Path) -> None:
    # GIVEN the recorder on the CPU for one small workload, copying its output elsewhere too
    out, copy = tmp_path / "traces", tmp_path / "copy"
    # WHEN it runs
    proc = _run_recorder(
        "--cpu", "--only", "sync_every_step_stack", "--out", str(out), "--copy-to", str(copy)
    )
    # THEN the trace is gzipped Chrome JSON holding the three active ProfilerStep#N annotations
    assert proc.returncode == 0, proc.stderr
    with gzip.open(out / "sync_every_step_stack.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert len(steps) == 3
    # AND the stack fixture carries Python frames and memory events
    assert any(e.get("cat") == "python_function" for e in events)
    assert any(e.get("name") == "[memory]" for e in events)
    # AND the manifest records how and on what it was made
    entry = json.loads((out / "manifest.json").read_text())["fixtures"]["sync_every_step_stack"]
    assert entry["workload"] == "sync_every_step"
    assert entry["file"] == "sync_every_step_stack.json.gz"
    assert entry["active_steps"] == 3
    assert entry["options"] == {
        "with_stack": True,
        "profile_memory": True,
        "record_shapes": False,
        "with_flops": False,
    }
    assert len(entry["unprofiled_step_us"]["samples"]) >= 20
    assert entry["unprofiled_step_us"]["median"] > 0
    assert entry["environment"]["torch"] == torch.__version__
    # AND --copy-to holds the same files
    assert sorted(p.name for p in copy.iterdir()) == ["manifest.json", "sync_every_step_stack.json.gz"]


def test_recorder_rejects_an_unknown_name(tmp_path: Path) -> None:
    proc = _run_recorder("--cpu", "--only", "nope", "--out", str(tmp_path))
    assert proc.returncode != 0
    assert "unknown name" in proc.stderr
