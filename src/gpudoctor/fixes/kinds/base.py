"""`Fix`: one fix as one object — its id (`kind` or `kind:argument`: `workers:8`,
`compile:reduce-overhead`), title, the findings it answers, the numerics tolerance it is held to, the
group of alternatives it belongs to (one of a group is kept), its patch, and the questions the search asks
of it: is it proposed here (`propose`), does it apply (`why_not`), did it take effect (`not_in_effect`),
and what is its change in the user's framework (`in_framework`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.evidence import RoundWork
from gpudoctor.fixes.frameworks import Framework
from gpudoctor.fixes.observe import Observations
from gpudoctor.fixes.patches.base import FixPatch, PatchContext

# Largest relative difference of the first steps' losses (or outputs) from the baseline's. Changes that
# only reorder floating-point work are held tight; reduced-precision arithmetic is allowed its rounding.
TIGHT = 1e-3
TF32_TOLERANCE = 1e-2  # 10-bit mantissa products, float32 accumulation
HALF_TOLERANCE = 5e-2  # bfloat16's 8-bit mantissa; the loss of a few steps moves by about a percent
# a script already computing in bfloat16 or float16: work reordered in it rounds at their precision
# (BERT under the Trainer's bf16=True, compiled: 0.1% over 5 steps, past float32's TIGHT)
HALF_REORDER_TOLERANCE = 1e-2


@dataclass(frozen=True)
class Proposing:
    """What the search knows when it proposes fixes: the findings by id, what the baseline round saw,
    and the user's options."""

    found: dict[str, Any]  # finding id -> Finding
    obs: Observations
    allow_batch: bool = False
    compile_mode: str | None = None
    step_s: float | None = None  # the baseline's mean step
    steps: int = 0  # steps the observing round made


class Fix:
    kind: ClassVar[str]
    title: ClassVar[str]
    rules: ClassVar[tuple[str, ...]] = ()  # the findings it answers
    tolerance: ClassVar[float | None] = TIGHT  # None: results are not comparable (finite is enough)
    tolerance_note: ClassVar[str] = ""
    group: ClassVar[str]  # alternatives: one of a group goes into the combination (its kind, by default)
    # judged on speed alone: where batches are made changes, not the model's arithmetic
    speed_only: ClassVar[bool] = False
    # draws other dropout masks than the baseline (bfloat16's dropout kernel lays its random numbers out
    # otherwise: lab/bf16_dropout_numerics.py), so that with dropout its losses are also held to how far
    # the step's own random draws move them
    draws_differ: ClassVar[bool] = False
    # changes only the order (and the kernels) of float arithmetic, not its precision: in a loop that
    # amplifies rounding (thresholds that flip, a loss that is a small difference of large terms) its
    # losses are also held to how far a one-ulp change of the weights moves them
    reorders: ClassVar[bool] = False
    # runs the forward as compiled code, whose random draws may differ from eager's where the forward
    # samples (`RootInfo.samples`), Inductor's `fallback_random` notwithstanding
    compiled: ClassVar[bool] = False
    patch: ClassVar[type[FixPatch]]
    example_arg: ClassVar[str] = ""  # for the one-line error of a bad argument

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "group" not in vars(cls) and "kind" in vars(cls):
            cls.group = cls.kind

    @property
    def switchable(self) -> bool:
        return self.patch.switchable

    def valid_arg(self, arg: str) -> bool:
        return not arg

    def title_of(self, arg: str) -> str:
        return self.title

    def build(self, ctx: PatchContext, arg: str, *, compile_backend: str, exact_random: bool) -> FixPatch:
        return self.patch(ctx)

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        """(fix id, why) for each variant of it worth trying here."""
        return []

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        """Why it has nothing to change in this script, or None when it may."""
        return None

    def not_in_effect(self, seen: RoundWork) -> str | None:
        """Why it did not take effect in a round it ran in ("did not take effect: …"); None where it did,
        or where the round cannot tell (its modules not probed, or nothing to read for this fix)."""
        return None

    def evidence(self, seen: RoundWork) -> str | None:
        """What the round shows of its effect, in a few words (None where nothing is measured for it)."""
        return None

    def in_framework(self, fw: Framework, arg: str, edits: Sequence[Edit]) -> list[Edit] | None:
        """Its change as the framework's own switch, where the framework has one (None: its edits)."""
        return None


def round_work(obs: Observations) -> RoundWork:
    return RoundWork(obs.work, obs.compiled, len(obs.step_roots))


def roots_named(obs: Observations) -> str:
    return " and ".join(dict.fromkeys(r.cls for r in obs.step_roots))
