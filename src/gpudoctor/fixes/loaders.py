"""The DataLoaders that feed a loop, from what a round saw of them: which loaders feed the steps (and how
many batches a step), the share of a step the training thread spends on a loader's batches, how many
workers keep up with a loader that waits rather than computes, and the worker counts to try."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from gpudoctor.fixes.observe import LoaderInfo
from gpudoctor.fixes.round import RoundResult

WORKER_STEPS = (2, 4, 8, 16, 32)
MAX_WORKER_VALUES = 3
MAX_WAITING_WORKERS = 32  # a loader that waits (I/O) may use more workers than cores, up to this


def worker_values(free: int, have: int, needed: int | None = None) -> list[int]:
    """A few worker counts more than the loader has now: up to the free cores, or up to `needed` where
    the loader waits rather than computes (workers that sleep on I/O do not compete for the cores)."""
    top = max(free, min(needed, MAX_WAITING_WORKERS)) if needed else free
    values = sorted({v for v in WORKER_STEPS if v < top} | ({top} if top > 0 else set()))
    return [v for v in values if v > have][-MAX_WORKER_VALUES:]


def workers_needed(loader: LoaderInfo, per_step: float = 1.0, *, step_s: float | None) -> int | None:
    """Workers that keep up with the loop for a loader that waits: its time per step (`per_step`
    batches) over the time the loop spends on everything else per step, and one more; None where that
    is not measured."""
    if loader.fetch_s is None or step_s is None:
        return None
    fetch = loader.fetch_s * per_step
    rest = max(step_s - fetch, 0.1 * fetch)  # the loop's own work per step (the loader's taken out)
    return math.ceil(fetch / rest) + 1


# The training thread waits for its loader's workers this share of its mean step or more: the loader
# still paces the loop, and GPU fixes on top show little until more workers keep up (timm ConvNeXt-tiny,
# 8 workers on 16 cores of an H100 host: torch.compile on top measured +4%, CI −9 to +16%).
LOADER_PACES = 0.2


def loader_share(loader: LoaderInfo, step_s: float | None, per_step: float = 1.0) -> float:
    """The share of a mean step of `step_s` the training thread spends on `loader`'s batches (waiting
    for its workers, or making them itself), `per_step` batches a step; 0 where not measured."""
    wait = loader.batch_wait_s
    return wait * per_step / step_s if loader.iterated and wait is not None and step_s else 0.0


def training_loaders(loaders: Sequence[LoaderInfo], steps: int) -> list[tuple[LoaderInfo, float]]:
    """The iterated loaders that feed the steps, each with its batches per step: those whose call site
    handed out a batch in half of the `steps` or more (a loader made anew each epoch is its site's; two
    made on one line, a training and a validation loader, differ in their batch size, as a rule).
    A validation loader — Lightning's sanity check takes 2 batches, at 7.6 ms each against a 17.7 ms
    training step: "43% of the step" — feeds none. Where the steps or the batches were not counted,
    every iterated loader, a batch a step each."""
    iterated = [
        (lo, (lo.site, lo.batch_size) if lo.site is not None else id(lo)) for lo in loaders if lo.iterated
    ]
    by_site: dict[object, int] = {}
    for lo, key in iterated:
        by_site[key] = by_site.get(key, 0) + lo.taken
    if steps <= 0 or not any(by_site.values()):
        return [(lo, 1.0) for lo, _ in iterated]
    return [(lo, by_site[key] / steps) for lo, key in iterated if by_site[key] >= 0.5 * steps]


def loader_wait_share(rounds: Sequence[RoundResult]) -> float | None:
    """The median over `rounds` (processes of one configuration) of the largest share of the round's
    mean step the training thread spent per batch on a loader (`loader_share`); None where no round
    measured one. A round in blocks: its candidate's blocks' mean step (the loader makes its batches
    alike on both sides)."""
    shares = []
    for r in rounds:
        mine = [b for b in r.blocks if b.candidate and b.steps]
        step = sum(b.elapsed_us for b in mine) / sum(b.steps for b in mine) if mine else r.mean_step_us
        obs = r.observations
        if obs is None or not step:
            continue
        fed = [
            (lo, n) for lo, n in training_loaders(obs.loaders, r.steps_seen) if lo.batch_wait_s is not None
        ]
        if fed:
            shares.append(max(loader_share(lo, step / 1e6, n) for lo, n in fed))
    return statistics.median(shares) if shares else None
