"""A patch that changes nothing, for A/A comparisons (`gpudoctor fix --aa`): the unchanged script timed
against itself through the same machinery as a fix — switched in blocks of steps, or in fresh processes —
so that every verdict other than "no significant difference" it gets is a false one."""

from __future__ import annotations

from gpudoctor.fixes.patches.base import FixPatch


class NoOp(FixPatch):
    fix_id = "noop"
    order = 90
    switchable = True

    def _apply(self) -> None:
        self.changed("nothing: the unchanged script against itself (A/A)")

    def switch(self, on: bool) -> None:
        return None
