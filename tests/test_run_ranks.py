"""`gpudoctor run` as the launcher's entry: `torchrun --nproc-per-node 2 -m gpudoctor run` (and
`gpudoctor run --nproc 2`) on a gloo DDP script on the CPU writes every rank's `rank-K/`, the ranks
trace the same steps, one rank combines them; a rank killed mid-run leaves the others' results. And
the pieces: the ranks' meetings in a store (threads standing in for ranks), the torchrun command
line, the GPU's link read from NVML (a fake NVML)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.monitor.topology import read_link
from gpudoctor.runner.capture import LiveOptions
from gpudoctor.runner.ranks import RankEnv, RankRun
from gpudoctor.runner.torchrun import torchrun_argv
from gpudoctor.trace import load_trace
from gpudoctor.trace.steps import find_steps

dist = pytest.importorskip("torch.distributed")
SCRIPT = Path(__file__).parent / "fixtures" / "scripts" / "ddp_gloo.py"
REPO = Path(__file__).resolve().parent.parent
FAST = [
    "--warmup",
    "2",
    "--light-steps",
    "5",
    "--light-seconds",
    "0",
    "--warmup-seconds",
    "0",
    "--steps",
    "3",
    "--no-nvml",
]


def torchrun(
    out: Path, *extra: str, env: dict[str, str] | None = None, nproc: int = 2, monitor_s: float = 0.1
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           f"--monitor-interval={monitor_s}", "-m", "gpudoctor", "run", "--out", str(out), *FAST, *extra,
           str(SCRIPT)]  # fmt: skip
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "GPUDOCTOR_COMBINE_WAIT_S": "3", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), full_env.get("PYTHONPATH", "")])
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=240)


def rank_info(out: Path, rank: int) -> dict[str, Any]:
    return json.loads((out / f"rank-{rank}" / "rank.json").read_text())


def record(out: Path, rank: int) -> dict[str, Any]:
    return json.loads((out / f"rank-{rank}" / "record.json").read_text())


@pytest.mark.slow
def test_torchrun_two_ranks_write_both_on_the_same_steps_and_the_combined_report(tmp_path: Path) -> None:
    # GIVEN a gloo DDP script run as two ranks by torchrun, each under gpudoctor run
    out = tmp_path / "run"
    result = torchrun(out)
    assert result.returncode == 0, result.stderr[-3000:]
    # THEN each rank wrote its directory: a finished record and its trace
    for rank in (0, 1):
        assert record(out, rank)["outcome"] == "stopped"
        assert load_trace(out / f"rank-{rank}" / "trace.json.gz").meta.rank == rank
    # AND both entered each phase at the same step, so their traces cover the same steps
    phases = [rank_info(out, r)["phases"] for r in (0, 1)]
    # (light after the first boundary and --warmup 2 whole steps, 5 timed, 1 + 3 traced)
    assert phases[0] == phases[1] == {"light": 3, "traced": 8, "done": 12}
    steps = [[s.number for s in find_steps(load_trace(out / f"rank-{r}" / "trace.json.gz"))] for r in (0, 1)]
    assert steps[0] == steps[1] and len(steps[0]) == 3
    # AND one rank combined them: the ranks document with both, aligned, and the HTML report
    doc = json.loads((out / "analysis.json").read_text())
    assert doc["schema"] == "gpudoctor.ranks/1" and len(doc["ranks"]) == len(doc["summaries"]) == 2
    assert doc["run"]["aligned"] and doc["run"]["ranks_traced"] == [0, 1]
    assert '<section id="ranks">' in (out / "report.html").read_text()
    assert "2 of 2 ranks traced the same steps: 10–12 recorded" in result.stdout
    # AND gpudoctor report re-renders the run directory from it
    from typer.testing import CliRunner

    from gpudoctor.cli.main import app

    md = tmp_path / "r.md"
    assert CliRunner().invoke(app, ["report", str(out), "-f", "md", "-o", str(md)]).exit_code == 0
    assert "### Ranks" in md.read_text()


@pytest.mark.slow
def test_ranks_meet_at_each_phase_so_a_slower_rank_is_waited_for(tmp_path: Path) -> None:
    # GIVEN two ranks that share no process group (nothing in the script keeps them in step), rank 1
    # 100 ms slower per step: alone, it would reach the traced phase (step 7) 0.7 s after rank 0
    out = tmp_path / "run"
    result = torchrun(out, env={"NO_PG": "1", "SLOW_RANK": "1", "SLOW_MS": "100", "STEPS": "30"})
    assert result.returncode == 0, result.stderr[-3000:]
    # THEN rank 0 waited for rank 1 before tracing, and their profiled steps start together
    assert rank_info(out, 0)["waited_s"]["traced"] > 0.3
    starts = []
    for r in (0, 1):
        trace = load_trace(out / f"rank-{r}" / "trace.json.gz")
        starts.append(trace.meta.epoch_origin_ns + find_steps(trace)[0].start_us * 1e3)
    # (same host, same clock; half the 0.7 s apart they would be alone: 0.16 s seen with 12 ranks on 2 cores)
    assert abs(starts[0] - starts[1]) < 0.35e9


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "monitor_s", "ended"),
    # sigterm-first one step later: at step 9 rank 0's profiler has only just turned active, and a SIGTERM
    # that came with that boundary left no whole traced step (1 of 3 full suites, session 36)
    [({}, 5.0, ("exception", 1)), ({"HANG_RANK": "0", "HANG_AT": "10", "KILL_AT": "10"}, 0.1, ("exit", 143))],
    ids=["all-reduce-fails", "sigterm-first"],
)
def test_a_rank_killed_mid_run_leaves_the_others_results(
    tmp_path: Path, how: dict[str, str], monitor_s: float, ended: tuple[str, int]
) -> None:
    # GIVEN rank 1 killed (SIGKILL) in the traced phase: no trace of its own; rank 0 learns it from its
    # failed all-reduce or, when it is elsewhere (here: asleep), from torchrun's SIGTERM. Which comes
    # first is a race (torchrun looks every 0.1 s): torchrun looks every 5 s where the all-reduce's
    # exception must win, on a loaded machine too
    out = tmp_path / "run"
    result = torchrun(out, env={"KILL_RANK": "1", "KILL_AT": "9", **how}, monitor_s=monitor_s)
    assert result.returncode != 0
    # THEN rank 0's results are there: its record (how it ended) and the steps it traced
    rank0 = record(out, 0)
    assert (rank0["outcome"], rank0["exit_code"]) == ended and rank0["light_median_us"] > 0
    assert find_steps(load_trace(out / "rank-0" / "trace.json.gz"))
    # AND rank 1's record as it was written at its last phase change: its light phase
    killed = record(out, 1)
    assert killed["outcome"] == "running" and len(killed["light"]["times_us"]) == 5
    # AND rank 0 combined what there is, saying which rank left no trace
    doc = json.loads((out / "analysis.json").read_text())
    assert doc["run"]["ranks_traced"] == [0] and doc["run"]["ranks_seen"] == [0, 1]
    assert "ranks without a trace: [1]" in result.stdout, result.stderr[-4000:]


@pytest.mark.slow
def test_nproc_starts_torchrun_with_the_same_options(tmp_path: Path) -> None:
    # GIVEN the shorthand
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    cmd = [
        sys.executable,
        "-m",
        "gpudoctor",
        "run",
        "--nproc",
        "2",
        "--out",
        str(out),
        "--light",
        *FAST[:6],
        str(SCRIPT),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    # THEN both ranks ran with --light: records with light steps, no trace
    for rank in (0, 1):
        r = record(out, rank)
        assert r["options"]["light_only"] and len(r["light"]["times_us"]) == 5 and not r["trace_files"]


def test_the_torchrun_command_line_carries_every_option() -> None:
    options = LiveOptions(
        warmup=1, light_steps=7, light_seconds=0.5, steps=4, with_stack=True, nvml=False, nvml_interval_s=0.25
    )
    argv = torchrun_argv(4, Path("out"), options, True, ["pkg.train", "--lr", "3"])
    assert argv[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    rest = argv[argv.index("gpudoctor") + 2 :]
    assert rest[-4:] == ["-m", "pkg.train", "--lr", "3"]
    assert {"--with-stack", "--no-nvml"} <= set(rest) and "--light" not in rest
    assert rest[rest.index("--light-steps") + 1] == "7" and rest[rest.index("--nvml-interval") + 1] == "250"
    assert rest[rest.index("--light-seconds") + 1] == "0.5" and rest[rest.index("--module-depth") + 1] == "3"


# --- the ranks' meetings, with threads as ranks and an in-process store ----------------------------


class Capture:
    """What RankRun reads of a capture."""

    def __init__(self) -> None:
        self.steps_seen = 0

    def result(self) -> dict[str, Any]:
        return {"steps_seen": self.steps_seen, "environment": None, "notes": ()}


def ranks(tmp_path: Path, world: int, store: Any) -> list[RankRun]:
    out = []
    for r in range(world):
        env = RankEnv(r, world, r, "localhost", 0, "test", True)
        out.append(
            RankRun(env, dist.PrefixStore("gpudoctor/test/", store), tmp_path, ["train.py"], "now", {})
        )
    return out


def in_threads(fns: list[Any]) -> list[Any]:
    results: list[Any] = [None] * len(fns)

    def call(i: int) -> None:
        results[i] = fns[i]()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_ranks_meet_and_a_missing_rank_is_named_after_the_timeout(tmp_path: Path) -> None:
    store = dist.HashStore()
    run = ranks(tmp_path, 3, store)
    for r in run:
        r.timeout_s = 0.3
    # all three arrive: nobody is missing
    in_threads([lambda r=r: r.meet("light", 5) for r in run])
    assert all(not r.info.missing for r in run)
    # rank 2 never reaches the traced phase: the others go on after the timeout and name it
    in_threads([lambda r=r: r.meet("traced", 10) for r in run[:2]])
    assert run[0].info.missing["traced"] == run[1].info.missing["traced"] == [2]
    assert run[0].info.waited_s["traced"] >= 0.3


def test_one_rank_combines_the_last_to_finish(tmp_path: Path) -> None:
    run = ranks(tmp_path, 3, dist.HashStore())
    elected = in_threads([lambda r=r: r.finish(combine_wait_s=5) for r in run])
    assert sorted(elected) == [False, False, True]


def test_rank_0_combines_when_a_rank_never_finishes(tmp_path: Path) -> None:
    run = ranks(tmp_path, 3, dist.HashStore())
    # rank 2 was killed: ranks 0 and 1 finish; rank 0 waits, then combines
    assert in_threads(
        [lambda: run[0].finish(combine_wait_s=0.3), lambda: run[1].finish(combine_wait_s=0.3)]
    ) == [
        True,
        False,
    ]


def test_each_phase_writes_the_record_as_it_stands(tmp_path: Path) -> None:
    run = ranks(tmp_path, 1, dist.HashStore())[0]
    capture = Capture()
    capture.steps_seen = 4
    run.on_phase("traced", capture)
    assert record(tmp_path, 0)["outcome"] == "running" and record(tmp_path, 0)["steps_seen"] == 4
    assert rank_info(tmp_path, 0)["phases"] == {"traced": 4}


def test_not_a_rank_of_several_is_an_ordinary_run() -> None:
    assert RankEnv.from_environ({}) is None
    assert (
        RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}) is None
    )
    env = RankEnv.from_environ(
        {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500", "LOCAL_RANK": "1",
         "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    )  # fmt: skip
    assert env == RankEnv(1, 2, 1, "h", 29500, "abc-0", True)


# --- the link, from a fake NVML -------------------------------------------------------------------


def fake_nvml(nvlinks: int, version: int = 4) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVML_FEATURE_ENABLED = 1  # type: ignore[attr-defined]
    m.nvmlInit = lambda: None  # type: ignore[attr-defined]
    m.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByUUID = lambda uuid: uuid  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]

    def state(handle: Any, link: int) -> int:
        if link >= nvlinks:
            raise RuntimeError("not supported")
        return 1

    m.nvmlDeviceGetNvLinkState = state  # type: ignore[attr-defined]
    m.nvmlDeviceGetNvLinkVersion = lambda h, link: version  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16  # type: ignore[attr-defined]
    return m


def test_the_link_is_nvlink_where_links_are_active_else_pcie() -> None:
    link, why = read_link("GPU-1", nvml=fake_nvml(18))
    assert why is None and link is not None
    assert (link.kind, link.nvlink_links, link.bytes_per_s) == ("nvlink", 18, 18 * 25e9)
    link, _ = read_link("GPU-1", nvml=fake_nvml(0))
    assert link is not None and (link.kind, link.pcie_gen, link.pcie_width) == ("pcie", 5, 16)
    assert link.bytes_per_s == pytest.approx(16 * 3.938e9)


def test_sigterm_ends_the_script_then_only_cuts_the_wait_short(tmp_path: Path) -> None:
    import signal
    import time

    run = ranks(tmp_path, 2, dist.HashStore())[0]
    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        run._install_sigterm()
        # while the script runs, SIGTERM exits it as sys.exit(143) would: its results get written
        with pytest.raises(SystemExit) as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        assert stop.value.code == 143
        # once it has ended, SIGTERM stops rank 0 waiting for the others: it combines at once
        t0 = time.perf_counter()
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        assert run.finish(combine_wait_s=30) is True
        timer.join()
        assert 0.2 <= time.perf_counter() - t0 < 10
        run.close()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.slow
def test_a_script_stopped_after_its_trace_has_its_process_group_ended(tmp_path: Path) -> None:
    # GIVEN a gloo DDP script that never reaches its own destroy_process_group: gpudoctor stops it at a
    # step boundary once its steps are traced (torch warns at exit on every NCCL rank otherwise)
    result = torchrun(tmp_path / "run", env={"SAY_PG_AT_EXIT": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    # THEN on every rank the group is ended, as the script's own end would have
    for rank in (0, 1):
        assert record(tmp_path / "run", rank)["outcome"] == "stopped"
        assert f"rank {rank}: process group up at exit: False" in result.stdout


@pytest.mark.slow
def test_a_script_too_short_for_the_phases_under_torchrun_says_what_to_pass(tmp_path: Path) -> None:
    # GIVEN a script of 6 steps: it ends before its traced phase (warm-up 2, 5 timed, 1 + 3 traced)
    result = torchrun(tmp_path / "run", env={"STEPS": "6"})
    assert result.returncode == 0, result.stderr[-3000:]
    out = " ".join(result.stdout.split())  # the terminal may wrap the line
    # THEN one line says what happened, why it is not run again, and the options that fit its steps
    assert "no rank was traced: the script ended after 6 steps, before its traced phase" in out
    assert "under torchrun gpudoctor does not run it again" in out
    # (1 warm-up, 2 timed, then the profiler's own warm-up step and 1 traced: 5 of its 6)
    assert "--warmup 1 --warmup-seconds 0 --light-steps 2 --light-seconds 0 --steps 1" in out
    assert not (tmp_path / "run" / "analysis.json").exists()


def test_fix_under_torchrun_leaves_the_session_to_rank_0_and_refuses_several_nodes(tmp_path: Path) -> None:
    # GIVEN `gpudoctor fix` started as one rank of several (torchrun's environment)
    from typer.testing import CliRunner

    from gpudoctor.cli.main import app

    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29599"}  # fmt: skip
    # WHEN it is rank 1: rank 0 runs the session, each round a group of its own; this one ends at once
    result = CliRunner().invoke(app, ["fix", "--out", str(tmp_path / "f"), str(SCRIPT)], env=env)
    assert result.exit_code == 0, result.output
    assert "rank 0 runs the session" in result.output and not (tmp_path / "f").exists()
    # WHEN the ranks span nodes (2 ranks here of 4): one line says why not, exit 2, no traceback
    result = CliRunner().invoke(app, ["fix", str(SCRIPT)], env={**env, "WORLD_SIZE": "4"})
    assert result.exit_code == 2
    assert "on this node alone" in result.output and "Traceback" not in result.output


def test_the_ranks_notes_are_printed_once_each_with_the_ranks_that_say_them(tmp_path: Path) -> None:
    # GIVEN two ranks whose light phases did not settle (a note in each record) and one meeting note
    from rich.console import Console

    from gpudoctor.doctor.combine import alignment
    from gpudoctor.report.run_view import render_alignment
    from gpudoctor.runner import rundir
    from gpudoctor.runner.record import RunRecord

    unsettled = "the light phase did not settle: its quarters were 12% apart"
    for rank in (0, 1):
        folder = tmp_path / f"rank-{rank}"
        folder.mkdir()
        info = {"rank": rank, "world_size": 2, "phases": {"light": 3, "traced": 8, "done": 12}}
        if rank == 1:
            info["notes"] = ["rank 0 was not there for 'traced' within 60 s"]
        rundir.write_rank_info(folder, info)
        record = RunRecord(
            argv=("train.py",), started_at="2026-11-26T00:00:00Z", options={}, environment=None,
            outcome="stopped", exit_code=0, steps_seen=12, notes=(unsettled,),
        )  # fmt: skip
        rundir.write_record(folder, record)
    # WHEN the combining rank prints the ranks' alignment
    console = Console(record=True, width=200)
    render_alignment(alignment(tmp_path), console)
    text = console.export_text()
    # THEN the records' notes reach the terminal, each once, with the ranks that say it
    assert f"note (ranks 0, 1): {unsettled}" in text
    assert "note (rank 1): rank 0 was not there for 'traced' within 60 s" in text


# --- the light phase extended alike on every rank ---------------------------------------------------


class _Host:
    """A host clock that a test advances by each step's time."""

    def __init__(self) -> None:
        self.us = 0.0

    def now_us(self) -> float:
        return self.us


