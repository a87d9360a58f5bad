"""The JSON document of `gpudoctor analyze --json`.

One trace: the `Analysis` itself (`Analysis.to_json()`, schema `gpudoctor.analysis/1`), so a saved
file loads with `Analysis.from_json`. Several ranks: `{"schema": "gpudoctor.ranks/1", "ranks": [...]}`
with one analysis per rank, in rank order. `schema` is always at the top level; `analyses_from_json`
reads both shapes.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.analysis.summary import Analysis
from gpudoctor.util.errors import UsageError

RANKS_SCHEMA = "gpudoctor.ranks/1"


def analysis_json(analyses: list[Analysis]) -> dict[str, Any]:
    if not analyses:
        raise ValueError("analysis_json needs at least one analysis")
    if len(analyses) == 1:
        return analyses[0].to_json()
    return {"schema": RANKS_SCHEMA, "ranks": [a.to_json() for a in analyses]}


def analyses_from_json(data: dict[str, Any]) -> list[Analysis]:
    """The analyses of a document written by `analysis_json` (either shape)."""
    if data.get("schema") == RANKS_SCHEMA:
        ranks = data.get("ranks")
        if not isinstance(ranks, list):
            raise UsageError(f"a {RANKS_SCHEMA} document needs a list of ranks")
        return [Analysis.from_json(r) for r in ranks]
    return [Analysis.from_json(data)]
