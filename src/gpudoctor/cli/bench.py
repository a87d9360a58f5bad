"""`gpudoctor bench "STMT" [STMT ...] --setup "..."`: timeit for GPU code. Times each statement with the
timing core, prints device time, host latency and how it was measured; compares several statements
with the first; `--compare baseline.json` checks against saved results and exits 1 on a regression."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpudoctor.cli.common import DebugOption, set_debug, stdout_console
from gpudoctor.util.errors import UsageError
from gpudoctor.util.outfile import check_target

if TYPE_CHECKING:
    from gpudoctor.timing.measurement import Measurement

STMT_FILE = "<gpudoctor-stmt>"
SETUP_FILE = "<gpudoctor-setup>"
REGRESSION_EXIT = 1  # a check that failed, not an error: CI can tell the two apart


def bench_command(
    ctx: typer.Context,
    stmts: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="STMT...",
            help="Python statements to time; the first is the baseline of the others.",
            show_default=False,
        ),
    ] = None,
    setup: Annotated[
        list[str] | None,
        typer.Option(
            "--setup", "-s", metavar="CODE", help="Run once before timing (repeatable); torch is imported."
        ),
    ] = None,
    device: Annotated[str, typer.Option("--device", "-d", help="auto, cpu, cuda or cuda:N.")] = "auto",
    cold: Annotated[bool, typer.Option("--cold", help="Flush the L2 cache before every sample.")] = False,
    method: Annotated[str, typer.Option("--method", help="auto, graph, events or host.")] = "auto",
    min_time: Annotated[float, typer.Option("--min-time", metavar="S", help="Minimum sampling time.")] = 0.25,
    timeout: Annotated[
        float, typer.Option("--timeout", metavar="S", help="Longest time per statement.")
    ] = 10.0,
    noise: Annotated[
        float, typer.Option("--noise", metavar="FRACTION", help="Stop once the median is known to ±this.")
    ] = 0.005,
    min_samples: Annotated[int, typer.Option("--min-samples", metavar="N")] = 10,
    nbytes: Annotated[
        int | None,
        typer.Option("--bytes", metavar="N", help="Bytes one call moves: gives achieved bandwidth."),
    ] = None,
    flops: Annotated[float | None, typer.Option("--flops", metavar="N", help="FLOPs of one call.")] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help="FLOP/s ceiling to compare with.")] = None,
    labels: Annotated[
        list[str] | None, typer.Option("--label", help="Name of each statement (repeatable).")
    ] = None,
    kernels: Annotated[
        bool, typer.Option("--kernels", help="Also record single calls' kernel time with CUPTI (GPU).")
    ] = False,
    cooldown: Annotated[
        float | None,
        typer.Option(
            "--cooldown",
            metavar="X",
            help="GPU idle after each sample, × its length (default 1; 0: "
            "back to back, the sustained figure).",
            show_default=False,
        ),
    ] = None,
    discard_throttled: Annotated[
        bool,
        typer.Option(
            "--discard-throttled", help="Leave samples taken while throttled out of the statistics."
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the measurements as JSON on stdout.")
    ] = False,
    save: Annotated[
        Path | None, typer.Option("--save", metavar="FILE", help="Save the measurements.")
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option("--compare", metavar="FILE", help="Compare with saved measurements (same labels)."),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold",
            metavar="FRACTION",
            help="Slowdown that counts as a regression (default 0.05: timing.compare.REGRESSION_THRESHOLD).",
            show_default=False,
        ),
    ] = None,
    ceilings: Annotated[
        bool,
        typer.Option("--ceilings", help="Show the device's measured ceilings (measured once, then cached)."),
    ] = False,
    remeasure: Annotated[
        bool, typer.Option("--remeasure", help="With --ceilings: measure them again.")
    ] = False,
    debug: DebugOption = False,
) -> None:
    """Time Python statements on the GPU or the CPU, correctly.

    Device time comes from CUDA events around CUDA-graph replays (launch overhead excluded), after a
    warm-up that lasts until the timings are steady; host latency (one call plus a synchronize) is
    shown apart. Sampling stops once the median is known to ±--noise.
    """
    set_debug(ctx, debug)
    request = BenchRequest(
        stmts=tuple(stmts or ()),
        setup=tuple(setup or ()),
        labels=tuple(labels or ()),
        device=device,
        sampling=Sampling(
            cold=cold,
            method=method,
            min_time_s=min_time,
            timeout_s=timeout,
            max_noise=noise,
            min_samples=min_samples,
            discard_throttled=discard_throttled,
            cooldown=cooldown,
            kernel_time=kernels,
        ),
        nbytes=nbytes,
        flops=flops,
        dtype=dtype,
        as_json=as_json,
        save=save,
        baseline=baseline,
        threshold=threshold,
        ceilings=ceilings,
        remeasure=remeasure,
    )
    code = run_bench(request)
    if code:
        raise typer.Exit(code)


@dataclass(frozen=True)
class Sampling:
    """How each statement is sampled: the timing core's `BenchOptions` as the command line sets them."""

    cold: bool = False  # the L2 cache flushed before every sample
    method: str = "auto"
    min_time_s: float = 0.25
    timeout_s: float = 10.0
    max_noise: float = 0.005
    min_samples: int = 10
    discard_throttled: bool = False
    cooldown: float | None = None
    kernel_time: bool = False

    def bench_options(self) -> dict[str, Any]:
        """The keyword options of `timing.bench` (checked there, as each statement is timed)."""
        return {
            "mode": "cold" if self.cold else "hot",
            "method": self.method,
            "min_time_s": self.min_time_s,
            "timeout_s": self.timeout_s,
            "max_noise": self.max_noise,
            "min_samples": self.min_samples,
            "throttled": "discard" if self.discard_throttled else "flag",
            "cooldown": self.cooldown,
            "kernel_time": self.kernel_time,
        }


