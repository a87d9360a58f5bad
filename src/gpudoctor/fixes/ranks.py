"""`gpudoctor fix` on several ranks: each round, and each of the proof's plain processes, is one torchrun
group on this node (`--standalone`, every rank patched alike), each rank writing its own result beside
the round's (`<label>.rank<K>.json`). The group's round is what every rank pays: the step times (or the
A/B blocks, which every rank switches at the same steps) of its slowest rank (the ranks step together through their collectives: the one whose timed window took
longest is the one the others waited for), the losses of rank 0, what the script does as seen by the
rank its loader starves most (the straggler's own cause), and a failure where any rank failed."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpudoctor.fixes.loaders import loader_wait_share
from gpudoctor.fixes.round import RoundResult
from gpudoctor.runner.ranks import RankEnv
from gpudoctor.runner.torchrun import NVLS_OFF_ENV

# what a launcher tells its workers: a group started from a process that is itself a rank must not inherit
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")  # fmt: skip
FAILED = ("exception", "timeout", "crashed", "interrupted", "patch_failed")


NUMA_BINDINGS = ("node", "socket", "exclusive", "core-complex")  # torchrun's --numa-binding modes


def torchrun(nproc: int, numa_binding: str | None = None) -> list[str]:
    """The launcher's command line: `nproc` ranks on this node, on a rendezvous of their own, bound to
    the CPUs near their GPUs as `numa_binding` says (torchrun's own option) where given."""
    bind = ["--numa-binding", numa_binding] if numa_binding else []
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *bind]  # fmt: skip


def launcher_numa_binding(argv: Sequence[str]) -> str | None:
    """The `--numa-binding` a torchrun command line (`torchrun …` or `python -m torch.distributed.run …`)
    gave its workers, looked for up to its script; None where it gave none."""
    at = argv.index("torch.distributed.run") + 1 if "torch.distributed.run" in argv else 1
    for i in range(at, len(argv)):
        arg = argv[i]
        if arg in ("-m", "--module") or arg.endswith(".py"):
            return None  # the script and its own arguments
        name, eq, value = arg.partition("=")
        if name in ("--numa-binding", "--numa_binding"):
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def group_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a group of ranks started from here: the launcher's variables of a rank this process
    may itself be left out (the group has its own), NVLink multicast off where not set (a tool's launch
    must not need it)."""
    clean = {k: v for k, v in env.items() if k not in LAUNCHER_ENV}
    return {**NVLS_OFF_ENV, **clean}


def rank_path(path: Path, rank: int) -> Path:
    """Where rank `rank` of a group writes the result that `path` names for the group."""
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def this_rank() -> int | None:
    """This process's rank in a group of several ranks started by a launcher; None otherwise."""
    env = RankEnv.from_environ()
    return None if env is None else env.rank


def merge_rounds(results: Sequence[RoundResult | None], fixes: tuple[str, ...]) -> RoundResult:
    """One group's round from its ranks' (`None`: a rank that wrote nothing)."""
    missing = [r for r, res in enumerate(results) if res is None]
    got = [(r, res) for r, res in enumerate(results) if res is not None]
    if not got:
        return RoundResult(fixes, "crashed", 1, error="no rank wrote a result")
    # the rank whose script failed first: the others' errors follow from it (a peer gone from a collective)
    failed = sorted(
        ((r, res) for r, res in got if res.outcome in FAILED or res.oom), key=lambda rr: rr[1].ended_at
    )
    first = got[0][1] if got[0][0] == 0 else None
    base = first or got[0][1]
    if failed:
        r, res = failed[0]
        return replace(res, error=f"rank {r}: {res.error or res.outcome}")
    if missing:
        return replace(base, outcome="crashed", exit_code=1, step_times_us=(),
                       error=f"rank {missing[0]} wrote no result (it died or was killed)")  # fmt: skip
    slowest = max(got, key=lambda rr: sum(rr[1].step_times_us))[1]
    paced = _most_starved([res for _, res in got], slowest.step_times_us)
    return replace(
        base,
        clock=slowest.clock,
        step_times_us=slowest.step_times_us,
        blocks=slowest.blocks,
        block_layout=slowest.block_layout,
        switch_error=next((res.switch_error for _, res in got if res.switch_error), None),
        switches=max(res.switches for _, res in got),
        steps_seen=min(res.steps_seen for _, res in got),
        compile_s=max(res.compile_s for _, res in got),
        compile_timed_s=max(res.compile_timed_s for _, res in got),
        observations=paced.observations,
        leftover_processes=sum(res.leftover_processes for _, res in got),
        wall_s=max(res.wall_s for _, res in got),
        device=f"{base.device} ×{len(results)}",
    )


def _most_starved(ranks: Sequence[RoundResult], group_steps: tuple[float, ...]) -> RoundResult:
    """The rank whose training thread waits longest on its loader per step of the group (rank 0 where
    none waits): the one whose loader paces the group."""
    best, share = ranks[0], 0.0
    for res in ranks:
        s = loader_wait_share([replace(res, step_times_us=group_steps)])
        if s is not None and s > share:
            best, share = res, s
    return best


_ROOT = re.compile(
    r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)[^\n]*?(\((SIG\w+)\))?\s*$", re.S | re.M
)


@dataclass(frozen=True)
class RootCause:
    """The rank torchrun saw fail first, and how."""

    rank: int
    how: str

    def __str__(self) -> str:
        return f"rank {self.rank} failed first ({self.how})"


def root_cause(log: str) -> RootCause | None:
    """The first failure in torchrun's failure summary, or None."""
    m = _ROOT.search(log)
    if m is None:
        return None
    code, signal = int(m.group(2)), m.group(4)
    how = (
        f"killed by {signal}"
        if signal
        else (f"killed by signal {-code}" if code < 0 else f"exit status {code}")
    )
    return RootCause(int(m.group(1)), how)


def failure_line(cause: RootCause, ranks: Sequence[RoundResult | None]) -> str:
    """The failed group in one line: the rank that failed first, and its script's error where it wrote one
    (the others' errors follow from it: a peer gone from their collectives)."""
    own = ranks[cause.rank] if cause.rank < len(ranks) else None
    return f"{cause}: {own.error}" if own is not None and own.error else str(cause)
