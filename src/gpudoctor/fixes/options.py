"""What a `gpudoctor fix` session is given: its options (`FixOptions`, as the command line sets them),
the `Launcher` that runs one round in a process of its own, and the `Progress` it reports after every
round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpudoctor.fixes.proof import TARGET_HALF_WIDTH
from gpudoctor.fixes.round import RoundResult
from gpudoctor.timing.compare import SAME_WITHIN


@dataclass(frozen=True)
class FixOptions:
    rounds: int = 4  # fresh-process pairs per fix that cannot be switched in a running process
    warmup: int = 5  # steps skipped in each round (compilation included) …
    warmup_s: float = 1.0  # … and at least this long (GPU clocks ramp up after the idle process start)
    steps: int = 20  # steps timed in each fresh-process round …
    steps_s: float = 2.0  # … and at least this long (a loop's periodic stalls inside the window)
    record: int = 5  # steps whose losses or outputs are compared
    seed: int = 0
    budget_s: float | None = None
    child_timeout_s: float = 600.0
    allow_batch: bool = False
    compile_mode: str | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    same_within: float = SAME_WITHIN
    fork: bool = True  # rounds forked from a server that imported the libraries (fixes.forkserver)
    # one baseline process per round for all the fresh-process fixes (A B C D, D C B A, …)
    shared_baseline: bool = False
    # fixes not faster alone tried on top of the recommended configuration (FixSession._stack)
    stack: bool = True
    blocks: int = 8  # block pairs of an in-process A/B (0: every fix in fresh processes)
    block_s: float = 0.5  # seconds a block lasts at least (its periodic stalls inside it)
    # block pairs added, once, to an in-process A/B whose planned pairs lean to a saving undecided,
    # where the time budget has room (timing.blocks; 0: never)
    extend_blocks: int = 16
    # the recommendation's diff applied to a copy and timed against the script as plain processes
    # (fixes.prove), in pairs until the speedup's 95% interval is within ±proof_half_width of it
    proof: bool = True
    proof_half_width: float = TARGET_HALF_WIDTH
    # ranks of a torchrun group on this node: every round, and each of the proof's processes, a group of
    # this many (fixes.ranks); more than 1 times fresh groups only (no blocks, no fork server)
    nproc: int = 1
    # torchrun's --numa-binding for every group (each rank on the cores near its GPU), as the user's
    # torchrun binds them; None: unbound, torchrun's default
    numa_binding: str | None = None


@dataclass(frozen=True)
class Progress:
    stage: str  # baseline, fix, combination, stack
    fix: str | None
    index: int  # of the fix, from 1
    count: int
    round: int  # from 1
    rounds: int
    side: str  # baseline, candidate, blocks
    together: bool = False  # every fix in each round, beside one baseline (FixOptions.shared_baseline)


class Launcher(Protocol):
    """Runs one round in a process of its own: the script with `fixes` applied (none: the baseline);
    with `switch`, an A/B inside that process, in blocks: `switch` is what its two sides differ by,
    those among `fixes` on B's side alone, the others (wrappers of the root's forward that B's
    replace: compile:reduce-overhead for compile) on A's alone; `extend`: block pairs it may add where
    the planned ones lean to a saving undecided (passed only where more than 0)."""

    def __call__(
        self,
        label: str,
        fixes: tuple[str, ...],
        exact_random: bool,
        switch: tuple[str, ...] = (),
        extend: int = 0,
    ) -> RoundResult: ...