@dataclass(frozen=True)
class BenchRequest:
    """What `gpudoctor bench` was asked: the statements (the first the baseline of the others) and their
    setup, where and how to time them, what one call moves and computes, and what to do with the
    measurements — print them or their JSON, save them, check them against a saved baseline — and
    whether to show the device's measured ceilings."""

    stmts: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()  # one per statement, or none
    device: str = "auto"
    sampling: Sampling = Sampling()
    nbytes: int | None = None
    flops: float | None = None
    dtype: str | None = None
    as_json: bool = False
    save: Path | None = None
    baseline: Path | None = None
    threshold: float | None = None  # None: timing.compare.REGRESSION_THRESHOLD
    ceilings: bool = False
    remeasure: bool = False


def run_bench(request: BenchRequest) -> int:
    """Time the statements as asked, print the results; the exit status (REGRESSION_EXIT when a check
    against the baseline failed)."""
    # the timing core and its renderers: imported when a benchmark runs, not when the CLI starts
    from gpudoctor.report.bench_table import (
        render_ceilings,
        render_comparisons,
        render_measurements,
        render_regressions,
    )
    from gpudoctor.timing import (
        compare,
        load_measurements,
        measured_ceilings,
        resolve_device,
        save_measurements,
    )
    from gpudoctor.timing.api import infer_dtype
    from gpudoctor.timing.compare import REGRESSION_THRESHOLD

    r = request
    threshold = REGRESSION_THRESHOLD if r.threshold is None else r.threshold
    console = stdout_console()
    stmts, labels, device, baseline, save = list(r.stmts), list(r.labels), r.device, r.baseline, r.save
    if not stmts and not r.ceilings:
        raise UsageError(
            "give a statement to time, e.g.: gpudoctor bench 'a @ a' -s 'a = torch.randn(4096, 4096, device=\"cuda\")'"
        )
    if labels and len(labels) != len(stmts):
        raise UsageError(f"{len(labels)} --label for {len(stmts)} statements")
    if r.ceilings:
        render_ceilings(measured_ceilings(device if device != "auto" else "cuda" if _has_cuda() else "cpu",
                                          remeasure=r.remeasure), console)  # fmt: skip
        if not stmts:
            return 0
    baselines = load_measurements(baseline) if baseline else None
    if save:
        check_target(save, inputs=[baseline] if baseline else [])
    namespace = run_setup("\n".join(r.setup))
    chosen = resolve_device(device if device != "auto" else guess_device(namespace, [*r.setup, *stmts]))
    options = r.sampling.bench_options()
    dtype = r.dtype
    if r.flops and dtype is None:  # the FLOP/s ceiling to compare with: the setup's first float tensor
        dtype = infer_dtype(namespace.values(), chosen)
    results = []
    for i, stmt in enumerate(stmts):
        label = labels[i] if labels else " ".join(stmt.split())
        fn = compile_stmt(stmt, namespace)
        results.append(
            _run(fn, stmt, device=chosen, label=label, nbytes=r.nbytes, flops=r.flops, dtype=dtype, **options)
        )
    comparisons = [compare(results[0], m) for m in results[1:]]
    checks = [] if baselines is None else _checks(results, baselines, baseline, threshold)
    if save:
        save_measurements(save, results, inputs=(baseline,) if baseline else ())
    if r.as_json:
        _print_json(results, comparisons, checks)
    else:
        render_measurements(results, console)
        render_comparisons(comparisons, console)
        if checks:
            render_regressions(checks, console)
    return REGRESSION_EXIT if any(c.regressed for c in checks) else 0


