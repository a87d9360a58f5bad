"""The multi-GPU diagnosis on real 2-rank recordings of DDP and FSDP2 ResNet-50 on two H100s
(tests/fixtures/ddp_resnet50, recorded by benchmarks/multi_gpu.py with the plain runs of the same call
in its manifest): what gpudoctor says about a planted straggler, an uneven batch, a balanced run and
FSDP, judged against the unprofiled step — the profiler slows each rank's host, unevenly, and a
collective that waits for a slower rank lasts as long as that rank's host."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

from conftest import write_json
from gpudoctor.analysis.ranks import HOST_IDLE_GAP
from gpudoctor.doctor.ranks import RanksRun, analyze_directory
from gpudoctor.rules.stragglers import straggler

FIXTURES = Path(__file__).parent / "fixtures" / "ddp_resnet50"
SHARE = re.compile(r"\((\d+(?:\.\d+)?)%\)")  # "… of each unprofiled 37.8 ms step (48%)"
# the recordings of each machine: ddp_resnet50 (the first 2 × H100), _h200 (H200 a), _h200_b, _h100_b (2 GPUs
# of a quiet 4 × H100 host), each with the plain steps of its call in its manifest


@functools.cache
def run(name: str, machine: str = "") -> RanksRun:
    return analyze_directory(FIXTURES.with_name(FIXTURES.name + machine) / name, all_reports=True)


@functools.cache
def _manifest(machine: str) -> dict:
    return json.loads((FIXTURES.with_name(FIXTURES.name + machine) / "manifest.json").read_text())


def plain_us(case: str, machine: str = "") -> float:
    return _manifest(machine)["plain_same_call"][case]["mean_us"]


def measured_saving_pct(machine: str = "") -> float:
    """Removing the planted straggler, as measured plainly in the recording's call (balanced against it)."""
    return (
        100
        * (plain_us("straggler", machine) - plain_us("balanced", machine))
        / plain_us("straggler", machine)
    )


@pytest.mark.parametrize("name", ["ddp", "straggler", "uneven", "fsdp", "balanced_first_machine"])
def test_no_share_of_a_step_is_over_100_percent(name: str) -> None:
    # GIVEN every finding about the ranks together and about each rank, against the unprofiled step
    r = run(name)
    findings = [*r.diagnosis.findings, *(f for _, d in r.reports.values() for f in d.findings)]
    # THEN no saving and no share of a step in the evidence exceeds the step
    for f in findings:
        assert 0 <= f.est_saving_pct <= 100
        for sentence in f.evidence:
            for share in SHARE.findall(sentence):
                assert float(share) <= 100, f"{f.id}: {sentence}"


def test_exposed_communication_that_waits_is_held_to_the_unprofiled_step() -> None:
    # GIVEN the balanced run: in the trace rank 1's all-reduces run 4.8 ms alone per traced step, most of
    # it waiting for rank 0, whose host the profiler slowed more
    a, d = run("balanced_first_machine").reports[1]
    f = d.get("communication_exposed")
    assert f is not None
    traced, held = f.values["traced_exposed_comm_us"], f.values["exposed_comm_us"]
    # THEN the figure is the most the unprofiled step can hold (the step less the GPU's other work),
    # said as a bound beside the traced figure, not the traced figure against the unprofiled step
    assert held < traced and f.evidence[0].startswith("At most ")
    assert "ms per traced" in f.evidence[0] and "which the profiler slows" in f.evidence[0]
    assert f.est_saving_pct == pytest.approx(100 * held / a.unprofiled_step_us, abs=0.05)


