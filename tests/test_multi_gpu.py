"""What several GPUs need diagnosed, on the 2-GPU DDP recordings (tests/fixtures/ddp and ddp_stack:
rank 1 a planted straggler, 8 ms of host work per step) and on crafted traces where no recording
exists yet (FSDP, a pipeline stage, a link-bound all-reduce, uneven ranks, a slower GPU). Every figure
checked is computed here from the raw events, independently of gpudoctor: the collectives' sizes from
`record_param_comms`, their kernels through the launch's correlation and External id, the transfer
time of each call as its shortest kernel over the ranks, NCCL-tests' bus bandwidth, and the
communication with and without compute beside it per step by a plain sweep over the intervals."""

from __future__ import annotations

import functools
import gzip
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from comm_crafted import Crafted, K
from conftest import write_json
from gpudoctor.analysis.across_ranks import AcrossRanks, across_ranks
from gpudoctor.analysis.rank_summary import Clocks, RankSummary, summarize_rank
from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.rules import diagnose
from gpudoctor.rules.across import diagnose_ranks
from gpudoctor.trace import load_trace
from gpudoctor.trace.steps import find_steps
from gpudoctor.util.units import fmt_bytes, fmt_rate, fmt_us

FIXTURES = Path(__file__).parent / "fixtures"
RECORDINGS = ("ddp", "ddp_stack")


# --- independent readings of the raw traces -------------------------------------------------------


@functools.cache
def raw(name: str, rank: int) -> list[dict[str, Any]]:
    with gzip.open(FIXTURES / name / f"rank{rank}.json.gz", "rt") as f:
        return json.load(f)["traceEvents"]


def unprofiled(name: str, rank: int) -> float:
    manifest = json.loads((FIXTURES / name / "manifest.json").read_text())
    return manifest["ranks"][f"rank{rank}"]["unprofiled_step_us"]["median"]


def calls(name: str, rank: int) -> list[tuple[int, float | None]]:
    """Each recorded collective call in issue order: (bytes, its NCCL kernel's duration or None)."""
    events = raw(name, rank)
    ops = sorted((e for e in events if e.get("name") == "record_param_comms"), key=lambda e: e["ts"])
    ext_of_launch = {
        e["args"]["correlation"]: e["args"].get("External id")
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
    }
    kernel_of_op = {}
    for k in events:
        if k.get("cat") == "kernel" and "nccl" in k["name"].lower():
            kernel_of_op[ext_of_launch.get(k["args"]["correlation"])] = k
    size = {"Float": 4, "BFloat16": 2}
    out = []
    for op in ops:
        k = kernel_of_op.get(op["args"]["External id"])
        out.append((op["args"]["In msg nelems"] * size[op["args"]["dtype"]], k["dur"] if k else None))
    return out


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(min(b, hi) - max(a, lo), 0.0) for a, b in intervals)


def intersect(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(max(a, c), min(b, d)) for a, b in x for c, d in y if min(b, d) > max(a, c)]


def comm_per_step(name: str, rank: int) -> list[tuple[float, float]]:
    """(communication, of it with no compute beside it) per profiled step, in µs: kernels from the raw
    events, each step's window from gpudoctor's steps (the windows are the analysis's definition)."""
    events = raw(name, rank)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    comm = union([(k["ts"], k["ts"] + k["dur"]) for k in kernels if "nccl" in k["name"].lower()])
    compute = union([(k["ts"], k["ts"] + k["dur"]) for k in kernels if "nccl" not in k["name"].lower()])
    trace = load_trace(FIXTURES / name / f"rank{rank}.json.gz")
    origin = trace.meta.origin_us
    out = []
    for s in find_steps(trace):
        lo, hi = s.window_start_us + origin, s.window_end_us + origin
        total = length(comm, lo, hi)
        out.append((total, total - length(intersect(comm, compute), lo, hi)))
    return out


# --- gpudoctor's readings ---------------------------------------------------------------------------


@functools.cache
def analysis(name: str, rank: int) -> Analysis:
    return analyze(
        load_trace(FIXTURES / name / f"rank{rank}.json.gz"), unprofiled_step_us=unprofiled(name, rank)
    )


@functools.cache
def summaries(name: str) -> tuple[RankSummary, ...]:
    return tuple(summarize_rank(analysis(name, r)) for r in (0, 1))


def across(name: str) -> AcrossRanks:
    return across_ranks(summaries(name))


