"""`gpudoctor fix` on several ranks (`fixes.ranks`, `--nproc`): each round and each of the proof's plain
processes is a torchrun group; the group's round is its slowest rank's steps, rank 0's losses, the
starved rank's observations, and a failure where any rank failed; the proof's stopwatch ends every
rank at the same step. On the CPU (gloo, 2 ranks): a DDP loop starved by a loader that sleeps 2 ms per
item keeps the workers fix with its diff, proved by plain torchrun groups; a rank that crashes in a
round is one line, and nothing is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.fixes import stopwatch
from gpudoctor.fixes.diagnose import diagnose_ranks, load_run
from gpudoctor.fixes.kinds.dist import DdpFix
from gpudoctor.fixes.launch import TorchrunLauncher
from gpudoctor.fixes.observe import DdpInfo, LoaderInfo, Observations
from gpudoctor.fixes.options import FixOptions
from gpudoctor.fixes.patches.ddp import knobs_to_set
from gpudoctor.fixes.prove import lockstep_steps, slowest_rank
from gpudoctor.fixes.ranks import group_env, merge_rounds, rank_path, root_cause
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.stopwatch import Stopwatch
from gpudoctor.runner.child import ChildRun

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "fixtures" / "scripts" / "ddp_loader_gloo.py"

TORCHRUN_FAILURE = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : 143 (pid: 27014)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_11:03:51
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 27015)  (SIGKILL)
  error_file: <N/A>
============================================================
"""


class Ticks:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def observations(wait_s: float | None) -> Observations:
    loader = LoaderInfo(site=None, batch_size=8, num_workers=2, pin_memory=False, persistent_workers=False,
                        prefetch_factor=2, iterable=False, iterated=True, wait_s=wait_s, taken=40)  # fmt: skip
    return Observations(root=None, loaders=(loader,), optimizers=(), empty_cache=(), zero_grad_keep=(),
                        item_syncs=(), float32_matmul_precision="highest", cudnn_benchmark=False, cuda=False,
                        bf16_supported=False, free_cores=2)  # fmt: skip


def rank_round(
    steps: tuple[float, ...], losses: float, wait_s: float | None = None, **kw: Any
) -> RoundResult:
    return RoundResult(("workers:2",), "stopped", 0, step_times_us=steps, steps_seen=40,
                       outputs_kind="loss", outputs=((losses,),), observations=observations(wait_s),
                       device="cpu", **kw)  # fmt: skip


def test_the_groups_round_is_its_slowest_ranks_steps_rank_0s_losses_and_the_starved_ranks_loader() -> None:
    # GIVEN two ranks: rank 1 waits on its loader (a straggler) and its timed window took longer
    r0 = rank_round((10_000.0, 10_400.0), 2.5, wait_s=0.0001, compile_s=1.0)
    r1 = rank_round((10_300.0, 10_500.0), 2.7, wait_s=0.006, compile_s=3.0)
    merged = merge_rounds([r0, r1], ("workers:2",))
    # THEN the group's steps are rank 1's (the step every rank pays), the losses rank 0's, what the
    # script does as rank 1 sees it (its loader paces the group), and the device says how many ranks
    assert merged.step_times_us == (10_300.0, 10_500.0) and merged.outputs == ((2.5,),)
    assert merged.observations == r1.observations and merged.compile_s == 3.0
    assert merged.device == "cpu ×2" and merged.failure is None


def test_a_rank_that_failed_or_wrote_nothing_fails_the_groups_round_in_one_line() -> None:
    ok = rank_round((10_000.0,), 2.5)
    crashed = RoundResult(("workers:2",), "exception", 1, error="RuntimeError: rank 1 failed at step 5",
                          ended_at=100.0)  # fmt: skip
    failed = merge_rounds([ok, crashed], ("workers:2",))
    assert failed.failure == "exception: rank 1: RuntimeError: rank 1 failed at step 5"
    # the peer's error, which followed (its collective lost rank 1), is not the one told
    peer = RoundResult(("workers:2",), "exception", 1, error="RuntimeError: Connection closed by peer",
                       ended_at=100.2)  # fmt: skip
    assert merge_rounds([peer, crashed], ()).failure == failed.failure
    missing = merge_rounds([ok, None], ("workers:2",))
    assert missing.failure is not None and "rank 1 wrote no result" in missing.failure
    assert merge_rounds([None, None], ()).outcome == "crashed"


