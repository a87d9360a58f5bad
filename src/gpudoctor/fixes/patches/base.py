"""What every fix's patch shares: `FixPatch` (apply/undo through a `Restorer`, so that a failure half-way
leaves nothing behind; `switch(on)` for a fix that can be turned off and on again in the running process,
for an A/B in blocks of steps), the outcome it reports after the run (applied or why not, what it
changed, the edits that make it permanent), and the context patches share in a child process (the
finder of the top-level modules the step calls)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from gpudoctor.fixes.edits import Edit
from gpudoctor.runner.hooks import CallSite, Restorer, RootFinder, call_site


class NotSwitchable(Exception):
    """This fix cannot be turned off and on in a running process (its A/B needs fresh processes)."""


@dataclass
class PatchContext:
    finder: RootFinder
    script: str | None = None  # the user's script file (None with -m): where global settings go


@dataclass(frozen=True)
class PatchOutcome:
    """What a patch did in one run: `applied` (it changed something the script used) or `reason` why
    not; `changes` in words; `edits` that make it permanent in the user's files."""

    applied: bool
    reason: str | None = None
    changes: tuple[str, ...] = ()
    edits: tuple[Edit, ...] = ()
    snippet: str | None = None  # the change as code, where no call site is known


class FixPatch:
    """One fix, applied to the child's process before the script runs and undone after it. Subclasses
    implement `_apply` (changes go through `self.restorer`) and may override `outcome`."""

    fix_id = "fix"
    order = 50  # patches apply in this order: flags first, then what wraps the root's forward
    # turned off and on again in the running process by `switch` (its A/B in blocks of one process)
    switchable = False

    def __init__(self, ctx: PatchContext) -> None:
        self.ctx = ctx
        self.name = self.fix_id
        self.restorer = Restorer()
        # (the top-level module it was made for, or None; what changed; the edit that makes it permanent)
        self._changes: list[tuple[int | None, str, Edit | None]] = []
        self.snippet: str | None = None
        self.not_applicable: str | None = None
        self._sites_seen: set[tuple[str, int]] = set()

    def apply(self) -> None:
        try:
            self._apply()
        except BaseException:
            self.restorer.restore()
            raise

    def undo(self) -> None:
        self.restorer.restore()

    def _apply(self) -> None:
        raise NotImplementedError

    def switch(self, on: bool) -> None:
        """Turn the applied change off (as the script had it) or on again, at a step boundary; undo()
        afterwards still restores what apply() found. Nothing to do where it was never applied."""
        raise NotSwitchable(f"{self.name} cannot be switched off and on in a running process")

    # -- bookkeeping for the outcome ----------------------------------------------------------------------
    def changed(self, what: str, edit: Edit | None = None, module: Any = None) -> None:
        """Record a change (and its edit); `module`: the top-level module it was made for, so that the
        outcome keeps only those the loop calls per step (not one called once at set-up)."""
        self._changes.append((None if module is None else id(module), what, edit))

    def _kept_changes(self) -> list[tuple[str, Edit | None]]:
        step = {id(r.module) for r in self.ctx.finder.per_step()}
        return [
            (what, written)
            for mid, what, edit in self._changes
            if mid is None or not step or mid in step
            for written in self._written(mid, edit)
        ]

    def _written(self, module_id: int | None, edit: Edit | None) -> list[Edit | None]:
        """The edits that make one recorded change permanent (a patch may write it in several places)."""
        return [edit]

    @property
    def changes(self) -> list[str]:
        return list(dict.fromkeys(what for what, _ in self._kept_changes()))

    @property
    def edits(self) -> list[Edit]:
        return list(dict.fromkeys(edit for _, edit in self._kept_changes() if edit is not None))

    def first_time_at(self, site: CallSite | None) -> bool:
        """True the first time a call site is seen (a loop calls the same line every step)."""
        key = (site.file, site.line) if site else ("", 0)
        if key in self._sites_seen:
            return False
        self._sites_seen.add(key)
        return True

    def outcome(self) -> PatchOutcome:
        changes = self.changes
        if changes:
            return PatchOutcome(True, None, tuple(changes), tuple(self.edits), self.snippet)
        return PatchOutcome(False, self.not_applicable or "the script never reached what this fix changes")


def site_here() -> CallSite | None:
    """The user's line that called into the function calling this."""
    return call_site(sys._getframe(2))