@pytest.mark.parametrize("name", RECORDINGS)
def test_every_collective_call_is_joined_to_its_kernel_with_its_size(name: str) -> None:
    for rank in (0, 1):
        got = [(c.bytes, c.dur_us) for c in analysis(name, rank).comms.calls]
        assert got == calls(name, rank)  # durations as Kineto wrote them, to the bit
        assert len(got) == 21  # 7 all-reduces (DDP's buckets) in each of the 3 profiled steps


@pytest.mark.parametrize("name", RECORDINGS)
def test_exposed_and_overlapped_communication_per_step_match_the_kernels(name: str) -> None:
    for rank in (0, 1):
        a = analysis(name, rank)
        for step, (total, exposed), timeline in zip(
            a.comms.steps, comm_per_step(name, rank), a.timeline.steps, strict=True
        ):
            # to 0.05 µs: the raw timestamps are µs since the epoch (4.5e12), resolved to 0.001 µs each
            assert step.comm_us == pytest.approx(total, abs=0.05)
            assert step.exposed_us == pytest.approx(exposed, abs=0.05)
            assert step.overlapped_us == pytest.approx(total - exposed, abs=0.05)
            # the same exposed time the GPU timeline counts as communication
            assert timeline.busy_by_kind_us["communication"] == pytest.approx(exposed, abs=0.05)


@pytest.mark.parametrize("name", RECORDINGS)
def test_bus_bandwidth_of_each_collective_is_its_transfer_where_no_rank_waits(name: str) -> None:
    # GIVEN each call's kernel on both ranks: the shortest is the transfer (that rank waited for no one)
    pairs = list(zip(calls(name, 0), calls(name, 1), strict=True))
    by_size: dict[int, list[float]] = {}
    for (size0, d0), (size1, d1) in pairs:
        assert size0 == size1 and d0 is not None and d1 is not None
        by_size.setdefault(size0, []).append(min(d0, d1))
    # THEN per message size: the median transfer and NCCL-tests' bus bandwidth, 2(n-1)/n = 1 for n = 2
    x = across(name)
    assert {c.bytes for c in x.collectives} == set(by_size)
    for c in x.collectives:
        transfer = statistics.median(by_size[c.bytes])
        assert (c.collective, c.group_size, c.calls) == ("all_reduce", 2, len(by_size[c.bytes]))
        assert c.transfer_us == pytest.approx(transfer)
        assert c.busbw == pytest.approx(2 * (2 - 1) / 2 * c.bytes / (transfer * 1e-6))
        assert c.link_share == pytest.approx(c.busbw / 450e9)  # NVLink 4 (18 × 25 GB/s), the H200's
    # AND each rank's wait: its kernels beyond each call's shortest, per step
    for rank in (0, 1):
        waits = sum(d[rank][1] - min(d[0][1], d[1][1]) for d in pairs) / 3
        assert x.wait_us[rank] == pytest.approx(waits)
    assert x.wait_us[1] == 0 and x.wait_us[0] > 15_000  # rank 0 waits for the straggler, not the reverse


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_straggler_is_found_with_its_cause_and_the_others_wait(name: str) -> None:
    # GIVEN the two ranks, rank 1 doing 8 ms of host work per step (planted)
    x = across(name)
    d = diagnose_ranks(x, summaries(name))
    f = d.findings[0]
    # THEN it is the first finding about the run: rank 1, its GPU waiting for its host
    assert f.id == "straggler" and f.title == "Rank 1 is a straggler: host work"
    assert f.values["rank"] == 1 and "neither in the DataLoader nor in synchronizations" in f.evidence[2]
    # AND what fixing it saves at most: rank 0's wait, never more than the unprofiled step less the
    # GPU floor (the heaviest GPU's compute and copies, and the transfer: the least exposed communication)
    step = statistics.median([unprofiled(name, 0), unprofiled(name, 1)])
    figures = x.overview.ranks
    floor = max(r.gpu_work_us for r in figures) + min(r.communication_us for r in figures)
    assert x.overview.slowest.paced_by == "host" and x.overview.slowest.catch_up_us < x.wait_us[0]
    assert f.est_saving_pct == pytest.approx(100 * min(x.wait_us[0], step - floor) / step, abs=0.05)
    # AND the transfers are shown not to be the limit, at the rate computed from the kernels
    biggest = max(x.collectives, key=lambda c: c.bytes * c.calls)
    assert any(
        f"moves at {fmt_rate(biggest.busbw)} bus bandwidth where no rank waits" in e for e in f.evidence
    )
    if name == "ddp_stack":  # recorded with stacks: the planted function is named
        assert f.sources == ("record_ddp.py(50): straggle",)


