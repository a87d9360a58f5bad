"""`gpudoctor explore`: common ops over a range of sizes on the CPU and the GPU, as a table (and a plot
with --plot, where matplotlib is installed), with the size from which the GPU wins."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from gpudoctor.cli.common import DebugOption, set_debug, stderr_console, stdout_console
from gpudoctor.util.errors import UsageError
from gpudoctor.util.outfile import check_target, write_json

# The ops of timing.explore.OPS, named here so that the CLI starts without importing the timing core.
OP_NAMES = ("matmul", "add", "sum", "conv2d", "softmax", "sort")


def explore_command(
    ctx: typer.Context,
    ops: Annotated[
        str, typer.Option("--ops", metavar="A,B", help=f"Comma-separated ops: {', '.join(OP_NAMES)}.")
    ] = ",".join(OP_NAMES),
    quick: Annotated[bool, typer.Option("--quick", help="Fewer sizes (about a third of the time).")] = False,
    sizes: Annotated[
        str | None, typer.Option("--sizes", metavar="N,M", help="Sizes to use for every op chosen.")
    ] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="float32, bfloat16 or float16.")] = "float32",
    transfers: Annotated[
        bool, typer.Option("--transfers/--no-transfers", help="Also time copies in and out of the GPU.")
    ] = True,
    cpu_only: Annotated[bool, typer.Option("--cpu-only", help="Do not use the GPU.")] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", metavar="FILE", help="Write the results.")
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", metavar="FILE", help="Write a plot (.png/.svg/.pdf; needs matplotlib)."),
    ] = None,
    debug: DebugOption = False,
) -> None:
    """Where does the GPU start to beat the CPU?

    Times matmul, elementwise add, sum, conv2d, softmax and sort at growing sizes on the CPU and on the
    GPU: device time with the data already there, one synchronized call, and with the copies in and out.
    """
    set_debug(ctx, debug)
    request = ExploreRequest(
        ops=tuple(n.strip() for n in ops.split(",") if n.strip()),
        sizes=tuple(_parse_sizes(sizes)) if sizes else None,
        quick=quick,
        dtype=dtype,
        transfers=transfers,
        gpu=not cpu_only,
        json_path=json_path,
        plot=plot,
    )
    run_explore(request)


@dataclass(frozen=True)
class ExploreRequest:
    """What `gpudoctor explore` was asked: the ops and their sizes (None: each op's own range, fewer
    with `quick`), the dtype, whether copies in and out are timed, whether the GPU is used, and the
    files to write (results JSON, plot)."""

    ops: tuple[str, ...] = OP_NAMES
    sizes: tuple[int, ...] | None = None
    quick: bool = False
    dtype: str = "float32"
    transfers: bool = True
    gpu: bool = True
    json_path: Path | None = None
    plot: Path | None = None


def run_explore(request: ExploreRequest) -> None:
    """Check the outputs, time the ops (a spinner on a terminal), print the table, write the files."""
    from gpudoctor.report.bench_plot import matplotlib_available, plot_explore
    from gpudoctor.report.bench_table import render_explore
    from gpudoctor.timing.explore import explore

    r = request
    if r.plot and not matplotlib_available():  # say so before minutes of measuring, not after
        raise UsageError(
            "--plot needs matplotlib (pip install matplotlib, or gpudoctor[plot]); the table and --json work without it"
        )
    for target in (r.json_path, r.plot):
        if target is not None:  # before minutes of measuring, not after
            check_target(target)
    err = stderr_console()
    sizes = list(r.sizes) if r.sizes is not None else None
    with err.status("measuring", spinner="dots") if err.is_terminal else nullcontext() as status:
        result = explore(list(r.ops), quick=r.quick, sizes=sizes, dtype=r.dtype, transfers=r.transfers, gpu=r.gpu,
                         progress=(lambda s: status.update(f"measuring {s}")) if status else None)  # fmt: skip
    render_explore(result, stdout_console())
    if r.json_path:
        write_json(r.json_path, result.to_json())
    if r.plot:
        plot_explore(result, r.plot)


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(float(s)) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--sizes must be comma-separated numbers, not {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise UsageError("--sizes must be positive")
    return sizes


def register(app: typer.Typer) -> None:
    app.command("explore")(explore_command)
