"""Which fixes to try, from the doctor's findings and what the baseline round saw the script do: each
finding points to the fixes that answer it; a few cheap fixes are tried wherever their condition shows
(float32 matmuls on a GPU → TF32 and bfloat16; convolutions → channels_last and cudnn.benchmark; an
optimizer that is not fused; a loader without workers in a loader-bound loop: worker counts up to the
free cores, or past them where the loader waits rather than computes). Findings no fix here can apply
safely become `ManualFix`es: the source line and the change to make, never silently dropped."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from gpudoctor.fixes.catalog import FIXES, SPECS, validate
from gpudoctor.fixes.kinds.base import Proposing
from gpudoctor.fixes.observe import Observations
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
    """(fix id, why) of every fix worth trying here, in the catalog's order."""
    p = Proposing(found, obs, allow_batch, compile_mode, step_s, steps)
    return [proposal for fix in FIXES for proposal in fix.propose(p)]


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
        if source is None and site.function and not site.function.startswith("<"):
            # a profiler's frame (`rl.py(80): forward`): the file by name alone, the line its function
            # starts on; what is meant is the function
            where += f" in {site.function}()"
    return ManualFix(rule, title, where, source, change)


def worker_count(fix: str) -> int:
    """N of a `workers:N` fix."""
    return int(fix.split(":", 1)[1])
