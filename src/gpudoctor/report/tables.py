"""The detail tables of the terminal summary: top kernels and their roofline, launches, transfers,
synchronizations, top ops. Renders only."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from gpudoctor.analysis.cpu import OpStat
from gpudoctor.analysis.kernels import SHORT_KERNEL_US, KernelReport, KernelStat
from gpudoctor.analysis.roofline import Roofline
from gpudoctor.analysis.syncs import SyncReport
from gpudoctor.analysis.transfers import TransferReport
from gpudoctor.report.style import count, cut, dim_line, dur, line, not_available, section, table
from gpudoctor.util.names import short_kernel_name
from gpudoctor.util.text import printable
from gpudoctor.util.units import fmt_bytes, fmt_flops, fmt_pct, fmt_rate, fmt_us

_CATEGORY = {"convolution": "conv", "communication": "comm"}
_TENSOR_CORES = {True: "yes", False: "no", None: "?"}


NARROW = 110  # below this width kernel names move under the table, numbered


def render_kernels(k: KernelReport, console: Console, top: int) -> None:
    section(console, "Top kernels")
    if k.count == 0:
        not_available(console, "no GPU kernels in the window")
        return
    narrow = console.width < NARROW
    names = [short_kernel_name(s.name) for s in k.top[:top]]
    t = table("#" if narrow else "kernel", "calls", "total", "mean", "median", "share", "occ.", "blk/SM",
              "kind", "TC", flexible=0)  # fmt: skip
    t.columns[-2].justify = "left"
    for i, s in enumerate(k.top[:top]):
        t.add_row(str(i + 1) if narrow else cut(names[i]), *_kernel_cells(s))
    console.print(t)
    if narrow:
        for i, name in enumerate(names):
            console.print(cut(f"  {i + 1:>2} {name}"))
    if top < len(k.top) or len(k.top) < k.distinct:
        dim_line(console, f"showing {min(top, len(k.top))} of {count(k.distinct)} distinct kernels")
    tc = (
        f"tensor cores {fmt_pct(k.tensor_core_share)} of matmul+conv time"
        if k.tensor_core_share is not None
        else None
    )
    line(
        console,
        f"{count(k.count)} kernels, {fmt_us(k.total_us)}",
        f"matmul {dur(k.matmul_us)}",
        f"convolution {dur(k.convolution_us)}",
        *([tc] if tc else []),
    )
    dim_line(
        console,
        "occ.: Kineto's estimated achieved occupancy; TC: tensor cores (? where the name does not say)",
    )


def render_roofline(r: Roofline | None, console: Console, top: int) -> None:
    """The top kernels' achieved FLOP/s and bandwidth against the GPU's measured ceilings."""
    section(console, "Roofline")
    if r is None or not r.points:
        not_available(console, r.note if r is not None else "not in this analysis (saved before it existed)")
        return
    narrow = console.width < NARROW
    names = [short_kernel_name(p.kernel) for p in r.points[:top]]
    t = table("#" if narrow else "kernel", "op", "dtype", "time", "FLOP/s", "bandwidth", "FLOP/B", "bound",
              "of ceiling", first_left=3, flexible=0)  # fmt: skip
    for i, p in enumerate(r.points[:top]):
        t.add_row(
            str(i + 1) if narrow else cut(names[i]),
            _short_op(p.op),
            p.dtype,
            fmt_us(p.time_us),
            fmt_flops(p.flops_per_s),
            fmt_rate(p.bytes_per_s),
            f"{p.intensity:.3g}",
            p.bound or "-",
            _share(p.ceiling_share, p.beyond_ceiling),
        )
    console.print(t)
    if narrow:
        for i, name in enumerate(names):
            console.print(cut(f"  {i + 1:>2} {name}"))
    dim_line(console, f"FLOPs and bytes known for {fmt_pct(r.coverage)} of kernel time · {r.note}")
    for i, p in enumerate(r.points[:top]):
        if p.beyond_ceiling:
            dim_line(console, f"* {names[i]}: {p.beyond_ceiling}")


def _share(share: float | None, beyond: str | None) -> str:
    """A share of the ceiling; over 100% it is starred, the reason printed below the table."""
    if share is None:
        return "-"
    return fmt_pct(share) + ("*" if beyond else "")


def _short_op(name: str, width: int = 24) -> str:
    name = name.removeprefix("aten::").removeprefix("_scaled_dot_product_")
    return name if len(name) <= width else name[: width - 1] + "…"


def _kernel_cells(s: KernelStat) -> tuple[str, ...]:
    bps = s.blocks_per_sm
    return (
        count(s.calls),
        fmt_us(s.total_us),
        fmt_us(s.mean_us),
        fmt_us(s.median_us),
        fmt_pct(s.share),
        f"{s.est_occupancy_pct:.0f}%" if s.est_occupancy_pct is not None else "n/a",
        "n/a" if bps is None else f"{bps:,.0f}" if bps >= 100 else f"{bps:.3g}",
        _CATEGORY.get(s.category, s.category),
        _TENSOR_CORES[s.tensor_cores],
    )


def render_launches(k: KernelReport, console: Console) -> None:
    section(console, "Launches")
    if k.count == 0:
        not_available(console, "no GPU kernels in the window")
        return
    line(
        console,
        f"short kernels (< {SHORT_KERNEL_US:g} µs): {fmt_pct(k.short_count_share)} of kernels",
        f"{fmt_pct(k.short_time_share)} of kernel time",
    )
    d = k.launch_delay_us
    if d is None:
        not_available(console, "launch delay: no kernel is linked to its launching call")
        return
    line(
        console,
        f"launch delay (kernel start - launch call start) p50 {fmt_us(d.p50)}",
        f"p90 {fmt_us(d.p90)}",
        f"max {fmt_us(d.max)}",
        f"{count(d.count)} linked",
    )


def render_transfers(tr: TransferReport, console: Console) -> None:
    section(console, "Transfers")
    if not tr.directions:
        dim_line(console, "no host/device memory copies in the window")
    else:
        t = table(
            "direction", "copies", "bytes", "time", "bandwidth", "pageable", "pageable bytes", "blocking"
        )
        for d in tr.directions:
            t.add_row(
                d.direction,
                count(d.count),
                fmt_bytes(d.bytes),
                fmt_us(d.time_us),
                fmt_rate(d.bandwidth),
                count(d.pageable_count),
                fmt_bytes(d.pageable_bytes),
                count(d.blocking_count),
            )
        console.print(t)
    if tr.memset_count:
        dim_line(console, f"memsets: {count(tr.memset_count)}, {fmt_us(tr.memset_time_us)}")


def render_syncs(s: SyncReport, console: Console) -> None:
    section(console, "Host synchronizations")
    per_step = f"{s.per_step:.3g} per step" if s.per_step is not None else "per step n/a"
    if s.count == 0:
        line(console, "none in the window", f"{count(s.blocking_copies)} blocking copies in the trace")
        return
    line(
        console,
        f"{count(s.count)} syncs",
        f"{fmt_us(s.total_us)} host blocked",
        per_step,
        f"{count(s.blocking_copies)} blocking copies in the trace",
    )
    t = table("call", "op", "source", "count", "blocked", "max", first_left=3, flexible=2)
    for site in s.sites:
        op = site.op if site.op == site.inner_op or site.inner_op is None else f"{site.op} > {site.inner_op}"
        t.add_row(
            Text(printable(site.call)),
            Text(printable(op or "-")),
            cut(site.source.rsplit("/", 1)[-1] if site.source else "-"),
            count(site.count),
            fmt_us(site.total_us),
            fmt_us(site.max_us),
        )
    console.print(t)
    if not any(site.stack for site in s.sites):
        not_available(console, "source lines: no Python stacks (record with with_stack=True)")


def render_ops(ops: tuple[OpStat, ...], console: Console, top: int) -> None:
    # ranked by GPU time, then CPU time (`analysis.cpu`): where no op launched GPU work (a CPU run), by
    # CPU time, and the GPU's columns would be zeros
    gpu = any(o.gpu_total_us or o.kernels for o in ops)
    title = "Top ops (by GPU time)" if gpu else "Top ops (by CPU time: no GPU work)"
    section(console, title if ops else "Top ops")
    if not ops:
        not_available(console, "no PyTorch ops recorded")
        return
    head = ("op", "calls", *(("GPU self", "GPU total") if gpu else ()), "CPU self", "CPU total")
    t = table(*head, *(("kernels",) if gpu else ()), flexible=0)
    for o in ops[:top]:
        gpu_cells = (dur(o.gpu_self_us), dur(o.gpu_total_us)) if gpu else ()
        kernels = (count(o.kernels),) if gpu else ()
        t.add_row(cut(o.name), count(o.calls), *gpu_cells, dur(o.cpu_self_us), dur(o.cpu_total_us), *kernels)
    console.print(t)
    said = "; kernels: GPU activities the op launched" if gpu else ""
    dim_line(console, f"self: the op alone; total: with its child ops{said}")