def test_the_straggler_is_named_first_with_its_cause_and_its_saving_bounded_unprofiled() -> None:
    # GIVEN rank 1 busy 15 ms on the host before every step (planted)
    r = run("straggler")
    f = r.diagnosis.findings[0]
    # THEN it is the first finding about the run: rank 1, host work
    assert f.id == "straggler" and f.title == "Rank 1 is a straggler: host work"
    assert r.diagnosis.bound.startswith("Rank 1 holds the others back")
    # AND its saving is what the unprofiled step can lose: the step less the GPU floor (the heaviest
    # GPU's compute and copies, and the transfer: the least exposed communication), not the traced wait
    figures = r.across.overview.ranks
    step = statistics.median(s.unprofiled_step_us for s in r.summaries)
    floor = max(x.gpu_work_us for x in figures) + min(x.communication_us for x in figures)
    wait = r.across.wait_us[0]
    assert step - floor < wait  # the traced wait is the profiler's as much as the straggler's
    # and no more than its GPU idled unprofiled beyond the other's (NVML, the light phase: 50% vs 1.5%)
    s = r.across.overview.slowest
    assert s.gpu_idle - s.others_gpu_idle > 0.4
    # and no more than its own host time beyond the other's as traced (outside ops, within its host's span)
    own = {x.rank: x.host_other_us + x.dataloader_us for x in r.summaries}
    bound = min(step - floor, (s.gpu_idle - s.others_gpu_idle) * step, own[1] - own[0])
    assert f.est_saving_pct == pytest.approx(100 * bound / step, abs=0.05)
    assert any("leaves at most" in e for e in f.evidence)
    assert any("NVML utilization" in e for e in f.evidence)
    # AND it is within ±25% of the saving measured in the same call: balanced against straggler, plain
    assert 0.75 <= f.est_saving_pct / measured_saving_pct() <= 1.25


def test_a_traced_host_excess_far_below_the_unprofiled_idle_gap_is_said_beside_the_estimate() -> None:
    # GIVEN the straggler run as if its trace had put rank 1's own host time only 3.9 ms beyond rank 0's
    # while its GPU idled 18.4 ms per step beyond rank 0's unprofiled (2 GPUs of a shared 4 × H200 host:
    # a neighbour's work, or the profiler, stretched rank 0's host in the trace; ~41% measured)
    r = run("straggler")
    step = statistics.median(s.unprofiled_step_us for s in r.summaries)
    s = dataclasses.replace(r.across.overview.slowest, catch_up_us=3_910.0, unprofiled_bound_us=18_400.0)
    x = dataclasses.replace(r.across, overview=dataclasses.replace(r.across.overview, slowest=s))
    f = straggler(x, r.summaries, step)
    # THEN the estimate keeps the smaller figure, and the evidence gives the larger one and why
    assert f is not None and f.est_saving_pct == pytest.approx(100 * 3_910.0 / step, abs=0.05)
    said = [e for e in f.evidence if e.startswith("Unprofiled, its GPU idled 18.4 ms per step beyond")]
    assert said and "may save up to 18.4 ms" in said[0] and "only 3.91 ms" in said[0]
    assert f.values["unprofiled_bound_us"] == 18_400.0
    # AND the recording as it was, its two figures close (19.0 against 19.2 ms), says nothing more
    plain = straggler(r.across, r.summaries, step)
    assert plain is not None and not any(e.startswith("Unprofiled, its GPU idled") for e in plain.evidence)


def test_the_straggler_is_named_where_the_waiting_ranks_blocked_launches_lie_outside_its_ops(
    tmp_path: Path,
) -> None:
    # GIVEN the straggler run with rank 0's waits moved out of its ops: in the recording rank 0 blocks
    # ~30 ms per traced step in five launches (its launch queue full behind an all-reduce that waits for
    # rank 1) inside ops; here the ops around them are gone, as where the launch comes from no op (on a
    # quiet 2 × H100 host rank 0's own host time as traced came to 22.5 ms against rank 1's 24.1)
    folder = shutil.copytree(FIXTURES / "straggler", tmp_path / "straggler")
    trace = folder / "rank-0" / "trace.json.gz"
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    events = doc["traceEvents"]
    blocked = [
        e
        for e in events
        if e.get("cat") == "cuda_runtime" and e["name"].startswith("cudaLaunch") and e["dur"] > 1000
    ]
    assert len(blocked) >= 10

    def around_a_block(e: dict) -> bool:
        return e.get("cat") == "cpu_op" and any(
            b["tid"] == e["tid"] and e["ts"] <= b["ts"] and b["ts"] + b["dur"] <= e["ts"] + e["dur"]
            for b in blocked
        )

    doc["traceEvents"] = [e for e in events if not around_a_block(e)]
    write_json(trace, doc)
    r = analyze_directory(folder, all_reports=True)
    # THEN rank 0's blocked time is not taken for its own host work: the gaps in which its GPU had more
    # work queued than the gap lasted are the host running ahead
    own = {x.rank: x.host_other_us for x in r.summaries}
    assert own[1] - own[0] >= 15e3
    # AND the straggler is named first, its saving as in the recording
    f = r.diagnosis.findings[0]
    assert f.id == "straggler" and f.title == "Rank 1 is a straggler: host work"
    assert f.est_saving_pct == pytest.approx(run("straggler").diagnosis.findings[0].est_saving_pct, abs=0.5)


