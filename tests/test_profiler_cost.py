"""The profiler's own cost estimated from a trace alone (analysis.profiler_cost), held to the committed
traces whose step time was also measured without the profiler (tests/fixtures/traces and zoo manifests),
and what the doctor does with it on a trace alone: no critical or major host-side verdict on host time the
profiler may have added, and the planted cause still first on the zoo's host-bound cases."""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path

import pytest

from gpudoctor.analysis.profiler_cost import COSTS, COSTS_STATUS, COSTS_WITH_STACK_AND_SHAPES, prices
from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.rules import Diagnosis, Severity, diagnose
from gpudoctor.rules.facts import facts_of
from gpudoctor.rules.profiler import HOST_SIDE
from gpudoctor.trace import load_trace

FIXTURES = Path(__file__).parent / "fixtures"
TRACES = json.loads((FIXTURES / "traces" / "manifest.json").read_text())["fixtures"]
ZOO = json.loads((FIXTURES / "zoo" / "manifest.json").read_text())


def _unprofiled(entry: dict) -> float:
    return float(entry["unprofiled_step_us"]["median"])


# (trace file, unprofiled step µs) of every committed trace of a well-tuned step (GPU busy ≥ 90% of the
# unprofiled step) that the profiler slowed by ≥ 10%: the class the acceptance measures.
WELL_TUNED = {
    "conv_bf16_train": (FIXTURES / "traces/conv_bf16_train.json.gz", _unprofiled(TRACES["conv_bf16_train"])),
    "transformer_train": (
        FIXTURES / "traces/transformer_train.json.gz",
        _unprofiled(TRACES["transformer_train"]),
    ),
    "transformer_shapes": (
        FIXTURES / "traces/transformer_shapes.json.gz",
        _unprofiled(TRACES["transformer_shapes"]),
    ),
    **{
        f"zoo {case}.{variant}": (
            FIXTURES / "zoo" / ZOO["cases"][case][variant]["file"],
            _unprofiled(ZOO["cases"][case][variant]),
        )
        for case, variant in [
            ("profiler_distortion", "slow"),
            ("profiler_distortion", "fixed"),
            ("small_batch", "fixed"),
            ("allocator_thrash", "fixed"),
            ("input_pipeline", "fixed"),
        ]
    },
}


@functools.cache
def _analysis(path: Path) -> Analysis:
    return analyze(load_trace(path))


def _predicted_vs_measured(name: str) -> tuple[float, float]:
    path, unprofiled = WELL_TUNED[name]
    f = facts_of(_analysis(path))
    assert f is not None and f.est_unprofiled_us is not None
    return f.traced_step_us - f.est_unprofiled_us, f.traced_step_us - unprofiled


def test_every_cost_says_where_it_comes_from() -> None:
    assert set(COSTS) == {"event", "compiled_launch", "shaped_op", "memory_event", "python_frame"}
    assert all(c.us > 0 and c.source for c in COSTS.values())
    assert COSTS_STATUS.startswith("measured")


def test_the_costs_are_the_committed_measurement() -> None:
    # GIVEN the fit tools/measure_profiler_cost.py --fit made of the committed probes (H100, torch 2.11)
    fitted = json.loads((FIXTURES.parents[1] / "benchmarks/results/profiler_cost.json").read_text())
    assert fitted == _tool().fit(RECORDED)  # type: ignore[attr-defined]
    # THEN the shipped costs are its figures (to 0.01 µs), but the compiled launch's: the probe's fit is
    # negative (so is its rerun's, below), the provisional cost stays (its source says so)
    for kind, us in fitted["costs_us"].items():
        if kind != "compiled_launch":
            assert COSTS[kind].us == pytest.approx(us, abs=0.006), kind
    assert fitted["compiled_launch_raw_us"] < 0 and "not" in COSTS["compiled_launch"].source
    for kind, us in fitted["with_stack_and_shapes_us"].items():
        assert COSTS_WITH_STACK_AND_SHAPES[kind].us == pytest.approx(us, abs=0.006), kind


