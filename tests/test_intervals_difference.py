"""`intervals.difference(a, b)` is what of `a` no interval of `b` covers: checked against its
definition — the pieces between consecutive endpoints of both that `a` covers and `b` does not,
joined — on random sets of intervals, touching, nested, empty and zero-length ones included."""

from __future__ import annotations

import numpy as np

from gpudoctor.analysis.intervals import Disjoint, difference


def by_definition(a: Disjoint, b: Disjoint) -> Disjoint:
    if not len(a.start) or not len(b.start):
        return a
    points = np.unique(np.concatenate((a.start, a.end, b.start, b.end)))
    lo, hi = points[:-1], points[1:]
    keep = (a.covered(lo, hi) > 0) & (b.covered(lo, hi) <= 0)  # a piece between two points is all in or out
    return Disjoint.of(lo[keep], hi[keep])


def random_intervals(rng: np.random.Generator, fractional: bool) -> Disjoint:
    n = int(rng.integers(0, 12))
    start = rng.integers(0, 30, n).astype(float) + (rng.random(n) if fractional else 0.0)
    return Disjoint.of(start, start + rng.integers(0, 8, n))


def test_difference_is_its_definition_on_random_intervals() -> None:
    rng = np.random.default_rng(46)
    for trial in range(3000):
        a, b = random_intervals(rng, trial % 2 == 1), random_intervals(rng, trial % 2 == 1)
        got, want = difference(a, b), by_definition(a, b)
        assert np.array_equal(got.start, want.start) and np.array_equal(got.end, want.end)
        assert np.array_equal(got._before, want._before)
