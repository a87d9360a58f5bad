"""The order in which `gpudoctor fix` tries its candidates, and each rule that changes it as the search
goes. `candidates.choose` ranks them by the saving their findings promised, one of each group first;
then, each a pure function of the queue left:

- `loader_first`: a loader that paces the script's step puts a worker count first;
- `after_kept`: a kept fix defers the candidates that answer only what it answered, a kept compile defers
  channels_last, and a loader that still paces the kept configuration brings the largest worker count
  left forward (or says that none is left);
- `alternative_next`: a group whose first failed gives its place to its alternative.

A queue holds (number, candidate): the candidate's rank from 1, which `FIRST_VERDICTS` reads."""

from __future__ import annotations

from collections.abc import Sequence

from gpudoctor.fixes.attempt import Tried
from gpudoctor.fixes.candidates import Candidate, worker_count
from gpudoctor.fixes.catalog import SPECS
from gpudoctor.fixes.loaders import LOADER_PACES, loader_wait_share

Queue = list[tuple[int, Candidate]]

FIRST_VERDICTS = 4  # candidates judged before time is kept back for the check against the script

# the end of the note for a loop its loader still paces with every worker count tried: what such a loop
# looks like, an accelerate loop over timm's ResNet-50 on FakeData with PIL transforms, 15 workers on a
# 16-core H100 host: 43 ms a step with or without bfloat16 autocast or compile on top
STILL_PACED = (
    "fixes of the GPU's work show little on top until the batches come faster (less work per item in "
    "the Dataset, augmentation on the GPU, more CPU cores)"
)


def loader_first(queue: Queue, share: float | None) -> tuple[Queue, str | None]:
    """Where the script's training thread spends a fifth of its step or more (`share`, None: not
    measured) on its loader's batches, a worker count goes first (the group's first, as ranked): until
    the loader is off the training thread, a GPU fix timed against the script shows little even where
    the GPU bounds the step. The note says so."""
    first = next((qc for qc in queue if qc[1].fix.startswith("workers:")), None)
    if share is None or share < LOADER_PACES or first is None or queue[0] is first:
        return queue, None
    note = (
        f"the training thread spent {100 * share:.0f}% of the script's step on its DataLoader's batches: "
        f"{workers(worker_count(first[1].fix))} tried first"
    )
    return [first] + [qc for qc in queue if qc is not first], note


def after_kept(
    queue: Queue, kept: Tried, final: tuple[str, ...], answered: set[str], notes: Sequence[str]
) -> tuple[Queue, list[str]]:
    """The queue once `kept` joined what is kept (`final` now; `answered`: the findings the kept fixes
    answered), and the session's `notes` with what it changed said."""
    queue = defer_answered(queue, answered, FIRST_VERDICTS)
    queue = defer_under_compile(queue, final, FIRST_VERDICTS)
    return while_the_loader_paces(queue, kept, final, notes)


def while_the_loader_paces(
    queue: Queue, kept: Tried, final: tuple[str, ...], notes: Sequence[str]
) -> tuple[Queue, list[str]]:
    """Where the kept configuration's processes still spend a fifth of the step or more on their
    loader's batches (waiting for its workers, or making them on the training thread), the loader
    is still the bottleneck: the largest worker count left goes first (`more_workers_first`). Where
    none larger is left, the notes say that the fixes on top can show little, and why."""
    out = list(notes)
    share = loader_wait_share(kept.candidate)
    if share is None or share < LOADER_PACES:
        return queue, out
    kept_workers = [worker_count(f) for f in final if f.startswith("workers:")]
    own = [lo.num_workers for r in kept.candidate if r.observations for lo in r.observations.loaders]
    have = max(kept_workers or own or [0])
    doing = "waiting for its DataLoader's workers" if have else "making its batches"
    if not larger_worker_counts(queue, have):
        out = [n for n in out if not n.endswith(STILL_PACED)]  # the latest kept says it
        out.append(
            f"with {'+'.join(final)} the loop still spent {100 * share:.0f}% of its step {doing}, "
            f"and no larger worker count is left to try: {STILL_PACED}"
        )
        return queue, out
    ahead = more_workers_first(queue, have)
    if ahead[:1] != queue[:1]:  # the largest count left, moved to the front
        out.append(
            f"with {'+'.join(final)} the loop still spent {100 * share:.0f}% of its step "
            f"{doing}: {workers(worker_count(ahead[0][1].fix))} in place of {have} tried next"
        )
    return ahead, out


def workers(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


def defer_answered(queue: Queue, done: set[str], first: int = 0) -> Queue:
    """The candidates left, those answering only findings the kept fixes already answered (`done`)
    moved behind the rest, each part in its order: pinned memory after 32 loader workers took the
    starved loop from 609 to 106 ms is no longer the most promising fix, and on top of them its process
    pairs would take minutes (47 s a round there) before a GPU fix is tried. The first `first`
    candidates (numbered from 1: the most promising, whose verdicts come first) stay ahead of the others."""
    spent = [qc for qc in queue if qc[1].rules and set(qc[1].rules) <= done]
    return _first_ahead([qc for qc in queue if qc not in spent] + spent, first)


def defer_under_compile(queue: Queue, kept: Sequence[str], first: int = 0) -> Queue:
    """Once torch.compile is kept, channels_last moved behind the other candidates (the first `first`
    staying ahead): Inductor lays out a graph's convolutions itself, so little is left for it, while each
    of its rounds compiles the model again and can spend the budget of the fixes behind it."""
    if not any(f.startswith("compile") for f in kept):
        return queue
    layout = [qc for qc in queue if qc[1].fix == "channels_last"]
    return _first_ahead([qc for qc in queue if qc not in layout] + layout, first)


def _first_ahead(queue: Queue, first: int) -> Queue:
    """`queue` with its candidates numbered `first` or lower ahead of the others, each part in its order
    (TF32 deferred behind compile, channels_last and cuDNN's autotuner lost its verdict to a 5-minute
    budget on timm's ConvNeXt: it is one of the four most promising, they are not)."""
    return sorted(queue, key=lambda qc: qc[0] > first)


def more_workers_first(queue: Queue, have: int) -> Queue:
    """The candidates left, the largest worker count above `have` (the kept one, else the script's
    own) moved to the front: where the loader still paces the loop on top of what is kept, it is still
    the bottleneck, and a GPU fix timed on top of it shows little (it is not timed again). The smaller
    counts keep their places: each is a minute or more of process pairs, which a 5-minute budget
    spends on the four most promising fixes instead."""
    more = larger_worker_counts(queue, have)
    if not more:
        return queue
    top = max(more, key=lambda qc: worker_count(qc[1].fix))
    return [top] + [qc for qc in queue if qc is not top]


def larger_worker_counts(queue: Queue, have: int) -> Queue:
    """The worker counts left in `queue` above `have`."""
    return [qc for qc in queue if qc[1].fix.startswith("workers:") and worker_count(qc[1].fix) > have]


def alternative_next(queue: Queue, failed: str) -> Queue:
    """The candidates left, the next of `failed`'s group moved to the front: where a group's first
    failed, its alternative has the group's place (plain compile after CUDA graphs failed on a UNet,
    where `breadth_first` had put it behind every other group, and a 10-minute budget ran out first)."""
    group = SPECS[failed.split(":")[0]].group
    alt = next((qc for qc in queue if SPECS[qc[1].fix.split(":")[0]].group == group), None)
    return queue if alt is None else [alt] + [qc for qc in queue if qc is not alt]