def test_the_rank_that_waits_for_the_straggler_is_judged_at_its_own_pace() -> None:
    # GIVEN rank 0, whose all-reduces wait 50+ ms per traced step for rank 1
    r = run("straggler")
    a, d = r.reports[0]
    step = r.across.overview.slowest.unprofiled_step_us
    # THEN its own findings are against its own pace (the step less what it waits), and its wait is
    # not called its own exposed communication: the straggler finding says it
    assert a.unprofiled_step_us == pytest.approx(step - r.across.overview.slowest.catch_up_us)
    # (no more exposed than the balanced run's rank 0 is, 5.5 ms of its 25.4 ms step)
    exposed = d.get("communication_exposed")
    balanced = run("ddp").reports[0][1].get("communication_exposed")
    assert exposed is None or exposed.values["exposed_comm_us"] < balanced.values["exposed_comm_us"]
    assert [t.id for t in r.summaries[0].top_findings] == [f.id for f in d.findings[:3]]


def test_an_uneven_batch_is_uneven_work_first_on_the_rank_with_more() -> None:
    # GIVEN rank 1 with 96 images per step, rank 0 with 64
    r = run("uneven")
    f = r.diagnosis.findings[0]
    # THEN the first finding is the uneven work, on rank 1, with the kernels' different grids as evidence
    assert f.id == "load_imbalance" and f.values["rank"] == 1
    assert "different grids" in f.evidence[1]
    assert r.diagnosis.bound.startswith("Rank 1 holds the others back: uneven work")
    # AND no rank is called a straggler for uneven work (one cause, one finding)
    assert not any(x.id == "straggler" and "uneven" in x.title for x in r.diagnosis.findings)


def test_a_balanced_run_whose_gpus_pace_it_is_quiet_on_stragglers() -> None:
    # GIVEN the balanced run whose unprofiled step (20.3 ms) is its GPUs' work and the transfer, though in
    # the trace one rank spends 11% longer outside communication than the other
    r = run("balanced_first_machine")
    s = r.across.overview.slowest
    # THEN it is balanced: paced by the GPUs, no straggler, no finding about the ranks
    assert s.paced_by == "gpu" and not s.straggler
    assert r.diagnosis.findings == ()
    assert r.diagnosis.bound.startswith("The 2 ranks are balanced")


def test_a_balanced_run_that_the_profiler_moved_apart_is_quiet_unprofiled() -> None:
    # GIVEN the balanced run of the measured call: in the trace rank 1 spends 3× as long outside
    # communication as rank 0 (the profiler slowed its host more), 64 ms vs 21 ms per traced step; its
    # light step (25.4 ms) is longer than its GPUs' work, so a host paces it
    r = run("ddp")
    s = r.across.overview.slowest
    assert s.paced_by == "host" and s.work_us > 2 * s.others_work_us
    # THEN unprofiled neither GPU idles for its host much more than the other (NVML: 84% and 85% busy):
    # no straggler, no finding about the ranks, and the run said to be balanced
    assert s.gpu_idle - s.others_gpu_idle < HOST_IDLE_GAP
    assert not s.straggler
    assert not any(f.id == "straggler" for f in r.diagnosis.findings)
    assert r.diagnosis.bound.startswith("The 2 ranks are balanced: unprofiled, no rank's GPU idles")
    assert "the profiler's doing" in r.diagnosis.bound
    # AND whatever is said of it is bounded by the unprofiled step, not by the traced 3×
    figures = r.across.overview.ranks
    floor = max(x.gpu_work_us for x in figures) + min(x.communication_us for x in figures)
    assert s.catch_up_us <= s.unprofiled_step_us - floor
    for f in r.diagnosis.findings:
        assert f.est_saving_pct <= 100 * (s.unprofiled_step_us - floor) / s.unprofiled_step_us + 0.05


