"""What the session tests share: observations of a script, a fake clock, and a launcher whose rounds'
step times are drawn around a configured mean per configuration — fresh processes, or one process
whose blocks alternate A B B A … where the round switches fixes (A: without those of them it applies,
with those it does not: what they replace)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.evidence import WorkTally
from gpudoctor.fixes.observe import LoaderInfo, Observations, OptimizerInfo, RootInfo, SiteCount
from gpudoctor.fixes.patches.base import PatchOutcome
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.session import FixOptions, FixSession
from gpudoctor.runner.hooks import CallSite
from gpudoctor.timing.blocks import Block, BlockLayout, block_pairs
from gpudoctor.timing.paired import abba, leans_to_a_saving

LOSSES = ((2.30,), (2.25,), (2.21,), (2.18,), (2.12,))
SITE = CallSite("train.py", 10, "<module>")


def observations(
    *,
    dropout: bool = False,
    batch: int = 16,
    conv2d: bool = False,
    cudnn_tf32: bool = False,
    empty_cache: int = 0,
    workers: int = 0,
    wait_s: float | None = None,
    fetch_s: float | None = None,
    autocast: str | None = None,
) -> Observations:
    root = RootInfo(
        "Net", 1000, "float32", "cuda", True, conv2d, dropout, None, ("model",), SITE, (((16, 8),),) * 3,
        autocast,
    )  # fmt: skip
    # `fetch_s`: each batch made on the training thread in that long (computed: its CPU time as long)
    made = {"fetches": 10, "fetch_wall_s": 10 * fetch_s, "fetch_cpu_s": 10 * fetch_s} if fetch_s else {}
    loader = LoaderInfo(SITE, batch, workers, False, workers > 0, None, False, True, wait_s=wait_s, **made)
    empty = (SiteCount(SITE, empty_cache),) if empty_cache else ()
    return Observations(root, (loader,), (OptimizerInfo(SITE, "AdamW", False, None, 4),), empty, (), (),
                        "highest", False, True, True, 8, cudnn_tf32)  # fmt: skip


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


Call = tuple[str, tuple[str, ...], bool, tuple[str, ...]]


class FakeLauncher:
    """Rounds whose step times are drawn around a configured mean per configuration ("+"-joined fixes;
    "baseline" for none). A round that switches fixes times `pairs` block pairs A B B A …, A being the
    configuration without them."""

    def __init__(
        self,
        clock: FakeClock,
        step_us: dict[str, float],
        *,
        noise: float = 0.01,
        round_s: float = 10.0,
        block_round_s: float = 20.0,
        pairs: int = 8,
    ) -> None:
        self.clock, self.step_us, self.noise, self.round_s = clock, step_us, noise, round_s
        self.block_round_s, self.pairs = block_round_s, pairs
        self.rng = np.random.default_rng(1)
        self.calls: list[Call] = []
        self.extends: list[int] = []  # each round's `extend` (block pairs it may add)
        self.losses: dict[str, tuple[tuple[float, ...], ...]] = {}
        self.failures: dict[str, str] = {}
        self.fail_all_on: set[str] = set()  # of `failures`, those failing in one process before any switch
        self.crash: set[str] = set()  # of `failures`, those whose process crashes (no result written)
        self.not_applicable: set[str] = set()
        self.cannot_switch: set[str] = set()
        self.interrupt_at: int | None = None
        self.batch: dict[str, int] = {}
        self.edits: dict[str, tuple[Edit, ...]] = {}
        self.seen: dict[str, object] = {}  # what every round observes of the script (conv2d, cudnn_tf32)
        self.round_by: dict[str, float] = {}  # a configuration's round length where not round_s
        self.block_round_by: dict[str, float] = {}  # … and of its A/B in one process
        self.fresh_step_us: dict[str, float] = {}  # a configuration's mean in fresh processes alone
        self.loader_wait_us: dict[str, float] = {}  # a configuration's wait per batch for loader workers
        self.fetch_us: float | None = None  # without workers: each batch made on the training thread
        self.work: dict[str, WorkTally] = {}  # what a configuration's forward ran (its fixes' evidence)

    def mean(self, key: str) -> float:
        """The configured mean (in whatever order its fixes were named); a configuration of several
        fixes that is not configured, each fix's effect in turn (independent: the product of their
        ratios to the baseline)."""
        base = self.step_us["baseline"]
        same = next((k for k in self.step_us if set(k.split("+")) == set(key.split("+"))), None)
        if same is not None or "+" not in key:
            return self.step_us.get(same or key, base)
        ratio = 1.0
        for fix in key.split("+"):
            ratio *= self.step_us.get(fix, base) / base
        return base * ratio

    def steps(self, key: str, n: int = 20) -> tuple[float, ...]:
        return tuple(self.mean(key) * (1 + self.noise * self.rng.standard_normal(n)))

    def __call__(
        self,
        label: str,
        fixes: tuple[str, ...],
        exact_random: bool,
        switch: tuple[str, ...] = (),
        extend: int = 0,
    ) -> RoundResult:
        self.calls.append((label, fixes, exact_random, switch))
        self.extends.append(extend)
        if self.interrupt_at is not None and len(self.calls) >= self.interrupt_at:
            raise KeyboardInterrupt
        key = "+".join(fixes) or "baseline"
        if switch and key in self.block_round_by:
            self.clock.now += self.block_round_by[key]
        else:
            self.clock.now += self.round_by.get(key, self.block_round_s if switch else self.round_s)
        patches = {f: PatchOutcome(f not in self.not_applicable, None if f not in self.not_applicable else "no optimizer",
                                   (f"{f} applied",), self.edits.get(f, ())) for f in fixes}  # fmt: skip
        wait = next((w for k, w in self.loader_wait_us.items() if set(k.split("+")) == set(fixes)), None)
        workers = max((int(f.split(":")[1]) for f in fixes if f.startswith("workers:")), default=0)
        fetch = self.fetch_us / 1e6 if self.fetch_us is not None and not workers else None
        obs = observations(batch=self.batch.get(key, 16), workers=workers,  # type: ignore[arg-type]
                           wait_s=None if wait is None else wait / 1e6, fetch_s=fetch, **self.seen)  # fmt: skip
        if key in self.work and obs.root is not None:
            obs = replace(obs, roots=(replace(obs.root, work=self.work[key]),))
        outcome = ("crashed" if key in self.crash else "exception") if key in self.failures else "stopped"
        times = self.steps(key)
        if not switch and key in self.fresh_step_us:
            times = tuple(self.fresh_step_us[key] * (1 + self.noise * self.rng.standard_normal(len(times))))
        r = RoundResult(fixes, outcome, 0, "cuda_events", times, 25, "loss", self.losses.get(key, LOSSES),
                        compile_s=30.0 if "compile" in key else 0.0, patches=patches, observations=obs,
                        error=self.failures.get(key), device="NVIDIA H100 80GB HBM3")  # fmt: skip
        if not switch:
            return r
        if set(switch) & self.cannot_switch:
            return replace(r, switch=switch, switch_error="NotSwitchable: cannot be switched")
        if key in self.fail_all_on:
            return replace(r, switch=switch, step_times_us=(), steps_seen=3)
        # the A side: without the switched fixes among `fixes`, with those that are not (replaced)
        a_side = [f for f in fixes if f not in switch] + [f for f in switch if f not in fixes]
        off = "+".join(a_side) or "baseline"
        blocks: list[Block] = []

        def timed(order: list[bool]) -> None:
            for cand in order:
                times = self.steps(key if cand else off, 10)
                blocks.append(Block(cand, 10, sum(times), times, "cuda_events"))

        timed(abba(self.pairs))
        added = extend if extend and leans_to_a_saving(block_pairs(blocks)) else 0
        timed(abba(added))
        layout = BlockLayout((), 1, False, 10, (), 0, extended=added)
        steps = tuple(t for b in blocks for t in b.step_times_us)
        return replace(r, switch=switch, blocks=tuple(blocks), step_times_us=steps, block_layout=layout,
                       switches=1 + len(blocks))  # fmt: skip


def session(launcher: FakeLauncher, clock: FakeClock, only: str, **options: object) -> FixSession:
    opts = FixOptions(only=tuple(only.split(",")), **options)  # type: ignore[arg-type]
    return FixSession(launcher, opts, None, argv=("train.py",), started_at="now", clock=clock)