def _light(run: RankRun | None, plan: int, light_steps: int = 20) -> tuple[Any, _Host]:
    """One rank's light phase of `plan` agreed steps, on a host clock the test advances."""
    from gpudoctor.runner.agreement import RankAgreement
    from gpudoctor.runner.light import LightPhase
    from gpudoctor.timing.stepclock import StepClock

    agreement = RankAgreement()
    agreement.begin(plan, run)
    light = LightPhase(LiveOptions(light_steps=light_steps, light_seconds=1.0), cuda=False, every=1,
                       agreement=agreement, calls=lambda: 0, restarts=[], notes=[], can_restart=False)  # fmt: skip
    host = _Host()
    light.clock = StepClock(cuda=False, host=host)
    light.clock.boundary()  # the light phase's first mark
    return light, host


def _until_done(captures: list[tuple[Any, _Host]], step_us: list[Any], limit: int = 1000) -> list[int]:
    """Step every rank together (rank k's i-th step takes step_us[k](i)); the step each ends at."""
    ended: list[int | None] = [None] * len(captures)
    for i in range(1, limit):
        for k, (capture, host) in enumerate(captures):
            if ended[k] is not None:
                continue
            host.us += step_us[k](i)
            if capture.boundary():
                ended[k] = i
        if all(e is not None for e in ended):
            break
    return [e or limit for e in ended]