def test_the_straggler_is_the_rank_whose_gpu_waits_for_its_host_unprofiled_whatever_the_trace_says() -> None:
    # GIVEN rank 1 busy 15 ms on the host before every step, on a host where the profiler slowed rank 0's
    # ops twice as much as rank 1's: in the trace rank 0 spends 78.6 ms per step outside communication,
    # rank 1 32.5 ms, and rank 1 waits for rank 0 in every all-reduce
    r = run("straggler", "_h200")
    figures = {x.rank: x for x in r.across.overview.ranks}
    assert figures[0].work_us > 2 * figures[1].work_us
    # THEN the straggler is rank 1, whose GPU idled 55% of each unprofiled step against rank 0's 4%
    # (NVML over the light phase), with its cause, and the trace's rank said to be the profiler's doing
    f = r.diagnosis.findings[0]
    assert f.id == "straggler" and f.title == "Rank 1 is a straggler: host work"
    s = r.across.overview.slowest
    assert s.rank == 1 and s.traced_rank == 0
    assert any("In the trace rank 0 looked the slowest" in e for e in f.evidence)
    # AND its saving is at most its GPU's idle beyond the other's and the step less the GPU floor, and
    # no more than its own host time beyond the other's as traced (Python outside ops, which the profiler
    # hardly slows): within ±25% of the saving measured in the same call (balanced against straggler,
    # plain: 11.9 ms of 41.2)
    step = s.unprofiled_step_us
    assert f.est_saving_pct == pytest.approx(100 * s.catch_up_us / step, abs=0.05)
    assert s.catch_up_us <= (s.gpu_idle - s.others_gpu_idle) * step + 1e-6
    own = {x.rank: x.host_other_us + x.dataloader_us for x in r.summaries}
    assert s.catch_up_us <= own[1] - own[0] + 1e-6
    assert 0.75 <= f.est_saving_pct / measured_saving_pct("_h200") <= 1.25


def test_a_run_whose_hosts_are_all_slow_is_not_a_straggler_run() -> None:
    # GIVEN FSDP2, host-bound on every rank: unprofiled rank 0's GPU idles 55% of the step and rank 1's
    # 10% (its host runs ahead and its GPU waits in the all-gathers), with the same own host work as traced
    r = run("fsdp")
    s = r.across.overview.slowest
    assert s.gpu_idle - s.others_gpu_idle >= HOST_IDLE_GAP
    # THEN no straggler: one host always paces a host-bound run; the ranks are said to be alike
    assert not s.straggler and not any(f.id == "straggler" for f in r.diagnosis.findings)
    assert "every host is slow alike" in r.diagnosis.bound


def test_fsdps_exposure_is_most_of_its_whole_cost_measured_plainly() -> None:
    # GIVEN FSDP2 on the four stages and the root, and the same script's plain steps in the same call
    # with FSDP and with no communication at all (37.6 and 18.9 ms): FSDP's whole cost, 18.7 ms a step
    cost = plain_us("fsdp") - plain_us("none")
    r = run("fsdp")
    # THEN the larger rank's exposed all-gathers and reduce-scatters, as time of the unprofiled step, are
    # most of it and no more than it by far: the rest is FSDP's host work (copies in and out of its flat
    # buffers), which no collective's kernel shows
    exposed = max(
        d.get("fsdp_exposed").est_saving_pct / 100 * a.unprofiled_step_us for a, d in r.reports.values()
    )
    assert 0.75 <= exposed / cost <= 1.05, (exposed, cost)


