"""Interval arithmetic on numpy arrays: unions, complements and how much of a set of disjoint
intervals falls inside given windows. All vectorized; intervals are (start, end) float µs arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Disjoint:
    """Sorted, non-overlapping intervals with their covered length up to each one, for fast
    `covered(a, b)` queries."""

    start: np.ndarray
    end: np.ndarray
    _before: np.ndarray  # covered length of all intervals before i

    @classmethod
    def of(cls, start: np.ndarray, end: np.ndarray) -> Disjoint:
        s, e = union(start, end)
        before = np.concatenate(([0.0], np.cumsum(e - s)[:-1])) if len(s) else np.zeros(0)
        return cls(s, e, before)

    @property
    def total(self) -> float:
        return float((self.end - self.start).sum())

    def upto(self, t: np.ndarray) -> np.ndarray:
        """Covered length in (-inf, t] for each t."""
        t = np.asarray(t, dtype=np.float64)
        if not len(self.start):
            return np.zeros_like(t)
        i = np.searchsorted(self.start, t, side="right") - 1
        ic = np.maximum(i, 0)
        inside = np.clip(t - self.start[ic], 0.0, self.end[ic] - self.start[ic])
        return np.where(i >= 0, self._before[ic] + inside, 0.0)

    def covered(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Covered length inside each window [a, b]."""
        return self.upto(b) - self.upto(a)


def difference(a: Disjoint, b: Disjoint) -> Disjoint:
    """What of `a` no interval of `b` covers: each interval of `a` cut by the gaps between those of
    `b` (before its first, between each two, after its last), the pieces of some length kept."""
    if not len(a.start) or not len(b.start):
        return a
    gap_start = np.concatenate(([-np.inf], b.end))
    gap_end = np.concatenate((b.start, [np.inf]))
    first = np.searchsorted(gap_end, a.start, side="right")  # the first gap that ends after it starts
    count = np.maximum(np.searchsorted(gap_start, a.end, side="left") - first, 0)  # gaps it meets
    which = np.repeat(np.arange(len(a.start)), count)
    gap = np.arange(int(count.sum())) + np.repeat(first - np.cumsum(count) + count, count)
    lo = np.maximum(a.start[which], gap_start[gap])
    hi = np.minimum(a.end[which], gap_end[gap])
    keep = hi > lo
    return Disjoint.of(lo[keep], hi[keep])


def union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge possibly overlapping intervals into sorted disjoint ones (touching ones merge)."""
    if not len(start):
        return np.zeros(0), np.zeros(0)
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    firsts = np.flatnonzero(new)
    lasts = np.concatenate((firsts[1:] - 1, [len(s) - 1]))
    return s[firsts], reach[lasts]


def union_groups(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Like `union`, plus for each merged interval the index (into the inputs) of the interval
    that opens it: the earliest-starting one."""
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    if len(s):
        new[0] = True
        new[1:] = s[1:] > reach[:-1]
    firsts = np.flatnonzero(new)
    lasts = np.concatenate((firsts[1:] - 1, [len(s) - 1])) if len(firsts) else firsts
    return s[firsts], reach[lasts], order[firsts]
