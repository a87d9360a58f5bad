"""The engines a directory of rank traces can be analyzed on, and the check of a name given for one:
apart from the pool that runs them (`rank_pool`), so that a command checks its options without
importing the pool."""

from __future__ import annotations

from gpudoctor.util.errors import UsageError

ENGINES = ("auto", "serial", "processes", "ray", "dask")


def check_engine(engine: str) -> str:
    """`engine` if it is one of ENGINES, else a `UsageError` that lists them."""
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r} (one of {', '.join(ENGINES)})")
    return engine
