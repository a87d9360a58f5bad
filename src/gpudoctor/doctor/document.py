"""The JSON document of an analysis (`analysis.json`, `gpudoctor analyze --json`): for one trace the
`Diagnosis` (`gpudoctor.findings/1`) with the whole `Analysis` under `analysis`; for several ranks
`{"schema": "gpudoctor.ranks/1", "ranks": [...]}`, one such document per rank. `reports_from_json` reads
both; `saved_reports` reads a file of either, a damaged one a one-line error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.finding import Diagnosis
from gpudoctor.runner.rundir import read_analysis
from gpudoctor.util.errors import UsageError
from gpudoctor.util.text import printable

RANKS_SCHEMA = "gpudoctor.ranks/1"
Report = tuple[Analysis, Diagnosis]
# what a saved document edited by hand (or from another version) raises when it is read or rendered
DAMAGED = (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError)


def report_json(reports: list[Report]) -> dict[str, Any]:
    if not reports:
        raise ValueError("report_json needs at least one report")
    docs = [{**diagnosis.to_json(), "analysis": analysis.to_json()} for analysis, diagnosis in reports]
    if len(docs) == 1:
        return docs[0]
    return {"schema": RANKS_SCHEMA, "ranks": docs}


def reports_from_json(data: dict[str, Any]) -> list[Report]:
    """The reports of a document written by `report_json` (either shape)."""
    if data.get("schema") == RANKS_SCHEMA:
        ranks = data.get("ranks")
        if not isinstance(ranks, list):
            raise UsageError(f"a {RANKS_SCHEMA} document needs a list of ranks")
        return [_one(r) for r in ranks]
    return [_one(data)]


def saved_reports(saved: Path) -> tuple[list[Report], dict[str, Any]]:
    """The reports of a saved analysis.json (or `analyze --json` output), and the document; one line if
    it is damaged."""
    doc = read_analysis(saved)
    try:
        return reports_from_json(doc), doc
    except UsageError as err:
        raise UsageError(f"{printable(str(saved))}: {err}") from None
    except DAMAGED as err:
        raise UsageError(
            f"{printable(str(saved))} is a damaged gpudoctor analysis (edited or from another version): "
            f"{type(err).__name__}: {err}"
        ) from None


def _one(doc: dict[str, Any]) -> Report:
    if not isinstance(doc.get("analysis"), dict):
        raise UsageError("not a gpudoctor report: it has no 'analysis'")
    rest = {k: v for k, v in doc.items() if k != "analysis"}
    return Analysis.from_json(doc["analysis"]), Diagnosis.from_json(rest)