def test_torchruns_summary_names_the_rank_that_failed_first() -> None:
    assert str(root_cause(TORCHRUN_FAILURE)) == "rank 1 failed first (killed by SIGKILL)"
    exited = root_cause(
        "Root Cause (first observed failure):\n  rank : 0 (local_rank: 0)\n  exitcode : 1 (pid: 3)\n"
    )
    assert str(exited) == "rank 0 failed first (exit status 1)"
    assert root_cause("a script's own output") is None


def test_a_group_started_from_a_rank_leaves_its_launcher_variables_and_keeps_multicast_off() -> None:
    env = group_env({"RANK": "0", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x", "PATH": "/bin",
                     "NCCL_NVLS_ENABLE": "1"})  # fmt: skip
    assert "RANK" not in env and "MASTER_PORT" not in env and "TORCHELASTIC_RUN_ID" not in env
    assert env["PATH"] == "/bin" and env["NCCL_NVLS_ENABLE"] == "1"  # the user's own setting stays
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"


def test_the_stopwatch_and_the_prover_name_a_ranks_result_alike() -> None:
    out = Path("/x/proof/script-1.json")
    assert stopwatch.rank_out(str(out), 1) == str(rank_path(out, 1)) == "/x/proof/script-1.rank1.json"


def test_ranks_warm_up_and_time_a_number_of_steps_and_end_at_the_same_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the settings of a group of ranks at a 20 ms baseline step: 5 + 1 s / 20 ms warm-up steps, 2 s
    settings = lockstep_steps(FixOptions(warmup=5, warmup_s=1.0, steps=20, steps_s=2.0), 20_000.0)
    assert settings == {"ranks": True, "warmup": 55, "steps": 100}
    ended: list[int] = []
    monkeypatch.setattr(stopwatch.os, "_exit", lambda code: ended.append(code))
    for r, step_s in enumerate((0.01, 0.03)):  # two ranks at different paces (clocks of their own)
        clock = Ticks()
        w = Stopwatch({"out": str(tmp_path / f"r{r}.json"), "source": "optimizer", "window_s": 0.5, **settings},
                      clock=clock)  # fmt: skip
        while not w.finished:
            clock.now += step_s
            w.on_step()
        # THEN each ends after 55 + 100 steps whatever its pace: no rank waits in a collective alone
        doc = json.loads((tmp_path / f"r{r}.json").read_text())
        assert doc["steps_seen"] == 155 and doc["warmup_steps"] == 55
        assert sum(n for _, n in doc["windows"]) == 100
        assert doc["mean_step_us"] == pytest.approx(step_s * 1e6)
    assert ended == [0, 0]


def test_a_groups_plain_process_is_its_slowest_rank(tmp_path: Path) -> None:
    result, log = tmp_path / "script-1.json", tmp_path / "script-1.log"
    log.write_text("")
    for r, mean in enumerate((9_000.0, 9_500.0)):
        rank_path(result, r).write_text(json.dumps({"outcome": "timed", "mean_step_us": mean, "windows": []}))
    run = ChildRun(0, None, None, "", 0, 3.0)
    assert slowest_rank(run, result, 2, log).result["mean_step_us"] == 9_500.0  # type: ignore[index]
    log.write_text(TORCHRUN_FAILURE)
    failed = slowest_rank(ChildRun(1, None, None, "", 0, 3.0), result, 2, log)
    assert failed.result is None and failed.error == "rank 1 failed first (killed by SIGKILL)"


# -- on the CPU, gloo, 2 ranks ---------------------------------------------------------------------------
FAST = ["--nproc", "2", "--no-diagnose", "--only", "workers:2", "--rounds", "2", "--warmup", "3",
        "--warmup-s", "0", "--steps", "12", "--steps-s", "0.25", "--loss-steps", "2", "--proof-half-width", "40",
        "--child-timeout", "120"]  # fmt: skip


def gpudoctor_fix(
    out: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "OMP_NUM_THREADS": "1", "EPOCHS": "20", **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), full.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "gpudoctor", "fix", "--out", str(out), *FAST, *extra, str(SCRIPT)]
    return subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=400, cwd=out.parent)


def left_running(script: Path) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if str(script) in line and "ps -eo" not in line]


