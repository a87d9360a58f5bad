"""The numerics guard's reference for one round: the first losses (or outputs) of the baseline's first
process, held to the fixes' tolerance. A loader fix is judged on speed: alone its losses are only held to
stay finite (batches made in worker processes may draw other random numbers); beside fixes that change
the arithmetic, those are held to their tolerance against a round of the loader fix alone (the same
batches), where one was recorded."""

from __future__ import annotations

from gpudoctor.fixes.attempt import Tried
from gpudoctor.fixes.catalog import HALF_REORDER_TOLERANCE, TF32_TOLERANCE, spec_of
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.verify import NOISE_FACTOR, NumericsCheck, check_numerics, noise_floor, rel_diff


def numerics_of(
    fixes: tuple[str, ...],
    run: RoundResult,
    ref: RoundResult,
    baselines: list[RoundResult],
    tried: list[Tried],
    reseeded: RoundResult | None = None,
    nudged: RoundResult | None = None,
) -> NumericsCheck:
    """`reseeded`: a round of the unchanged script whose step drew other random numbers (the yardstick
    for a fix that draws other dropout masks itself): the losses may move as far as its moved them.
    `nudged`: a round of the unchanged script whose weights were one ulp off (the yardstick for fixes
    that only reorder float arithmetic, where the loop amplifies rounding): likewise."""
    loader = tuple(f for f in fixes if spec_of(f).speed_only)
    arithmetic = [spec_of(f) for f in fixes if not spec_of(f).speed_only]
    reference, others = list(ref.outputs), [list(b.outputs) for b in baselines[1:]]
    notes = [s.tolerance_note for s in arithmetic] or [spec_of(f).tolerance_note for f in loader]
    tolerance = None
    if arithmetic and all(s.tolerance is not None for s in arithmetic):
        tolerance = max(s.tolerance or 0.0 for s in arithmetic)
    if loader and arithmetic:
        alone = [r for t in tried if t.fixes == loader for r in t.candidate if r.outputs]
        if alone:
            reference, others = list(alone[0].outputs), [list(r.outputs) for r in alone[1:]]
            notes.append(f"against {'+'.join(loader)} alone (the same batches)")
        else:
            tolerance = None
            notes.append(f"{'+'.join(loader)} changes the batches: only checked to stay finite")
    seen = ref.observations
    half = seen.reduced_precision if seen is not None else None
    if tolerance is not None and tolerance < HALF_REORDER_TOLERANCE and half is not None:
        # reordered work moves the results by the rounding of the precision it runs in
        tolerance = HALF_REORDER_TOLERANCE
        notes.append(f"the script's own model computes in {half}")
    elif tolerance is not None and tolerance < TF32_TOLERANCE and seen is not None and seen.tf32_baseline:
        # reordered TF32 products move the results by TF32's rounding, not float32's
        tolerance = TF32_TOLERANCE
        notes.append("the script's own convolutions or matmuls run in TF32")
    if reseeded is not None and reseeded.outputs and tolerance is not None and not loader:
        # (beside a loader fix the reference is that fix's round, other batches than the yardstick's)
        others.append(list(reseeded.outputs))
        notes.append("it draws other random numbers: also held to how far other random draws move them")
    if nudged is not None and nudged.outputs and tolerance is not None and not loader and reorders(fixes):
        moved = rel_diff(reference, list(nudged.outputs))
        if NOISE_FACTOR * moved > tolerance:  # (where it moves them less, it allows nothing more)
            others.append(list(nudged.outputs))
        notes.append(f"weights one ulp off move this loop's losses {100 * moved:.2g}%")
    note = "; ".join(dict.fromkeys(notes))
    floor = noise_floor(reference, others)
    return check_numerics(
        ref.outputs_kind, reference, run.outputs_kind, list(run.outputs), tolerance, floor, note
    )


def reorders(fixes: tuple[str, ...]) -> bool:
    """A fix of `fixes` reorders float arithmetic (`Fix.reorders`): compiled or fused kernels."""
    return any(spec_of(f).reorders for f in fixes)
