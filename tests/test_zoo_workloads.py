"""The zoo of planted bottlenecks: one case per rule id of the doctor, each a slow variant and its expert fix
that build and run on the CPU at small scale and say how they differ; controls that run too; global flags
restored on close; and the zoo recorder turning a case into two traces and a manifest entry."""

from __future__ import annotations

import dataclasses
import gzip
import json
import multiprocessing
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gpudoctor import workloads
from gpudoctor.runner.profile import StepTraceOptions
from gpudoctor.util import UsageError
from gpudoctor.workloads import zoo

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
RULES = [
    "input_pipeline",
    "host_sync",
    "launch_overhead",
    "pageable_copy",
    "copy_overlap",
    "tensor_cores_unused",
    "tf32_not_bf16",
    "attention_materialized",
    "unfused_elementwise",
    "conv_layout",
    "allocator_thrash",
    "optimizer_unfused",
    "small_batch",
    "memory_pressure",
    "profiler_distortion",
]
CONTROLS = ["control_transformer", "control_cnn"]
# The fixed input pipeline starts 4 workers whatever the machine; torch warns on a 2-core box.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture(autouse=True)
def one_cpu_thread() -> Iterator[None]:
    """Tiny steps on one thread: intra-op threads racing DataLoader workers (or other processes) for a few
    cores make these steps 100x slower at random."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_two_steps(workload: workloads.Workload) -> dict[str, object]:
    step = workload.build(CPU, small=True)
    try:
        step.run()
        step.run()
        return dict(step.info)
    finally:
        step.close()


def test_every_rule_id_has_exactly_one_case_in_the_issues_order() -> None:
    assert [c.rule for c in zoo.cases()] == RULES
    assert [c.name for c in zoo.controls()] == CONTROLS
    assert zoo.names() == RULES + CONTROLS


def test_variants_are_named_after_their_rule_and_described() -> None:
    for case in zoo.cases():
        assert (case.slow.name, case.fixed.name) == (f"{case.rule}.slow", f"{case.rule}.fixed")
        assert case.title and case.note and case.slow.description and case.fixed.description


def test_samples_per_step_differ_only_where_the_batch_size_is_the_cause() -> None:
    differ = {c.rule for c in zoo.cases() if c.samples_per_step_slow != c.samples_per_step_fixed}
    assert differ == {"small_batch"}
    assert zoo.case("small_batch").samples_per_step_slow < zoo.case("small_batch").samples_per_step_fixed


def test_profile_overrides_are_profiler_options() -> None:
    known = {f.name for f in dataclasses.fields(StepTraceOptions)}
    for case in zoo.cases():
        assert set(case.profile_slow) | set(case.profile_fixed) <= known
    heavy = zoo.case("profiler_distortion")
    assert heavy.profile_slow == {"with_stack": True, "record_shapes": True, "profile_memory": True}
    assert not heavy.profile_fixed


def test_unknown_names_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="host_sync"):
        zoo.case("nope")
    with pytest.raises(UsageError, match="control_cnn"):
        zoo.control("nope")


def test_zoo_workloads_are_reachable_through_the_workload_registry() -> None:
    assert workloads.get("host_sync.slow") is zoo.case("host_sync").slow
    assert workloads.get("control_cnn") is zoo.control("control_cnn").workload
    assert "host_sync.slow" not in workloads.names()  # the demo list stays the built-ins


@pytest.mark.parametrize("rule", RULES)
def test_slow_and_fixed_build_run_two_small_steps_and_differ(rule: str) -> None:
    # GIVEN both variants of a case, built small on the CPU
    case = zoo.case(rule)
    # WHEN each runs two steps
    slow, fixed = run_two_steps(case.slow), run_two_steps(case.fixed)
    # THEN each says which variant it is, and what was built differs between them
    assert (slow["variant"], fixed["variant"]) == ("slow", "fixed")
    assert {k: v for k, v in slow.items() if k != "variant"} != {
        k: v for k, v in fixed.items() if k != "variant"
    }


@pytest.mark.parametrize("name", CONTROLS)
def test_controls_build_and_run_two_small_steps(name: str) -> None:
    assert run_two_steps(zoo.control(name).workload)["variant"] == "control"


def test_builds_restore_the_global_flags_they_set() -> None:
    # GIVEN flags the caller chose
    original = torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark
    torch.set_float32_matmul_precision("medium")
    torch.backends.cudnn.benchmark = False
    try:
        # WHEN workloads that change them are built (they do) and closed
        for rule in ("tensor_cores_unused", "conv_layout", "input_pipeline"):
            step = zoo.case(rule).slow.build(CPU, small=True)
            assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark) != ("medium", False)
            step.close()
            # THEN the flags are the caller's again
            assert torch.get_float32_matmul_precision() == "medium"
            assert torch.backends.cudnn.benchmark is False
    finally:
        torch.set_float32_matmul_precision(original[0])
        torch.backends.cudnn.benchmark = original[1]


def test_the_fixed_input_pipeline_stops_its_workers_on_close() -> None:
    step = zoo.case("input_pipeline").fixed.build(CPU, small=True)
    step.run()
    assert multiprocessing.active_children()
    step.close()
    assert not multiprocessing.active_children()


def test_the_fixed_variants_are_the_expert_fixes() -> None:
    infos = {rule: run_two_steps(zoo.case(rule).fixed) for rule in ("input_pipeline", "optimizer_unfused")}
    assert infos["input_pipeline"]["num_workers"] == 4
    assert infos["input_pipeline"]["persistent_workers"] is True
    assert infos["optimizer_unfused"]["parameter_tensors"] >= 200  # type: ignore[operator]


def _run_recorder(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "record_zoo.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_recorder_writes_both_traces_a_manifest_and_a_tar(tmp_path: Path) -> None:
    # GIVEN the zoo recorder on the CPU for one case, with few timed steps to stay fast
    out, tar = tmp_path / "zoo", tmp_path / "zoo.tar"
    # WHEN it runs
    proc = _run_recorder(
        "--cpu", "--only", "host_sync", "--out", str(out), "--tar", str(tar), "--warmup-steps", "1"
    )
    # THEN the slow trace holds 3 ProfilerStep annotations and the fixed one 2
    assert proc.returncode == 0, proc.stderr
    for variant, steps in (("slow", 3), ("fixed", 2)):
        with gzip.open(out / f"host_sync__{variant}.json.gz", "rt") as f:
            events = json.load(f)["traceEvents"]
        names = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
        assert len(names) == steps
    # AND the manifest has the case's timings, samples per step and measured saving
    entry = json.loads((out / "manifest.json").read_text())["cases"]["host_sync"]
    assert entry["rule"] == "host_sync"
    assert entry["files"] == {"slow": "host_sync__slow.json.gz", "fixed": "host_sync__fixed.json.gz"}
    assert len(entry["slow"]["unprofiled_step_us"]["samples"]) == 30
    assert entry["fixed"]["unprofiled_step_us"]["median"] > 0
    assert entry["samples_per_step"] == {"slow": 2048, "fixed": 2048}
    assert isinstance(entry["measured_saving"], float)
    assert entry["torch"] == torch.__version__
    # AND the tar holds the same three files, and the table was printed
    with tarfile.open(tar) as t:
        assert sorted(t.getnames()) == [
            "host_sync__fixed.json.gz",
            "host_sync__slow.json.gz",
            "manifest.json",
        ]
    assert "host_sync" in proc.stdout.splitlines()[-2]


def test_recorder_rejects_an_unknown_name(tmp_path: Path) -> None:
    proc = _run_recorder("--cpu", "--only", "nope", "--out", str(tmp_path))
    assert proc.returncode != 0
    assert "unknown name" in proc.stderr