def test_exposed_communication_finding_gives_the_per_step_split_and_the_buckets() -> None:
    f = diagnose(analysis("ddp", 0)).get("communication_exposed")
    assert f is not None
    steps = comm_per_step("ddp", 0)
    total = statistics.median(t for t, _ in steps)
    exposed = statistics.median(e for _, e in steps)
    assert (
        f"Per step (median): {fmt_us(total)} of communication, {fmt_us(total - exposed)} of it beside compute "
        f"(overlapped) and {fmt_us(exposed)} alone (exposed)." in f.evidence
    )
    sizes = ", ".join(fmt_bytes(size) for size, _ in calls("ddp", 0)[7:14])  # the second profiled step
    assert any(e.startswith(f"7 all-reduces per step, in issue order: {sizes} (DDP") for e in f.evidence)


def test_neither_link_finding_fires_where_the_transfer_is_half_the_link() -> None:
    # the transfers reach 40-62% of NVLink: neither link-bound (70%) nor far below (25%)
    assert "comm_link_bound" not in {f.id for r in (0, 1) for f in diagnose(analysis("ddp", r)).findings}
    assert "comm_bandwidth_low" not in {
        f.id for f in diagnose_ranks(across("ddp"), summaries("ddp")).findings
    }


# --- crafted traces ---------------------------------------------------------------------------------


def crafted(tmp_path: Path, c: Crafted, unprofiled_us: float | None = None) -> Analysis:
    path = write_json(tmp_path / f"rank{c.rank}.json", c.doc())
    return analyze(load_trace(path), unprofiled_step_us=unprofiled_us)


def test_fsdp_all_gathers_with_no_compute_beside_them_are_reported(tmp_path: Path) -> None:
    # GIVEN FSDP's pattern: each unit's all-gather, then its compute; the first two all-gathers exposed
    # (300 + 200 µs), the third under the second unit's compute; a reduce-scatter half under compute
    step = [
        K(0, 300, "all_gather", 1 << 24, 8), K(300, 1000), K(1300, 200, "all_gather", 1 << 24, 8),
        K(1500, 2000), K(1600, 400, "all_gather", 1 << 24, 8), K(3500, 1000),
        K(4000, 1000, "reduce_scatter", 1 << 25, 8),
    ]  # fmt: skip
    a = crafted(tmp_path, Crafted(steps=[step] * 3, world=8))
    f = diagnose(a).get("fsdp_exposed")
    assert f is not None
    exposed_ag, exposed_rs = 300 + 200, 500  # the reduce-scatter's 4000-5000 against compute to 4500
    assert f.values["exposed_all_gather_us"] == pytest.approx(exposed_ag)
    assert f.values["exposed_reduce_scatter_us"] == pytest.approx(exposed_rs)
    assert (
        f.evidence[1]
        == f"3 all-gathers per step, {fmt_bytes(2 * 8 * (1 << 24))} median (one per FSDP unit in forward, again in backward where parameters were resharded)."
    )
    # and the same time is not claimed again as DDP-style exposed communication
    assert "communication_exposed" not in {x.id for x in diagnose(a).findings}


def test_a_pipeline_stage_waiting_on_its_neighbours_is_its_bubble(tmp_path: Path) -> None:
    # GIVEN a stage that receives, computes, sends: 1.5 ms per step waiting in send/recv alone
    step = [K(0, 1000, "send_recv", 1 << 20), K(1000, 4000), K(5000, 500, "send_recv", 1 << 20)]
    a = crafted(tmp_path, Crafted(steps=[step] * 3, step_us=8000))
    f = diagnose(a).get("pipeline_bubble")
    assert f is not None and f.values["p2p_exposed_us"] == pytest.approx(1500)
    # the idle time is the rest of the step: the mean step less the GPU's mean busy time per step
    idle = statistics.mean(s.duration_us for s in a.steps) - statistics.mean(s.gpu.busy_us for s in a.steps)
    assert f.values["idle_us"] == pytest.approx(idle)