def test_the_compiled_probe_rerun_does_not_resolve_the_compiled_launch_cost() -> None:
    # GIVEN the compiled probe's rerun (H100, another session: 5 profiled steps a run, 80 unprofiled steps
    # timed before the traced runs and 80 after), kept apart from the fit's two probes
    doc = json.loads((RECORDED / "reruns/compiled_probe/manifest.json").read_text())
    w = doc["workloads"]["compiled_probe"]
    counts = w["runs"]["default"]["counts_per_step"]
    traced = statistics.median(w["runs"]["default"]["traced_step_us"])
    unprofiled = w["unprofiled_step_us"]

    def per_launch(unprofiled_us: float) -> float:
        return (traced - unprofiled_us - COSTS["event"].us * counts["event"]) / counts["compiled_launch"]

    # THEN what the event cost leaves per Inductor launch is negative again (−11.3 µs), and its sign turns
    # with the unprofiled steps it is taken against (before: +9.7, after: −21.7)
    assert per_launch(unprofiled["median"]) == pytest.approx(-11.3, abs=0.2)  # 1.78 µs, not 1.776
    assert per_launch(unprofiled["before"]) > 0 > per_launch(unprofiled["after"])
    # since the launches' whole cost at the provisional price is below the drift of its unprofiled steps
    assert (
        COSTS["compiled_launch"].us * counts["compiled_launch"] < unprofiled["after"] - unprofiled["before"]
    )


@pytest.mark.parametrize("name", sorted(WELL_TUNED))
def test_the_well_tuned_traces_are_what_this_file_says(name: str) -> None:
    path, unprofiled = WELL_TUNED[name]
    f = facts_of(_analysis(path))
    assert f is not None
    assert f.busy_us >= 0.9 * unprofiled * 0.98  # busy ≥ 90% unprofiled (2% for run-to-run spread)
    assert f.traced_step_us >= 1.1 * unprofiled


# Within ±30% of the measured traced − unprofiled difference: the acceptance's target. These traces were
# recorded on H200 hosts; the costs were measured on an H100's host. Outside ±30%: transformer_train
# (1.33: its GPU work hides part of the profiler's cost), the zoo's allocator_thrash.fixed (0.69) and
# input_pipeline.fixed (0.53: its loader workers' host time varies run to run), listed below.
WITHIN_30 = {
    "conv_bf16_train",
    "transformer_shapes",
    "zoo profiler_distortion.slow",
    "zoo profiler_distortion.fixed",
    "zoo small_batch.fixed",
}


@pytest.mark.parametrize("name", sorted(WITHIN_30))
def test_the_estimate_is_within_30_percent_of_the_measured_difference(name: str) -> None:
    predicted, measured = _predicted_vs_measured(name)
    assert abs(predicted - measured) <= 0.3 * measured, (predicted, measured)


@pytest.mark.parametrize("name", sorted(set(WELL_TUNED) - WITHIN_30))
def test_the_known_misses_stay_within_50_percent(name: str) -> None:
    predicted, measured = _predicted_vs_measured(name)
    assert abs(predicted - measured) <= 0.5 * measured, (predicted, measured)


def test_with_stack_records_are_counted_and_priced() -> None:
    path, _ = WELL_TUNED["zoo profiler_distortion.slow"]
    cost = _analysis(path).profiler_cost
    assert cost is not None
    assert cost.options == ("with_stack", "record_shapes", "profile_memory")
    assert cost.counts["python_frame"] > 5000 and cost.counts["compiled_launch"] > 100
    priced = sum(prices(cost.options)[k].us * n for k, n in cost.counts.items())
    assert priced > sum(COSTS[k].us * n for k, n in cost.counts.items())  # both on: priced together
    assert cost.est_us == pytest.approx(priced)


@functools.cache
def _alone(path: Path) -> Diagnosis:
    return diagnose(_analysis(path))


