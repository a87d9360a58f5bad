"""Which repeating unit of the user's script is its step, decided from what the run's first moments showed
(the user's loops iterating, outermost `nn.Module` calls, DataLoader batches). Pure: `decide()` reads
`Observations` and a time and names a `StepDefinition`, or waits (None). Preference: one call of the root
module called directly; one iteration of a loop calling it several times through another function
(`generate`); one DataLoader batch; one iteration of a plain loop (not while an optimizer waits for
its first step: that loop is set-up); a timed window when nothing repeats."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from dataclasses import dataclass, field

from gpudoctor.runner.loops import LoopKey

MIN_EVENTS = 3  # of a source before it is believed
LOOP_SETTLE_S = 2.0
BATCH_SETTLE_S = 0.5  # plain loops: how long to watch before choosing among nested loops
CALL_WAIT_S = 30.0  # generate-style calls: how long to wait for the user's loop around them
# a plain loop that runs while an optimizer is built and has not yet stepped is set-up (a dataset made
# in Python, say), not the training to come: how long to wait for the model's calls or the optimizer
SETUP_WAIT_S = 60.0
WINDOW_AFTER_S = 20.0  # nothing repeats: timed windows after this long
# a loop's latest iteration ends kept (its period, its last iterations): what `decide` reads of a loop
# costs the same after a million iterations as after ten (an inner comprehension of a dataset built in
# Python iterates millions of times; reading its whole history at each iteration made the build 80x slower)
KEEP_ENDS = 64


@dataclass(frozen=True)
class StepDefinition:
    """How a step was found, and how its boundaries are seen from now on."""

    source: str  # explicit, optimizer, module, call, dataloader, loop, window
    description: str  # "one call of BertModel.forward"
    loop: LoopKey | None = None  # call and loop sources: a step is one iteration of this loop
    module: str | None = None  # the root module's class name (module and call sources)
    calls_per_step: float | None = None  # root module calls per step (call source)
    window_s: float | None = None  # window source


@dataclass(frozen=True)
class RootCall:
    """An outermost nn.Module call (no other module call around it)."""

    time: float
    module_id: int
    module: str  # class name; a compiled module's original class
    via: str | None  # None when the user's code called the module itself; else the function between
    # them, e.g. "GPT2LMHeadModel.generate"


@dataclass
class Observations:
    start: float
    loops: dict[LoopKey, list[float]] = field(default_factory=dict)  # the latest iteration ends (KEEP_ENDS+)
    first_end: dict[LoopKey, float] = field(default_factory=dict)  # each loop's first iteration end
    roots: list[RootCall] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)
    optimizers: int = 0  # optimizers the script has built so far

    def add_iteration(self, loop: LoopKey, when: float) -> None:
        ends = self.loops.get(loop)
        if ends is None:
            self.loops[loop], self.first_end[loop] = [when], when
            return
        ends.append(when)
        if len(ends) >= 2 * KEEP_ENDS:
            del ends[:-KEEP_ENDS]


def decide(obs: Observations, now: float, compile_s: float = 0.0) -> StepDefinition | None:
    """The step, once the observations are enough to say; else None (keep watching). `compile_s`: how
    long the script has compiled (torch.compile) since watching began, which does not count towards
    "nothing repeats": a first step that compiles for a minute repeats once compiled."""
    if obs.roots:
        return _from_roots(obs, now)
    if (
        len(obs.batches) >= MIN_EVENTS
    ):  # after a while, so that batches fetched ahead of a model do not decide
        if now - obs.batches[0] < BATCH_SETTLE_S:
            return None
        return StepDefinition("dataloader", "one DataLoader batch (no model call, no optimizer step)")
    loops = _repeating(obs)
    if loops:
        first = min(obs.first_end[k] for k in loops)
        loop = max(loops, key=lambda k: _period(obs.loops[k]))  # the outermost that repeats so far
        # Wait a while for a slower loop around it to show, the longer the slower this one is; with an
        # optimizer built, for the model's calls or its step (any comes before this loop is believed).
        settle = min(LOOP_SETTLE_S, max(0.2, 20 * _period(obs.loops[loop])))
        if obs.optimizers:
            settle = SETUP_WAIT_S
        if now - first >= settle:
            return StepDefinition("loop", f"one iteration of the loop at {loop.describe()}", loop=loop)
        return None
    if now - obs.start - compile_s >= WINDOW_AFTER_S:
        return StepDefinition("window", "a 100 ms window (nothing in the script repeats)", window_s=0.1)
    return None


def _from_roots(obs: Observations, now: float) -> StepDefinition | None:
    counts = Counter(r.module_id for r in obs.roots)
    root_id, _ = counts.most_common(1)[0]
    calls = [r for r in obs.roots if r.module_id == root_id]
    name = calls[0].module
    via = Counter(r.via for r in calls).most_common(1)[0][0]
    if via is None:
        if len(calls) < MIN_EVENTS:
            return None
        return StepDefinition("module", f"one call of {name}.forward", module=name)
    # Called through another function (generate): the step is the user's loop around that function.
    loop = _loop_around(obs, [r.time for r in calls])
    if loop is not None:
        per_step = _calls_per_iteration(obs.loops[loop], [r.time for r in calls])
        return StepDefinition(
            "call",
            f"one call of {via} ({per_step:.0f} calls of {name}.forward), in the loop at {loop.describe()}",
            loop=loop,
            module=name,
            calls_per_step=per_step,
        )
    if now - calls[0].time >= CALL_WAIT_S and len(calls) >= MIN_EVENTS:
        return StepDefinition("module", f"one call of {name}.forward (through {via})", module=name)
    return None


def _repeating(obs: Observations) -> list[LoopKey]:
    return [k for k, times in obs.loops.items() if len(times) >= MIN_EVENTS]


def _period(times: list[float]) -> float:
    return statistics.median(b - a for a, b in itertools.pairwise(times))


def _loop_around(obs: Observations, calls: list[float]) -> LoopKey | None:
    """The innermost of the user's loops whose last two whole iterations each made root calls."""
    found = []
    for loop, ends in obs.loops.items():
        if len(ends) < MIN_EVENTS:
            continue
        spans = list(zip(ends[-3:], ends[-2:], strict=False))
        if all(any(a <= t < b for t in calls) for a, b in spans):
            found.append(loop)
    return min(found, key=lambda k: _period(obs.loops[k])) if found else None


def _calls_per_iteration(ends: list[float], calls: list[float]) -> float:
    spans = list(itertools.pairwise(ends))[-5:]
    counts = [sum(a <= t < b for t in calls) for a, b in spans]
    return statistics.mean(counts)
