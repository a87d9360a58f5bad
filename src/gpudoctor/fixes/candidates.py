"""Which fixes to try, from the doctor's findings and what the baseline round saw the script do: each
finding points to the fixes that answer it; a few cheap fixes are tried wherever their condition shows
(float32 matmuls on a GPU → TF32 and bfloat16; convolutions → channels_last and cudnn.benchmark; an
optimizer that is not fused; a loader without workers in a loader-bound loop: worker counts up to the
free cores, or past them where the loader waits rather than computes). Findings no fix here can apply
safely become `ManualFix`es: the source line and the change to make, never silently dropped."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpudoctor.fixes.catalog import SPECS, validate
from gpudoctor.fixes.observe import LoaderInfo, Observations
from gpudoctor.fixes.round import RoundResult
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.runner.hooks import CallSite

ITEM_CHANGE = (
    "keep the value on the GPU (e.g. running_loss += loss.detach()) and read it with .item() every N "
    "steps: each .item() waits for the GPU to finish the step"
)
INNER_ITEM_CHANGE = (
    "a call made from this line reads a GPU value with .item() every step (per-step logging or metrics "
    "inside it?): read such values every N steps"
)
# Findings that no automatic fix answers, and the change to make by hand.
MANUAL = {
    "host_sync": ITEM_CHANGE,
    "attention_materialized": "compute attention with torch.nn.functional.scaled_dot_product_attention(q, k, v)",
    "small_batch": "a larger batch (gpudoctor fix --allow-batch tries doubling it), or batched inference",
    "memory_pressure": "activation checkpointing, bfloat16, or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "data_parallel": "DistributedDataParallel, one process per GPU (torchrun)",
    "communication_exposed": "even out the slowest rank's work; larger DDP buckets; no_sync() gradient accumulation",
    "host_python": "move per-step Python (logging, metrics, data preparation) off the training thread",
    "allocator_thrash": "keep shapes stable; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
}
# Findings about how the run was observed, not about the script: nothing for the user to change.
NOT_THE_SCRIPTS = frozenset({"profiler_distortion"})
WORKER_STEPS = (2, 4, 8, 16, 32)
MAX_WORKER_VALUES = 3
MAX_WAITING_WORKERS = 32  # a loader that waits (I/O) may use more workers than cores, up to this


@dataclass(frozen=True)
class Candidate:
    fix: str
    predicted_saving_pct: float | None  # the largest saving the findings it answers promised
    rules: tuple[str, ...]  # those findings
    why: str


@dataclass(frozen=True)
class ManualFix:
    rule: str
    title: str
    where: str | None  # file:line
    source_line: str | None  # the line as it is in the file
    change: str


def choose(
    diagnosis: Diagnosis | None,
    obs: Observations,
    *,
    allow_batch: bool = False,
    compile_mode: str | None = None,
    only: tuple[str, ...] = (),
    skip: tuple[str, ...] = (),
    steps: int = 0,
    step_s: float | None = None,
) -> tuple[list[Candidate], list[ManualFix]]:
    """The fixes to try, highest predicted saving first (one of each group before the alternatives),
    and the changes left to the user. `steps`: how many steps the observing run made (a call seen in
    half of them or more happens every step); `step_s`: its mean step (how many workers a waiting
    loader needs)."""
    found = {f.id: f for f in diagnosis.findings} if diagnosis else {}
    proposals: dict[str, str] = {}
    for fix, why in _proposals(found, obs, allow_batch, compile_mode, step_s, steps):
        proposals.setdefault(fix, why)
    if only:
        proposals = {validate(f): proposals.get(f, "asked for (--only)") for f in only}
    proposals = {f: w for f, w in proposals.items() if f.split(":")[0] not in skip and f not in skip}
    candidates = []
    for fix, why in proposals.items():
        rules = tuple(r for r in SPECS[fix.split(":")[0]].rules if r in found)
        predicted = max((found[r].est_saving_pct for r in rules), default=None)
        candidates.append(Candidate(fix, predicted, rules, why))
    candidates.sort(key=lambda c: -(c.predicted_saving_pct or 0.0))
    answered = {r for c in candidates for r in c.rules}
    return breadth_first(candidates), manual_fixes(diagnosis, obs, answered, allow_batch, steps)


def breadth_first(candidates: list[Candidate]) -> list[Candidate]:
    """One of each group first (in the order given), then the alternatives: where the time budget runs
    short, it buys bfloat16 beside CUDA graphs rather than plain torch.compile after them. A group's
    first is its first member, but for worker counts the middle one (more workers gain most, up to a
    point: the extremes are the alternatives)."""
    groups: dict[str, list[Candidate]] = {}
    for c in candidates:
        groups.setdefault(SPECS[c.fix.split(":")[0]].group, []).append(c)
    first = {
        id(members[len(members) // 2] if group == "workers" else members[0])
        for group, members in groups.items()
    }
    return [c for c in candidates if id(c) in first] + [c for c in candidates if id(c) not in first]


def _proposals(
    found: dict,
    obs: Observations,
    allow_batch: bool,
    compile_mode: str | None,
    step_s: float | None = None,
    steps: int = 0,
) -> list[tuple[str, str]]:
    root, cuda = obs.root, obs.cuda
    out: list[tuple[str, str]] = []
    # float32 arithmetic to speed up: not where autocast already runs the layers in bfloat16 (the
    # Trainer's bf16=True: bfloat16 autocast timed on top of it measured -1.2%)
    fp32 = root is not None and root.dtype == "float32" and root.autocast is None
    if root is not None and (cuda or found):
        mode = f":{compile_mode}" if compile_mode and compile_mode != "default" else ""
        # the GPU waits on the host (launches, Python between ops) and the shapes never change: CUDA
        # graphs replay the whole step in one launch, the expert's first choice, so tried first
        host_bound = bool({"launch_overhead", "host_python"} & set(found)) or not found
        if not mode and cuda and obs.static_shapes and host_bound:
            out.append(("compile:reduce-overhead", "host-bound with static input shapes: CUDA graphs"))
        out.append((f"compile{mode}", "the root module can be compiled"))
    if fp32 and (cuda or "tensor_cores_unused" in found):
        out.append(("autocast", "float32 model: bfloat16 tensor cores"))
        if obs.float32_matmul_precision == "highest":
            out.append(("tf32", "float32 matmuls at full precision"))
    if root is not None and root.conv2d and (cuda or "conv_layout" in found):
        out.append(("channels_last", "convolutions in NCHW"))
        if not obs.cudnn_benchmark:
            out.append(("cudnn_benchmark", "convolutions without cuDNN's autotuner"))
    if root is not None and root.hf_attention == "eager":
        out.append(("sdpa", "a Hugging Face model with eager attention"))
    if any(not o.fused and o.fusable for o in obs.optimizers):
        out.append(("fused_optimizer", "an optimizer that is not fused"))
    if obs.zero_grad_keep:
        out.append(("zero_grad_none", "zero_grad(set_to_none=False)"))
    if obs.empty_cache:
        out.append(("no_empty_cache", "torch.cuda.empty_cache() inside the loop"))
    # the loaders that feed the steps (not a validation loader), each with its batches per step
    fed = [(lo, n) for lo, n in training_loaders(obs.loaders, steps) if not lo.iterable]
    loaders = [lo for lo, _ in fed]
    heavy = [(lo, n) for lo, n in fed if loader_share(lo, step_s, n) >= LOADER_PACES]
    if loaders and ("input_pipeline" in found or not found or heavy):
        have = max(lo.num_workers for lo in loaders)
        waiting = [(lo, n) for lo, n in fed if lo.waits]
        need = workers_needed(*waiting[0], step_s=step_s) if waiting else None
        if need:
            why = "the DataLoader waits (its batches take little CPU time): workers past the cores"
        elif "input_pipeline" in found or not found:
            why = "the GPU waits for the DataLoader"
        else:  # GPU-bound now: the loader's time overlaps the GPU's, until GPU fixes cut the step
            share = loader_share(heavy[0][0], step_s, heavy[0][1])
            why = f"the training thread spends {100 * share:.0f}% of the step on the DataLoader's batches"
        out += [(f"workers:{n}", why) for n in worker_values(obs.free_cores, have, need)]
    if (
        loaders
        and cuda
        and not all(lo.pin_memory for lo in loaders)
        and ({"input_pipeline", "pageable_copy"} & set(found) or not found)
    ):
        out.append(("pin_memory", "batches copied from pageable memory"))
    if allow_batch and any(lo.batch_size for lo in loaders):
        out.append(("batch:x2", "--allow-batch: twice the batch, timed per sample"))
    return out


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


_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): ")


def manual_fixes(
    diagnosis: Diagnosis | None, obs: Observations, answered: set[str], allow_batch: bool, steps: int = 0
) -> list[ManualFix]:
    out: list[ManualFix] = []
    per_step = [s for s in obs.item_syncs if s.count >= max(2, steps // 2)]
    for s in per_step:
        m = _manual(
            "host_sync", f".item() on a GPU tensor: {s.count} calls in {steps} steps", s.site, ITEM_CHANGE
        )
        if m.source_line is not None and ".item(" not in m.source_line:
            m = replace(m, change=INNER_ITEM_CHANGE)
        out.append(m)
    for lo in obs.loaders:
        if lo.iterated and lo.iterable and lo.num_workers == 0:
            out.append(
                _manual(
                    "input_pipeline",
                    "an IterableDataset loaded on the training thread",
                    lo.site,
                    "split the dataset by torch.utils.data.get_worker_info() in __iter__, "
                    "then set num_workers",
                )
            )
    for f in diagnosis.findings if diagnosis else ():
        if f.id in answered or f.id in NOT_THE_SCRIPTS or (f.id == "small_batch" and allow_batch):
            continue
        if f.id == "host_sync" and per_step:
            continue
        change = MANUAL.get(f.id, f.fix.summary)
        sites = [_site_of(s) for s in f.sources] or [None]
        out += [_manual(f.id, f.title, s, change) for s in sites]
    # a finding found more than once (per stream, per device) is one change to make, per place
    return list(dict.fromkeys(out))


def _site_of(frame: str) -> CallSite | None:
    m = _FRAME.match(frame)
    return CallSite(m["file"], int(m["line"]), frame[m.end() :]) if m else None


def _manual(rule: str, title: str, site: CallSite | None, change: str) -> ManualFix:
    where = source = None
    if site is not None:
        where = f"{site.file}:{site.line}"
        try:
            source = Path(site.file).read_text(encoding="utf-8").splitlines()[site.line - 1].strip()
        except (OSError, UnicodeDecodeError, IndexError):
            source = None
    return ManualFix(rule, title, where, source, change)


def defer_answered(
    queue: list[tuple[int, Candidate]], done: set[str], first: int = 0
) -> list[tuple[int, Candidate]]:
    """The candidates left, those answering only findings the kept fixes already answered (`done`)
    moved behind the rest, each part in its order: pinned memory after 32 loader workers took the
    starved loop from 609 to 106 ms is no longer the most promising fix, and on top of them its process
    pairs would take minutes (47 s a round there) before a GPU fix is tried. The first `first`
    candidates (numbered from 1: the most promising, whose verdicts come first) stay ahead of the others."""
    spent = [qc for qc in queue if qc[1].rules and set(qc[1].rules) <= done]
    return _first_ahead([qc for qc in queue if qc not in spent] + spent, first)


def defer_under_compile(
    queue: list[tuple[int, Candidate]], kept: Sequence[str], first: int = 0
) -> list[tuple[int, Candidate]]:
    """Once torch.compile is kept, channels_last moved behind the other candidates (the first `first`
    staying ahead): Inductor lays out a graph's convolutions itself, so little is left for it, while each
    of its rounds compiles the model again and can spend the budget of the fixes behind it."""
    if not any(f.startswith("compile") for f in kept):
        return queue
    layout = [qc for qc in queue if qc[1].fix == "channels_last"]
    return _first_ahead([qc for qc in queue if qc not in layout] + layout, first)


def _first_ahead(queue: list[tuple[int, Candidate]], first: int) -> list[tuple[int, Candidate]]:
    """`queue` with its candidates numbered `first` or lower ahead of the others, each part in its order
    (TF32 deferred behind compile, channels_last and cuDNN's autotuner lost its verdict to a 5-minute
    budget on timm's ConvNeXt: it is one of the four most promising, they are not)."""
    return sorted(queue, key=lambda qc: qc[0] > first)


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


def more_workers_first(queue: list[tuple[int, Candidate]], have: int) -> list[tuple[int, Candidate]]:
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


def larger_worker_counts(queue: list[tuple[int, Candidate]], have: int) -> list[tuple[int, Candidate]]:
    """The worker counts left in `queue` above `have`."""
    return [qc for qc in queue if qc[1].fix.startswith("workers:") and worker_count(qc[1].fix) > have]


def worker_count(fix: str) -> int:
    """N of a `workers:N` fix."""
    return int(fix.split(":", 1)[1])
