"""The explorer's plot: time against size per op, one line per device/scenario, log-log, a dashed line
where the GPU starts to win. Needs matplotlib (optional): `matplotlib_available()` says whether it is there."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

from gpudoctor.timing.explore import SCENARIO_LABELS, ExploreResult
from gpudoctor.util.errors import UsageError
from gpudoctor.util.outfile import write_bytes

STYLES = {"cpu": "o-", "gpu": "s-", "gpu_sync": "^--", "gpu_transfer": "v:"}


def matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def plot_explore(result: ExploreResult, path: str | Path) -> Path:
    """Write the plot; the format follows the file's suffix (.png, .svg, .pdf)."""
    if not matplotlib_available():
        raise UsageError(
            "--plot needs matplotlib (pip install matplotlib, or gpudoctor[plot]); the table and --json work without it"
        )
    from matplotlib.figure import Figure  # not pyplot: no global figure state, no display needed

    path = Path(path)
    ops = list(dict.fromkeys(p.op for p in result.points))
    cols = min(3, len(ops))
    rows = -(-len(ops) // cols)
    fig = Figure(figsize=(5 * cols, 3.8 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, op in zip(axes.flat, ops, strict=False):
        pts = result.op_points(op)
        for scenario in ("cpu", "gpu", "gpu_sync", "gpu_transfer"):
            xy = [(p.size, p.time(scenario)) for p in pts if p.time(scenario)]
            if xy:
                xs, ys = zip(*xy, strict=True)
                ax.plot(xs, ys, STYLES[scenario], label=SCENARIO_LABELS[scenario], markersize=4)
        cross = next((c for c in result.crossovers if c.op == op and c.scenario == "gpu"), None)
        if cross and cross.estimate:
            ax.axvline(cross.estimate, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(op)
        ax.set_xlabel(f"size ({_unit(op)})")
        ax.set_ylabel("time per call (µs)")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(ops) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8)
    title = f"CPU {result.cpu_name}" + (f" vs {result.device_name}" if result.device_name else "")
    fig.suptitle(f"{title}, {result.dtype}", fontsize=10)
    fig.tight_layout()
    image = io.BytesIO()
    try:
        fig.savefig(image, dpi=120, format=path.suffix.lstrip(".").lower() or "png")
    except ValueError as err:  # a suffix matplotlib cannot write
        raise UsageError(f"--plot {path}: {err} (use .png, .svg or .pdf)") from None
    return write_bytes(path, image.getvalue())


def _unit(op: str) -> str:
    from gpudoctor.timing.explore import OPS

    return OPS[op].size_unit if op in OPS else "size"