def test_an_all_reduce_at_the_links_speed_is_link_bound(tmp_path: Path) -> None:
    # GIVEN a 256 MiB bf16 all-reduce over 8 GPUs alone after compute, at 80% of NVLink 4 (360 GB/s bus)
    nelems, n = 128 << 20, 8
    busbw = 0.8 * 450e9
    dur = 2 * (n - 1) / n * nelems * 2 / busbw * 1e6
    step = [K(0, 3000), K(3000, dur, "all_reduce", nelems, n)]
    a = crafted(tmp_path, Crafted(steps=[step] * 3, step_us=3000 + dur + 500))
    f = diagnose(a).get("comm_link_bound")
    assert f is not None and f.values["busbw"] == pytest.approx(busbw)
    assert f.evidence[0].startswith(
        f"The {fmt_bytes(nelems * 2)} all-reduce (3 calls) reaches {fmt_rate(busbw)} bus bandwidth"
    )


def two_ranks(tmp_path: Path, rank0: list[K], rank1: list[K]) -> tuple[RankSummary, RankSummary]:
    out = []
    for r, layout in enumerate((rank0, rank1)):
        (tmp_path / f"r{r}").mkdir()
        out.append(summarize_rank(crafted(tmp_path / f"r{r}", Crafted(rank=r, steps=[layout] * 3))))
    return out[0], out[1]


def test_collectives_slow_even_where_no_rank_waits(tmp_path: Path) -> None:
    # GIVEN a 64 MiB all-reduce that takes 4 ms on both ranks: 16.8 GB/s bus, 3.7% of NVLink 4
    step = [K(0, 2000), K(2000, 4000, "all_reduce", 32 << 20)]
    s = two_ranks(tmp_path, step, step)
    d = diagnose_ranks(across_ranks(s), s)
    f = d.get("comm_bandwidth_low")
    assert f is not None
    busbw = (64 << 20) / 4000e-6
    assert f.values["busbw"] == pytest.approx(busbw)
    # reaching 70% of the link would take 64 MiB / 315 GB/s: the rest of the 4 ms is the bound
    assert f.values["saving_us"] == pytest.approx(4000 - (64 << 20) / (0.7 * 450e9) * 1e6)


def test_a_slower_gpu_and_uneven_work_are_told_apart_by_the_kernels_grids(tmp_path: Path) -> None:
    # GIVEN rank 1's compute 50% longer (3 ms, not 2 ms) and rank 0 waiting that long in the all-reduce
    fast = [K(0, 2000), K(2000, 1200, "all_reduce", 8 << 20)]
    slow = [K(0, 3000), K(3000, 200, "all_reduce", 8 << 20)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    s = two_ranks(tmp_path / "a", fast, slow)
    d = diagnose_ranks(across_ranks(s), s)
    f = d.get("straggler")
    # THEN with the same grids: a slower GPU, and without NVML the clocks cannot say more
    assert f is not None and f.title == "Rank 1 is a straggler: slower GPU"
    assert "no NVML record" in f.evidence[2] and "load_imbalance" not in {x.id for x in d.findings}
    # AND with NVML's clocks of the run: throttled
    clocks = Clocks(1410.0, 1980, {"sw_thermal": 0.6})
    s1 = RankSummary(**{**vars(s[1]), "clocks": clocks})
    s0 = RankSummary(**{**vars(s[0]), "clocks": Clocks(1980.0, 1980, {})})
    f = diagnose_ranks(across_ranks((s0, s1)), (s0, s1)).get("straggler")
    assert f is not None and "its SM clock averaged 1410 MHz busy against 1980 MHz" in f.evidence[2]
    assert "thermal (software slowdown) in 60% of samples (clock throttling)" in f.evidence[2]
    # GIVEN instead the same longer compute launched with a larger grid: larger tensors on rank 1
    uneven = [K(0, 3000, grid=(264, 1, 1)), K(3000, 200, "all_reduce", 8 << 20)]
    s = two_ranks(tmp_path / "b", fast, uneven)
    d = diagnose_ranks(across_ranks(s), s)
    imbalance, straggler = d.get("load_imbalance"), d.get("straggler")
    # (compute per step: its share of the profiled window times the median step, so within 0.1%)
    assert imbalance is not None and imbalance.values["compute_us"] == pytest.approx(3000, rel=1e-3)
    step = statistics.median(r.figures.step_p50_us for r in s)
    assert imbalance.est_saving_pct == pytest.approx(100 * (3000 - 2500) / step, abs=0.1)
    # AND one cause is one finding: the straggler it makes is load_imbalance's, not said twice
    assert straggler is None and d.bound.startswith("Rank 1 holds the others back")
