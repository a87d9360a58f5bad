"""The doctor as a library: load → analyze → diagnose (memory, the profiler's observer effect, ranks on
processes, Ray or Dask), each way in returning a frozen, versioned `RunReport` that saves to and loads
from a run directory. The command line (`cli`), `gpudoctor fix`, notebooks and the benchmarks all call
it; it renders nothing (that is `report`'s).

    diagnose_trace("trace.json.gz")                       # a Kineto trace from any tool
    diagnose_ranks("traces/", engine="processes")         # a directory of rank traces
    run_and_diagnose("train.py", ["--lr", "3e-4"])        # run the script here, then diagnose it
    RunReport.load("gpudoctor-runs/train-…/")             # a saved run directory

The notebook API (`gpudoctor.profile()`, `gpudoctor.diagnose()`, `%%gpudoctor`) is `doctor.notebook`.
The names below are imported on first use, so that reading a trace never loads the runner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpudoctor.util.lazy import lazy_exports

if TYPE_CHECKING:
    from gpudoctor.doctor.diagnose import diagnose_ranks, diagnose_trace
    from gpudoctor.doctor.pipeline import AnalyzeOptions
    from gpudoctor.doctor.report import RunReport
    from gpudoctor.doctor.run import RunOptions, run_and_diagnose

# public name -> the module that defines it
_EXPORTS = {
    "AnalyzeOptions": "gpudoctor.doctor.pipeline",
    "RunOptions": "gpudoctor.doctor.run",
    "RunReport": "gpudoctor.doctor.report",
    "diagnose_ranks": "gpudoctor.doctor.diagnose",
    "diagnose_trace": "gpudoctor.doctor.diagnose",
    "run_and_diagnose": "gpudoctor.doctor.run",
}

__all__ = [
    "AnalyzeOptions",
    "RunOptions",
    "RunReport",
    "diagnose_ranks",
    "diagnose_trace",
    "run_and_diagnose",
]


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())  # each public name imported when first asked for
