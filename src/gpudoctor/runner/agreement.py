"""How the ranks of a run end their light phase at the same step: the steps rank 0 planned, then — where
the ranks' steps have not all settled — more, up to `settle.EXTEND_FACTOR` times the plan. At each check
(the plan's end, then every `settle.AGREE_CHUNK` of the plan) each rank posts whether its own steps
settled; `settle.AGREE_LAG` steps later every rank reads all the posts and ends, or goes on, alike."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from gpudoctor.runner import settle
from gpudoctor.runner.phases import LiveOptions


class LightAgreement(Protocol):
    """How the ranks of a run agree on extending their light phase alike (`runner.ranks.RankRun`)."""

    def post_settled(self, check: int, settled: bool) -> None:
        """Tell the other ranks whether this rank's light-phase steps have settled at `check`."""

    def all_settled(self, check: int) -> bool:
        """Whether every rank's had at `check` (True where some rank's post cannot be read: end)."""

    def shared(self, key: str, value: int) -> int:
        """Rank 0's `value` for `key`, on every rank (this rank's own where rank 0's cannot be read)."""


class RankAgreement:
    """One rank's side of the agreement over the light phases of one capture. The check numbers go on
    from one light phase to the next (a phase begun again after the step changed): each check's posts
    are written once."""

    def __init__(self) -> None:
        self.target: int | None = None  # the light-phase steps rank 0 planned
        self.agree: LightAgreement | None = None  # None: the plan alone, never extended
        self.check = 0
        self._check_at: int | None = None  # the light-phase step of the next check
        self._posted_at: int | None = None  # the step at which this rank posted the current check

    def begin(self, target: int | None, agree: LightAgreement | None) -> None:
        """A light phase begins, of `target` steps (None: not agreed among ranks)."""
        self.target, self.agree = target, agree
        self._check_at, self._posted_at = None, None

    def done(self, steps: int, options: LiveOptions, settled: Callable[[], bool]) -> bool:
        """Whether the light phase ends at its `steps`-th step; `settled()` says whether this rank's
        steps have settled, asked at each check."""
        assert self.target is not None
        if self.agree is None or not options.settle or options.light_seconds <= 0:
            return steps >= self.target
        if steps >= settle.EXTEND_FACTOR * self.target:  # the cap: every rank at the same step
            return True
        if self._posted_at is None:
            if steps < (self._check_at or self.target):
                return False
            self.agree.post_settled(self.check, settled())
            self._posted_at = steps
            return False
        if steps < self._posted_at + settle.AGREE_LAG:
            return False
        if self.agree.all_settled(self.check):
            return True
        self.check += 1
        self._check_at = steps + max(1, math.ceil(settle.AGREE_CHUNK * self.target))
        self._posted_at = None
        return False