def _checks(results: list[Any], baselines: Any, baseline: Path | None, threshold: float) -> list[Any]:
    """Each measurement checked against the baseline's of the same label."""
    from gpudoctor.timing import check_regression
    from gpudoctor.timing.compare import match_baseline

    checks = []
    for m in results:
        base = match_baseline(baselines, m.label)
        if base is None:
            raise UsageError(f"{baseline} has no measurement labelled {m.label!r}")
        checks.append(check_regression(base, m, threshold))
    return checks


def _print_json(results: list[Any], comparisons: list[Any], checks: list[Any]) -> None:
    from gpudoctor.timing.measurement import FILE_SCHEMA, SCHEMA_VERSION

    doc = {"schema": FILE_SCHEMA, "schema_version": SCHEMA_VERSION, "measurements": [m.to_json() for m in results],
           "comparisons": [_comparison_json(c) for c in comparisons],
           "regressions": [{**_comparison_json(c.comparison), "regressed": c.regressed} for c in checks]}  # fmt: skip
    typer.echo(json.dumps(doc, indent=1, allow_nan=False))


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _comparison_json(c: Any) -> dict[str, Any]:
    from gpudoctor.util.serial import to_jsonable

    return to_jsonable(c)


def run_setup(code: str) -> dict[str, Any]:
    """The namespace the statements run in: torch (and numpy) imported, then the setup code run."""
    import numpy
    import torch

    namespace: dict[str, Any] = {"torch": torch, "np": numpy, "__name__": "__gpudoctor_bench__"}
    try:
        exec(compile(code or "pass", SETUP_FILE, "exec"), namespace)
    except Exception as err:
        raise UsageError(f"--setup failed: {type(err).__name__}: {err}") from err
    return namespace


def compile_stmt(stmt: str, namespace: dict[str, Any]) -> Any:
    """A function whose body is the statement (as timeit does), its globals the setup's namespace."""
    source = "def __gpudoctor_stmt__():\n" + textwrap.indent(textwrap.dedent(stmt).strip() or "pass", "    ")
    try:
        exec(compile(source, STMT_FILE, "exec"), namespace)
    except SyntaxError as err:
        raise UsageError(f"statement {stmt!r} is not valid Python: {err.msg}") from None
    return namespace.pop("__gpudoctor_stmt__")


def guess_device(namespace: dict[str, Any], sources: list[str]) -> str:
    """CUDA when the setup left CUDA tensors or modules behind or the code names cuda; else the CPU."""
    import torch

    for value in namespace.values():
        tensors = list(value.parameters()) if isinstance(value, torch.nn.Module) else [value]
        if any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
            return "cuda"
    return "cuda" if any("cuda" in s for s in sources) else "cpu"


def _run(fn: Any, stmt: str, **kwargs: Any) -> Measurement:
    from gpudoctor.timing import bench

    try:
        return bench(fn, **kwargs)
    except Exception as err:
        if _raised_in(err.__traceback__, STMT_FILE):
            raise UsageError(f"statement {stmt!r} raised {type(err).__name__}: {err}") from err
        raise


def _raised_in(tb: TracebackType | None, filename: str) -> bool:
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            return True
        tb = tb.tb_next
    return False


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_command)