def test_a_host_bound_fsdp_run_is_not_a_straggler_run_once_its_host_gaps_ahead_of_the_gpu_are_out() -> None:
    # GIVEN FSDP2 on the second 2 × H200 call, both ranks doing the same work: unprofiled rank 1's GPU idles
    # 56% of the step and rank 0's 14% (one host always paces a host-bound run), and in the trace rank 1
    # has 1.5–2 ms a step of gaps in no op that open with hundreds of launches queued on its GPU
    r = run("fsdp", "_h200_b")
    idle = {x.rank: 1 - x.clocks.util_mean_pct / 100 for x in r.summaries}
    assert idle[1] - idle[0] >= HOST_IDLE_GAP
    # THEN its own host time, those gaps left out, is not 5% of the step beyond rank 0's: no straggler
    # (counting them against the steps' windows, it read as a 7.8% straggler on work neither rank did)
    step = r.across.overview.slowest.unprofiled_step_us
    own = {x.rank: x.host_other_us + x.dataloader_us for x in r.summaries}
    assert own[1] - own[0] < 0.05 * step
    assert not r.across.overview.slowest.straggler
    assert not any(f.id == "straggler" for f in r.diagnosis.findings)


def test_the_balanced_run_on_the_noisy_host_is_quiet() -> None:
    # GIVEN the balanced run of the same call: rank 1 twice as long outside communication in the trace
    r = run("ddp", "_h200")
    # THEN no straggler: unprofiled both GPUs idle alike (83% and 81% busy)
    assert not any(f.id == "straggler" for f in r.diagnosis.findings)
    assert r.diagnosis.bound.startswith("The 2 ranks are balanced")


def test_fsdp_all_gathers_and_reduce_scatters_are_reported_within_the_step() -> None:
    # GIVEN FSDP2 on ResNet-50's four stages and the root
    r = run("fsdp")
    for rank, (a, d) in r.reports.items():
        f = d.get("fsdp_exposed")
        # THEN each rank says how much of its all-gather and reduce-scatter runs alone, within its step
        assert f is not None, rank
        assert f.values["exposed_all_gather_us"] > 0 and f.values["exposed_reduce_scatter_us"] > 0
        assert f.est_saving_pct <= 100
        assert a.comms is not None and {"all_gather", "reduce_scatter"} <= set(
            a.comms.exposed_by_collective_us
        )


def test_the_straggler_is_named_where_the_waiting_ranks_host_finishes_its_steps_early() -> None:
    # GIVEN rank 1 busy 15 ms on the host before every step, on a 4 × H100 host with nothing else on it:
    # rank 0's host runs ahead of its GPU (up to 800 launches queued, never blocked on a full queue) and
    # finishes each traced step's span 9–26 ms before the step's window closes, its GPU still waiting for
    # rank 1 in the all-reduces
    r = run("straggler", "_h100_b")
    a0 = r.reports[0][0]
    assert all(st.cpu.span_us < st.cpu.duration_us - 5e3 for st in a0.steps)
    # THEN rank 0's own host time is its host's, within its spans (not the rest of the windows, which put
    # 27.5 ms of host time per step on the waiting rank against the straggler's 24.6 and named no one):
    # rank 1 is the straggler, host work, first
    own = {x.rank: x.host_other_us + x.dataloader_us for x in r.summaries}
    assert own[1] - own[0] > 10e3
    f = r.diagnosis.findings[0]
    assert f.id == "straggler" and f.title == "Rank 1 is a straggler: host work"
    # AND its saving is within ±25% of the saving measured in the same call: balanced against straggler,
    # plain (37% of the step)
    assert 0.75 <= f.est_saving_pct / measured_saving_pct("_h100_b") <= 1.25


def test_the_rank_that_waits_in_a_gpu_paced_balanced_run_is_not_said_to_hold_the_others_back() -> None:
    # GIVEN the balanced run of the same call: unprofiled its step (20.5 ms) is its GPUs' work and the
    # transfer, and in the trace rank 0 has 10% more GPU work than rank 1, while its all-reduces wait
    # 28 ms a traced step for rank 1 (its kernels run beside NCCL's waiting ones)
    r = run("ddp", "_h100_b")
    s = r.across.overview.slowest
    assert s.paced_by == "gpu" and s.rank == 0 and s.spread > 0.05
    figures = {x.rank: x for x in r.across.overview.ranks}
    assert figures[0].communication_us - figures[1].communication_us > s.catch_up_us
    # THEN no straggler: the run is said to be balanced, with no finding about the ranks
    assert not s.straggler
    assert not any(f.id in ("straggler", "load_imbalance") for f in r.diagnosis.findings)
    assert r.diagnosis.bound.startswith("The 2 ranks are balanced")