# The estimate misses most of the profiler's cost where the loader's worker processes and pin-memory
# thread add host time the trace does not hold as ops (−44% on input_pipeline.fixed): a known miss, kept
# visible until measured costs (tools/measure_profiler_cost.py) or a model of loader threads close it.
_LOADER_MISS = pytest.mark.xfail(strict=True, reason="profiler cost in loader threads not estimated")
# With the H100-measured event cost (1.78 µs) the H200 hosts' traces price too little (they imply ~1.9
# µs): allocator_thrash.fixed (0.69 of measured) keeps a major host-side finding. A known miss until the
# costs are measured per host (or the host's speed read from the trace).
_HOST_MISS = pytest.mark.xfail(strict=True, reason="H200 host traces, H100-measured per-event costs")
_MISSES = {"zoo input_pipeline.fixed": _LOADER_MISS, "zoo allocator_thrash.fixed": _HOST_MISS}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=_MISSES[n]) if n in _MISSES else n for n in sorted(WELL_TUNED)],
)
def test_a_well_tuned_trace_alone_gets_no_critical_or_major_host_side_finding(name: str) -> None:
    d = _alone(WELL_TUNED[name][0])
    serious = [
        (f.id, f.severity.value)
        for f in d.findings
        if f.id in HOST_SIDE and f.severity in (Severity.CRITICAL, Severity.MAJOR)
    ]
    assert not serious
    distortion = d.get("profiler_distortion")
    assert distortion is not None and "gpudoctor run" in " ".join(distortion.evidence)


def test_a_host_side_finding_keeps_the_traces_bound_and_says_why_it_is_milder() -> None:
    d = _alone(WELL_TUNED["zoo profiler_distortion.slow"][0])
    f = d.get("launch_overhead")
    assert f is not None and f.severity is Severity.MINOR and f.est_saving_pct > 20
    assert f.values["saving_without_profiler_pct"] < 8
    assert "--step-time-ms" in f.evidence[-1]


@pytest.mark.parametrize(
    "rule", ["launch_overhead", "input_pipeline", "optimizer_unfused", "small_batch", "host_sync"]
)
def test_the_zoo_planted_host_side_cause_still_comes_first_on_the_trace_alone(rule: str) -> None:
    d = _alone(FIXTURES / "zoo" / ZOO["cases"][rule]["slow"]["file"])
    assert d.findings[0].id == rule, [(f.id, f.est_saving_pct) for f in d.findings]


def test_with_the_unprofiled_step_known_nothing_is_estimated() -> None:
    path, unprofiled = WELL_TUNED["conv_bf16_train"]
    f = facts_of(analyze(load_trace(path), unprofiled_step_us=unprofiled))
    assert f is not None and f.profiler_est_us is None and f.est_unprofiled_us is None


# --- the GPU recordings of tools/measure_profiler_cost.py -------------------------------------------

RECORDED = FIXTURES / "profiler_cost"
_RECORDED = json.loads((RECORDED / "manifest.json").read_text())["workloads"] if RECORDED.exists() else {}
ACCEPTED = sorted(n for n, w in _RECORDED.items() if w.get("part") == "acceptance" and "runs" in w)


@pytest.mark.skipif(not ACCEPTED, reason="not recorded yet: tools/measure_profiler_cost.py --part acceptance")
@pytest.mark.parametrize("name", ACCEPTED or ["none"])
def test_recorded_well_tuned_workloads_meet_the_acceptance(name: str) -> None:
    # GIVEN a well-tuned workload traced with with_stack + record_shapes, and its unprofiled step time
    entry = _RECORDED[name]
    path = RECORDED / entry["runs"]["stack_shapes"]["file"]
    unprofiled = entry["unprofiled_step_us"]["median"]
    f = facts_of(_analysis(path))
    assert f is not None and f.est_unprofiled_us is not None
    # THEN the estimated profiler cost is within ±30% of the measured traced − unprofiled difference
    predicted, measured = f.traced_step_us - f.est_unprofiled_us, f.traced_step_us - unprofiled
    assert abs(predicted - measured) <= 0.3 * abs(measured), (predicted, measured)
    # AND the steps the recorder kept are the steps gpudoctor reads (a CUDA graph's replay returns at once:
    # its host span is not its time); their mean, which every per-step figure is a share of
    assert statistics.fmean(entry["runs"]["stack_shapes"]["traced_step_us"]) == pytest.approx(
        f.traced_step_us, rel=1e-6
    )
    # AND the trace alone gets no critical or major host-side finding
    d = _alone(path)
    assert not [
        f.id for f in d.findings if f.id in HOST_SIDE and f.severity in (Severity.CRITICAL, Severity.MAJOR)
    ]