@pytest.mark.slow
def test_a_loader_starved_ddp_loop_keeps_the_workers_fix_proved_by_plain_torchrun_groups(
    tmp_path: Path,
) -> None:
    # GIVEN a gloo DDP loop whose loader sleeps 2 ms per item, no workers
    out = tmp_path / "fx"
    result = gpudoctor_fix(out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    doc = json.loads((out / "fix.json").read_text())
    # THEN every round was a group of 2 ranks, each writing its own result
    assert (out / "rounds" / "baseline-0.rank1.json").exists()
    assert doc["final"] == ["workers:2"], doc.get("notes")
    # AND the diff sets the loader's workers, and the proof timed it as the user runs it: torchrun groups
    assert "num_workers=2" in (out / "fix.diff").read_text()
    proof = doc["proof"]
    assert proof["recommended"] is True and proof["speedup"] > 1.3, proof["reason"]
    assert proof["script_command"][1:6] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
    ]
    assert (out / "proof" / "patched-1.rank1.json").exists()
    assert not left_running(SCRIPT)


def test_aa_on_two_ranks_times_torchrun_groups_against_themselves_without_plain_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN `gpudoctor fix --aa --nproc 2`, its torchrun groups stood in for by fake rounds (a group of
    # the gloo loop is tested in the tests above)
    from typer.testing import CliRunner

    from fix_fakes import FakeClock, FakeLauncher
    from gpudoctor.cli.main import app
    from gpudoctor.fixes import api
    from gpudoctor.fixes.aa import AAReport

    made: list[dict[str, Any]] = []

    def groups(*args: Any, **kwargs: Any) -> FakeLauncher:
        made.append(kwargs)
        return FakeLauncher(FakeClock(), {"baseline": 100.0})

    monkeypatch.setattr(api, "TorchrunLauncher", groups)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    result = CliRunner().invoke(app, ["fix", "--out", "aa", "--nproc", "2", "--aa", "--rounds", "2", "--blocks", "2",
                                      "--extend-blocks", "0", "train.py"], catch_exceptions=False)  # fmt: skip
    assert result.exit_code == 0, result.output
    report = AAReport.from_json(json.loads((tmp_path / "aa" / "aa.json").read_text()))
    # THEN every round is a group of 2 ranks: four of the script and the no-op (A B B A), then the no-op in
    # blocks of one group, and no plain processes beside them, said so
    assert [m["nproc"] for m in made] == [2]
    assert report.harness is not None and len(report.harness.means_us) == 4
    assert report.harness.how.startswith("torchrun groups of 2 ranks")
    assert report.processes is not None and report.processes.pairs == 2
    assert report.blocks is not None and report.blocks.unit == "block pair"
    assert report.plain is None and any(n.startswith("plain processes: not timed here") for n in report.notes)


@pytest.mark.slow
def test_a_rank_that_crashes_in_a_round_ends_its_group_in_one_line_with_nothing_left_running(
    tmp_path: Path,
) -> None:
    # GIVEN rank 1 raising at its 6th step, in every round
    out = tmp_path / "fx"
    result = gpudoctor_fix(out, env={"CRASH_RANK": "1", "CRASH_AT": "5"})
    # THEN the baseline did not run: one line names the rank and its exception, exit 1, no traceback of ours
    assert result.returncode == 1
    said = [line for line in result.stderr.splitlines() if line.startswith("gpudoctor fix:")]
    assert len(said) == 1 and "rank 1" in said[0] and "RuntimeError: rank 1 failed at step 5" in said[0], said
    assert "Traceback" not in result.stdout
    assert not left_running(SCRIPT)


def test_ddp_knobs_are_what_the_script_left_at_their_defaults() -> None:
    assert knobs_to_set({}) == {"static_graph": True, "gradient_as_bucket_view": True}
    assert knobs_to_set({"find_unused_parameters": True, "static_graph": True}) == {
        "gradient_as_bucket_view": True,
        "find_unused_parameters": False,
    }
    assert knobs_to_set({"static_graph": True, "gradient_as_bucket_view": True}) == {}
    fix, obs = DdpFix(), observations(None)
    assert fix.why_not(obs, "", 10) == "no DistributedDataParallel was built"
    built = replace(obs, ddp=(DdpInfo(None, own_call=False, to_set=("static_graph",)),))
    assert fix.why_not(built, "", 10) is not None and "built by a library" in fix.why_not(built, "", 10)  # type: ignore[operator]


ACCELERATE_SCRIPT = """\
import torch
from accelerate import Accelerator

accelerator = Accelerator({given})
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
"""
TRAINER_SCRIPT = """\
from transformers import Trainer, TrainingArguments

args = TrainingArguments(output_dir="out", bf16=True)
trainer = Trainer(model=None, args=args)
trainer.train()
"""


def test_a_ddp_a_framework_builds_gets_the_knobs_its_users_can_set_written_as_its_option(
    tmp_path: Path,
) -> None:
    from gpudoctor.fixes.catalog import in_users_idiom
    from gpudoctor.fixes.diff import apply_edits
    from gpudoctor.fixes.edits import Edit
    from gpudoctor.fixes.patches.ddp import builder
    from gpudoctor.runner.hooks import CallSite

    # GIVEN scripts whose DDP is built by Accelerate's prepare (line 8) or inside the HF Trainer (line 5)
    acc, handlers, hf = tmp_path / "acc.py", tmp_path / "handlers.py", tmp_path / "hf.py"
    acc.write_text(ACCELERATE_SCRIPT.format(given=""))
    handlers.write_text(ACCELERATE_SCRIPT.format(given="kwargs_handlers=[]"))
    hf.write_text(TRAINER_SCRIPT)
    assert builder(CallSite(str(acc), 8, "<module>")) == "accelerate"
    assert builder(CallSite(str(handlers), 8, "<module>")) is None  # its own handlers: not rewritten
    assert builder(CallSite(str(hf), 5, "<module>")) == "transformers"
    # THEN Accelerate's DDP gets every knob; the Trainer's only find_unused_parameters, where it was True
    # (the Trainer's default for a model without gradient checkpointing)
    assert knobs_to_set({}, "accelerate") == {"static_graph": True, "gradient_as_bucket_view": True}
    assert knobs_to_set({"find_unused_parameters": True}, "transformers") == {"find_unused_parameters": False}
    assert knobs_to_set({"find_unused_parameters": False}, "transformers") == {}
    # AND the fix proposes itself for them, and refuses where no framework's terms can say it
    fix, obs = DdpFix(), observations(None)
    by_acc = replace(
        obs, ddp=(DdpInfo(None, own_call=False, to_set=("static_graph",), framework="accelerate"),)
    )
    assert fix.why_not(by_acc, "", 10) is None
    done = replace(obs, ddp=(DdpInfo(None, own_call=False, framework="transformers"),))
    assert fix.why_not(done, "", 10) == (
        "the Trainer's DistributedDataParallel already has find_unused_parameters=False"
    )
    # AND the written change is the framework's option, which applies and parses
    knobs = {"static_graph": "True", "gradient_as_bucket_view": "True"}
    edits = in_users_idiom("ddp", [Edit("set_kwargs", str(acc), 8, call="DistributedDataParallel", kwargs=knobs)],
                           str(acc))  # fmt: skip
    text, unplaced = apply_edits(acc.read_text(), edits)
    assert not unplaced and compile(text, "acc.py", "exec")
    assert "from accelerate.utils import DistributedDataParallelKwargs" in text
    assert (
        "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(static_graph=True, "
        "gradient_as_bucket_view=True)])" in text
    )
    edits = in_users_idiom("ddp", [Edit("set_kwargs", str(hf), 5, call="DistributedDataParallel",
                                        kwargs={"find_unused_parameters": "False"})], str(hf))  # fmt: skip
    text, unplaced = apply_edits(hf.read_text(), edits)
    assert (
        not unplaced
        and 'TrainingArguments(output_dir="out", bf16=True, ddp_find_unused_parameters=False)' in text
    )


def test_a_round_of_two_ranks_builds_ddp_with_its_knobs_and_compiles_the_module_it_wraps(
    tmp_path: Path,
) -> None:
    # GIVEN the gloo loop building DDP(net, find_unused_parameters=True), one round of 2 ranks with the fix
    launcher = TorchrunLauncher(str(SCRIPT), [], module=False, nproc=2, rounds_dir=tmp_path,
                                options=FixOptions(warmup=2, warmup_s=0.0, steps=4, steps_s=0.0, record=2),
                                extra=("--compile-backend", "eager"))  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "FIND_UNUSED": "1", "EPOCHS": "2"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        result = launcher("r", ("ddp", "compile"), False)
    # THEN both ranks timed their steps, and the script's DDP was seen with what the fix changes
    assert result.failure is None, result.log_tail
    assert result.device.endswith("×2") and result.observations is not None
    assert result.observations.ddp[0].own_call and "static_graph" in result.observations.ddp[0].to_set
    # AND the fix's edit is on the script's own DDP(...) line
    edit = result.patches["ddp"].edits[0]
    assert edit.call == "DDP" and Path(edit.file) == SCRIPT
    assert edit.kwargs == {
        "static_graph": "True",
        "gradient_as_bucket_view": "True",
        "find_unused_parameters": "False",
    }
    # AND compile reached the module DDP wraps (DDP's own forward stays eager, as torch.compile(ddp) does)
    compiled = result.patches["compile"]
    assert compiled.changes == ("Sequential.forward compiled inside DistributedDataParallel",)
    assert compiled.edits[0].name == "model" and compiled.edits[0].code[0].startswith(
        "{name}.module.forward = torch.compile({name}.module.forward)"
    )


def test_the_ranks_diagnosis_run_is_read_back_as_a_run_directory_for_fix_from(tmp_path: Path) -> None:
    # GIVEN the doctor's run of the gloo loop as 2 ranks (what `gpudoctor fix --nproc 2` diagnoses first)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.setenv("EPOCHS", "4")
        inputs = diagnose_ranks(str(SCRIPT), [], nproc=2, module=False, out=tmp_path / "run", warmup=2,
                                light_steps=4, steps=2, timeout_s=120)  # fmt: skip
    # THEN it diagnosed the ranks, and `--from` that directory gives the same script and diagnosis
    assert inputs.script_error is None and inputs.diagnosis is not None, inputs.note
    assert (tmp_path / "run" / "rank-1").is_dir()
    again = load_run(tmp_path / "run")
    assert again.argv == (str(SCRIPT),) and again.diagnosis == inputs.diagnosis


def test_an_ab_in_blocks_switches_every_rank_at_the_same_steps(tmp_path: Path) -> None:
    # GIVEN an in-process A/B of a switchable fix in a group of 2 ranks: blocks of at least 0.05 s
    options = FixOptions(warmup=2, warmup_s=0.0, steps=4, steps_s=0.0, record=2, blocks=2, block_s=0.05)
    launcher = TorchrunLauncher(str(SCRIPT), [], module=False, nproc=2, rounds_dir=tmp_path, options=options)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.setenv("EPOCHS", "4")
        result = launcher("ab", ("fused_optimizer",), False, switch=("fused_optimizer",))
    assert result.failure is None, result.log_tail
    ranks = [
        RoundResult.from_json(json.loads(rank_path(tmp_path / "ab.json", r).read_text())) for r in (0, 1)
    ]
    # THEN both ranks ran the same blocks, in the same order, of the steps rank 0 calibrated
    layouts = [r.block_layout for r in ranks]
    assert layouts[0] is not None and layouts[1] is not None
    assert layouts[0].steps == layouts[1].steps and layouts[0].b_first == layouts[1].b_first
    assert [(b.candidate, b.steps) for b in ranks[0].blocks] == [
        (b.candidate, b.steps) for b in ranks[1].blocks
    ]
    assert len(result.blocks) == 4 and ranks[0].steps_seen == ranks[1].steps_seen


@pytest.mark.slow
def test_a_round_of_two_ranks_sets_the_knobs_of_the_ddp_accelerate_prepares(tmp_path: Path) -> None:
    # GIVEN accelerate's example loop (a small BERT, gloo), whose DDP `accelerator.prepare` builds
    script = REPO / "benchmarks" / "fix_multi_gpu" / "accelerate_ddp.py"
    launcher = TorchrunLauncher(str(script), ["--small"], module=False, nproc=2, rounds_dir=tmp_path,
                                options=FixOptions(warmup=2, warmup_s=0.0, steps=4, steps_s=0.0, record=2))  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        result = launcher("r", ("ddp",), False)
    # THEN the DDP built inside accelerate is seen as accelerate's, and given the knobs
    assert result.failure is None, result.log_tail
    assert result.observations is not None
    (ddp,) = result.observations.ddp
    assert not ddp.own_call and ddp.framework == "accelerate" and ddp.site is not None
    assert "accelerator.prepare(" in script.read_text().splitlines()[ddp.site.line - 1]
    assert result.patches["ddp"].changes == (
        "DistributedDataParallel(static_graph=True, gradient_as_bucket_view=True), built by accelerate",
    )