def test_ranks_extend_an_unsettled_light_phase_alike_and_end_it_at_one_step(tmp_path: Path) -> None:
    # GIVEN two ranks planned 40 light steps: rank 0 steady at 20 ms, rank 1 still getting faster over
    # its first 35 (FSDP2 on 2 × H100: quarters 47.6 to 40.6 ms a step at the plan's end)
    run = ranks(tmp_path, 2, dist.HashStore())
    captures = [_light(r, plan=40) for r in run]
    steady = lambda i: 20e3  # noqa: E731
    faster = lambda i: 30e3 - 10e3 * min(i, 35) / 35  # noqa: E731
    ended = _until_done(captures, [steady, faster])
    # THEN both go on past the plan and end at the same step, once rank 1 has settled, before twice it
    assert ended[0] == ended[1] and 40 < ended[0] < 80
    assert all(c.agreement.check >= 1 for c, _ in captures)
    # AND one that never settles ends at twice the plan, on both ranks
    run = ranks(tmp_path / "a", 2, dist.HashStore())
    never = lambda i: 40e3 - 30e3 * i / 100  # noqa: E731 (40 ms down to 16 at step 80)
    assert _until_done([_light(r, plan=40) for r in run], [steady, never]) == [80, 80]
    # AND two steady ranks end together AGREE_LAG steps after the plan, having said they settled
    from gpudoctor.runner import settle

    run = ranks(tmp_path / "b", 2, dist.HashStore())
    assert _until_done([_light(r, plan=40) for r in run], [steady, steady]) == [40 + settle.AGREE_LAG] * 2
    # AND without a store to agree through, at the plan
    assert _until_done([_light(None, plan=40)], [faster]) == [40]


@pytest.mark.slow
def test_torchrun_ranks_agree_on_their_light_phase_through_the_store(tmp_path: Path) -> None:
    # GIVEN two gloo DDP ranks with a light phase of at least 0.3 s (agreed: extended alike if unsettled)
    out = tmp_path / "run"
    result = torchrun(out, "--light-seconds", "0.3", env={"STEPS": "2000"})
    assert result.returncode == 0, result.stderr[-3000:]
    # THEN each posted and read the checks, and both entered the traced phase at the same step
    infos = [rank_info(out, r) for r in (0, 1)]
    assert all("light_checks" in i["waited_s"] for i in infos)
    assert infos[0]["phases"] == infos[1]["phases"]
    assert infos[0]["phases"]["traced"] > infos[0]["phases"]["light"] + 5
    steps = [[s.number for s in find_steps(load_trace(out / f"rank-{r}" / "trace.json.gz"))] for r in (0, 1)]
    assert steps[0] == steps[1] and len(steps[0]) == 3
