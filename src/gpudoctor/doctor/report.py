"""`RunReport`: what the doctor found, as one frozen, versioned value (schema `gpudoctor.report/1`) — the
run's record, the trace's analysis and diagnosis, the memory analysis and findings, the profiler's
observer effect, the ranks side by side, one step's GPU timeline for the HTML report, and notes on what
could not be done. `to_json`/`from_json` round-trip it; `save`/`load` write and read a run directory's
files (`runner.rundir`) in the formats `gpudoctor report` reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.analysis.memory_run import MemoryAnalysis
from gpudoctor.analysis.summary import Analysis
from gpudoctor.analysis.timeline_view import StepTimeline
from gpudoctor.doctor.document import RANKS_SCHEMA, reports_from_json
from gpudoctor.doctor.memory import memory_document, memory_from_document
from gpudoctor.doctor.observer import ObserverEffect
from gpudoctor.doctor.ranks import RanksRun, combined_doc, ranks_from_reports
from gpudoctor.rules.finding import Diagnosis, Finding
from gpudoctor.runner import rundir
from gpudoctor.runner.record import RunRecord
from gpudoctor.util.errors import UsageError
from gpudoctor.util.serial import check_schema, from_jsonable, to_jsonable

if TYPE_CHECKING:
    from gpudoctor.monitor.samples import GpuSample

SCHEMA = "gpudoctor.report/1"


@dataclass(frozen=True)
class RunReport:
    analysis: Analysis | None = None
    diagnosis: Diagnosis | None = None
    record: RunRecord | None = None  # gpudoctor ran the code: its phases, step times, environment
    memory: MemoryAnalysis | None = None
    memory_findings: tuple[Finding, ...] = ()
    observer: ObserverEffect | None = None
    ranks: RanksRun | None = None  # several ranks: every rank's summary, the findings across them
    timeline: StepTimeline | None = None  # the GPU timeline of one representative step
    trace_path: str | None = None
    run_dir: str | None = None
    notes: tuple[str, ...] = ()
    # several ranks of one run: the step each rank entered each phase at, whether they agree, which
    # ranks left a trace (`doctor.combine.alignment`)
    alignment: dict[str, Any] | None = None
    rank: int | None = None  # run as one rank of several: this process's (its report is the combined one)
    schema: str = SCHEMA

    # -- what it says ------------------------------------------------------------------------------------
    @property
    def findings(self) -> tuple[Finding, ...]:
        """Every finding: the trace's (ranked by their saving), then the memory's."""
        return (*(self.diagnosis.findings if self.diagnosis else ()), *self.memory_findings)

    @property
    def traced(self) -> bool:
        return self.analysis is not None

    def nvml_samples(self) -> tuple[GpuSample, ...]:
        """The NVML samples of the most sampled GPU of the run; none without a record or NVML."""
        if self.record is None or not self.record.nvml_samples:
            return ()
        from gpudoctor.monitor.samples import GpuSample  # a run's: reading a trace needs none

        samples = [GpuSample.from_json(s) for s in self.record.nvml_samples]
        indices = [s.index for s in samples]
        main = max(set(indices), key=indices.count)
        return tuple(s for s in samples if s.index == main)

    # -- JSON --------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "record": self.record.to_json() if self.record else None,
            "analysis": self.analysis_document(),
            "detailed": self.analysis.trace.rank if self.analysis else None,
            "memory": memory_document(self.memory, self.memory_findings) if self.memory else None,
            "observer": self.observer.to_json() if self.observer else None,
            "timeline": to_jsonable(self.timeline),
            "trace_path": self.trace_path,
            "run_dir": self.run_dir,
            "notes": list(self.notes),
            "rank": self.rank,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunReport:
        check_schema(data, SCHEMA, "a gpudoctor report")
        try:
            return cls._from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
            raise UsageError(f"a damaged gpudoctor report: {type(err).__name__}: {err}") from None

    @classmethod
    def _from_json(cls, data: dict[str, Any]) -> RunReport:
        analysis, diagnosis, ranks = _analysis_from(data.get("analysis"), data.get("detailed"))
        memory, memory_findings = memory_from_document(data["memory"]) if data.get("memory") else (None, ())
        return cls(
            analysis,
            diagnosis,
            RunRecord.from_json(data["record"]) if data.get("record") else None,
            memory,
            memory_findings,
            ObserverEffect.from_json(data["observer"]) if data.get("observer") else None,
            ranks,
            from_jsonable(StepTimeline, data["timeline"]) if data.get("timeline") else None,
            data.get("trace_path"),
            data.get("run_dir"),
            tuple(data.get("notes") or ()),
            (data.get("analysis") or {}).get("run"),
            data.get("rank"),
        )

    def analysis_document(self) -> dict[str, Any] | None:
        """analysis.json: the findings with the analysis (gpudoctor.findings/1), or every rank's
        (gpudoctor.ranks/1)."""
        if self.ranks is not None:
            doc = combined_doc(self.ranks)
            return {**doc, "run": self.alignment} if self.alignment is not None else doc
        if self.analysis is None or self.diagnosis is None:
            return None
        return {**self.diagnosis.to_json(), "analysis": self.analysis.to_json()}

    # -- a run directory ---------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        """The report's files in `folder` (a run directory): record.json, analysis.json, observer.json,
        memory.json, each where there is something to write."""
        out = Path(folder)
        if self.record is not None:
            rundir.write_record(out, self.record)
        doc = self.analysis_document()
        if doc is not None:
            rundir.write_analysis(out, doc)
        if self.observer is not None:
            rundir.write_observer(out, self.observer.to_json())
        if self.memory is not None:
            rundir.write_memory(out, memory_document(self.memory, self.memory_findings))
        return out

    @classmethod
    def load(cls, folder: str | Path) -> RunReport:
        """The report saved in a run directory (the trace is not read: `timeline` stays empty)."""
        out = Path(folder)
        if not out.is_dir():
            raise UsageError(f"{out} is not a run directory")
        record = rundir.read_record(out)
        saved = rundir.saved_analysis(out)
        doc = rundir.read_analysis(saved) if saved else None
        analysis, diagnosis, ranks = _analysis_from(doc, None)
        memory_doc, observer = rundir.read_memory(out), rundir.read_observer(out)
        if record is None and analysis is None:
            raise UsageError(f"{out} holds no gpudoctor run (no record.json, no analysis.json)")
        memory, memory_findings = memory_from_document(memory_doc) if memory_doc else (None, ())
        trace = out / record.trace_files[0] if record and record.trace_files else None
        return cls(
            analysis,
            diagnosis,
            record,
            memory,
            memory_findings,
            ObserverEffect.from_json(observer) if observer else None,
            ranks,
            trace_path=str(trace) if trace else None,
            run_dir=str(out),
            alignment=doc.get("run") if doc and ranks else None,
        )


def _analysis_from(
    doc: dict[str, Any] | None, detailed: int | None
) -> tuple[Analysis | None, Diagnosis | None, RanksRun | None]:
    if not doc:
        return None, None, None
    reports = reports_from_json(doc)
    ranks = ranks_from_reports(reports, doc) if doc.get("schema") == RANKS_SCHEMA else None
    chosen = next((r for r in reports if r[0].trace.rank == detailed), reports[0])
    return chosen[0], chosen[1], ranks