# --- the recorder's own counting and fitting (CPU) ---------------------------------------------------


def _tool() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "measure_profiler_cost", FIXTURES.parents[1] / "tools" / "measure_profiler_cost.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recorder_counts_events_per_step_as_the_analysis_does() -> None:
    import gzip

    path, _ = WELL_TUNED["zoo profiler_distortion.slow"]
    with gzip.open(path, "rb") as fh:
        counted = _tool().count_events(json.load(fh))  # type: ignore[attr-defined]
    cost = _analysis(path).profiler_cost
    assert cost is not None and len(counted["traced_step_us"]) == 3
    for kind in ("event", "compiled_launch", "shaped_op", "python_frame"):
        assert counted["counts_per_step"][kind] == pytest.approx(cost.counts[kind], rel=0.02), kind


def test_the_fit_recovers_per_event_costs_from_host_bound_probes(tmp_path: Path) -> None:
    # GIVEN two probes whose traced time is the unprofiled time plus known per-event costs, with_stack
    # and record_shapes together costing more than each alone
    alone = {
        "event": 2.0,
        "compiled_launch": 20.0,
        "shaped_op": 1.0,
        "memory_event": 1.5,
        "python_frame": 1.5,
    }
    together = {"shaped_op": 2.5, "python_frame": 3.0}
    zero = dict.fromkeys(alone, 0.0)

    def probe(events: float, launches: float, shaped: float, frames: float, unprofiled: float) -> dict:
        def run(option_set: str) -> dict:
            counts = {**zero, "event": events, "compiled_launch": launches}
            price = dict(alone)
            if option_set in ("record_shapes", "stack_shapes", "all"):
                counts["shaped_op"] = shaped
            if option_set in ("with_stack", "stack_shapes", "all"):
                counts["python_frame"] = frames
            if option_set == "all":
                counts["memory_event"] = 0.3 * events
            if option_set in ("stack_shapes", "all"):
                price.update(together)
            added = sum(price[k] * v for k, v in counts.items())
            return {"counts_per_step": counts, "traced_step_us": [unprofiled + added]}

        runs = {o: run(o) for o in ("default", "record_shapes", "with_stack", "stack_shapes", "all")}
        return {"runs": runs, "unprofiled_step_us": {"median": unprofiled}}

    doc = {
        "environment": {"device_name": "test"},
        "workloads": {
            "eager_probe": probe(1000.0, 0.0, 700.0, 600.0, 5000.0),
            "compiled_probe": probe(400.0, 100.0, 300.0, 1200.0, 3000.0),
        },
    }
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    # THEN the fit gives them back
    fitted = _tool().fit(tmp_path)  # type: ignore[attr-defined]
    assert fitted["costs_us"] == pytest.approx(alone)
    assert fitted["with_stack_and_shapes_us"] == pytest.approx(together)


def test_the_three_well_tuned_workloads_are_recorded() -> None:
    assert ACCEPTED == ["gpt2_compiled", "resnet50_graph_inference", "vit_compiled"]


def test_the_recorder_times_a_cuda_graph_step_by_the_gpu_not_its_host_span() -> None:
    import gzip

    # GIVEN the CUDA-graph inference trace: the host returns from the replay long before the GPU is done
    with gzip.open(RECORDED / "resnet50_graph_inference__stack_shapes.json.gz", "rb") as fh:
        counted = _tool().count_events(json.load(fh))  # type: ignore[attr-defined]
    # THEN its steps are the GPU's (~2.8 ms, as unprofiled), not the host's ProfilerStep spans (< 0.5 ms)
    assert max(counted["host_step_us"]) < 500
    assert counted["traced_step_us"] == pytest.approx([2828, 2827], abs=2)
