"""Every fix gpudoctor can apply (`FIXES`, one object each: `kinds.base.Fix`), in the order they are
proposed, and what the search asks of a fix id (`kind` or `kind:argument`, e.g. `workers:8`,
`compile:reduce-overhead`): its object, title, patch, whether it switches in a running process (its A/B
then runs in blocks of one process, also in a kept fix's place where both wrap the forward), and its
change in the user's own idiom."""

from __future__ import annotations

from collections.abc import Sequence

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.frameworks import framework_of, in_framework_terms
from gpudoctor.fixes.kinds.base import HALF_REORDER_TOLERANCE, TF32_TOLERANCE, TIGHT, Fix
from gpudoctor.fixes.kinds.dist import DdpFix, NoSyncFix
from gpudoctor.fixes.kinds.loader import LargerBatchFix, PinMemoryFix, WorkersFix
from gpudoctor.fixes.kinds.loop import (
    FusedOptimizerFix,
    NoEmptyCacheFix,
    NoOpFix,
    NoValidationFix,
    NudgeFix,
    ReseedFix,
    ZeroGradNoneFix,
)
from gpudoctor.fixes.kinds.model import (
    AutocastFix,
    ChannelsLastFix,
    CompileFix,
    CompileFunctionsFix,
    CudnnBenchmarkFix,
    SdpaFix,
    TF32Fix,
)
from gpudoctor.fixes.patches.base import FixPatch, PatchContext
from gpudoctor.fixes.patches.forward import ForwardWrapper
from gpudoctor.util.errors import UsageError

__all__ = ["FIXES", "HALF_REORDER_TOLERANCE", "SPECS", "TF32_TOLERANCE", "TIGHT", "Fix"]

FIXES: tuple[Fix, ...] = (
    CompileFunctionsFix(),  # before CompileFix: where it is proposed, the group's first
    CompileFix(),
    AutocastFix(),
    TF32Fix(),
    ChannelsLastFix(),
    CudnnBenchmarkFix(),
    SdpaFix(),
    FusedOptimizerFix(),
    ZeroGradNoneFix(),
    NoEmptyCacheFix(),
    NoValidationFix(),
    NoSyncFix(),  # before DDP's knobs, tied on the same finding: it removes (k-1)/k of the all-reduces
    DdpFix(),
    WorkersFix(),
    PinMemoryFix(),
    LargerBatchFix(),
    NoOpFix(),
    ReseedFix(),
    NudgeFix(),
)
SPECS: dict[str, Fix] = {f.kind: f for f in FIXES}
PATCH_CLASSES: dict[str, type[FixPatch]] = {f.kind: f.patch for f in FIXES}
INTERNAL = ("reseed", "nudge")  # rounds of the search's own (the numerics' yardsticks), not fixes to ask for


def asked(fix_id: str) -> str:
    """A fix id the user gave (`--only`, `--skip`): one of the fixes, not a round of the search's own."""
    if fix_id.split(":", 1)[0] in INTERNAL:
        known = ", ".join(k for k in SPECS if k not in INTERNAL)
        raise UsageError(f"unknown fix {fix_id!r} (known: {known})")
    return validate(fix_id)


def spec_of(fix_id: str) -> Fix:
    kind = fix_id.split(":", 1)[0]
    if kind not in SPECS:
        raise UsageError(
            f"unknown fix {fix_id!r} (known: {', '.join(k for k in SPECS if k not in INTERNAL)})"
        )
    return SPECS[kind]


def title_of(fix_id: str) -> str:
    return spec_of(fix_id).title_of(fix_id.partition(":")[2])


def validate(fix_id: str) -> str:
    """The id if it names a fix and a valid argument; a UsageError otherwise."""
    fix = spec_of(fix_id)
    if not fix.valid_arg(fix_id.partition(":")[2]):
        raise UsageError(
            f"bad fix {fix_id!r}: e.g. workers:4, compile:reduce-overhead, autocast:float16, batch:x2"
        )
    return fix_id


def can_switch(switched: tuple[str, ...], replaced: tuple[str, ...] = ()) -> bool:
    """Can a running process turn `switched` on and `replaced` off (its B side), and back (its A side),
    the rest of its fixes staying on? Each must be switchable, and what is replaced must wrap the
    forward: where wrappers differ, each side's forward is built from its own (`ForwardVariants`), so
    autocast can leave from beneath a torch.compile that stays (compile(forward) beside
    compile(autocast(forward))) and one compile mode take another's place."""
    kinds = [f.split(":", 1)[0] for f in (*switched, *replaced)]
    if not switched or not all(k in SPECS and SPECS[k].switchable for k in kinds):
        return False
    return all(wraps_forward(f) for f in replaced)


def wraps_forward(fix_id: str) -> bool:
    """Does the fix wrap the forward of the step's modules (autocast, torch.compile)?"""
    fix = SPECS.get(fix_id.split(":", 1)[0])
    return fix is not None and issubclass(fix.patch, ForwardWrapper)


def build_patch(
    fix_id: str, ctx: PatchContext, *, compile_backend: str = "inductor", exact_random: bool = False
) -> FixPatch:
    kind, _, arg = validate(fix_id).partition(":")
    patch = SPECS[kind].build(ctx, arg, compile_backend=compile_backend, exact_random=exact_random)
    patch.name = fix_id
    return patch


def in_users_idiom(fix_id: str, edits: Sequence[Edit], script: str | None) -> list[Edit]:
    """A kept fix's change as the user writes it: where the script hands its loop (or its precision) to
    a framework, that framework's switch for it — `TrainingArguments(torch_compile=True)`, Lightning's
    `precision="bf16-mixed"`, `Accelerator(mixed_precision="bf16")` — else its own edits, each written as
    a framework's option where it lands on a framework's call."""
    kind, _, arg = fix_id.partition(":")
    files = [script, *(e.file for e in edits)]
    fw = next((f for f in map(framework_of, dict.fromkeys(files)) if f is not None), None)
    if fw is not None:
        own = SPECS[kind].in_framework(fw, arg, edits)
        if own is not None:
            return own
    return in_framework_terms(edits)
