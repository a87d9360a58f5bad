"""`gpudoctor fix --aa`'s report as plain lines: the harness's process spread beside plain processes',
the verdicts of the live no-op comparisons, and the false-positive rate of the resampled ones. Renders
only."""

from __future__ import annotations

from gpudoctor.fixes.aa import AAReport, ProcessSpread
from gpudoctor.fixes.result import FixVerdict
from gpudoctor.util.units import fmt_us


def _spread(s: ProcessSpread | None, what: str) -> str:
    if s is None:
        return f"{what}: not measured"
    apart = f"{s.spread_pct:.1f}% apart" if s.spread_pct is not None else "one process"
    cv = f", cv {s.cv_pct:.1f}%" if s.cv_pct is not None else ""
    steps = ", ".join(fmt_us(m) for m in s.means_us)
    return f"{what} ({s.how}): {len(s.means_us)} processes {apart}{cv} — mean steps {steps}"


def _verdict(v: FixVerdict | None, what: str) -> str:
    if v is None:
        return f"{what}: not measured"
    saving = f"{v.measured_saving_pct:+.1f}%" if v.measured_saving_pct is not None else "-"
    if v.stalled is not None:
        saving = "no figure (one stall dominates it)"
    ci = (
        f" (95% CI {v.ci_low_pct:+.1f} to {v.ci_high_pct:+.1f})"
        if v.ci_low_pct is not None and v.ci_high_pct is not None
        else ""
    )
    false = " — a FALSE verdict" if v.verdict in ("faster", "slower") else ""
    return (
        f"{what}: {v.verdict or 'no verdict'}, saving {saving}{ci} over {v.pairs} {v.unit or 'pair'}s{false}"
    )


def aa_lines(report: AAReport) -> list[str]:
    lines = [
        f"A/A on {report.device}: {' '.join(report.argv)}",
        _spread(report.harness, "harness"),
        _spread(report.plain, "plain"),
    ]
    if report.spread_ratio is not None:
        lines.append(f"the harness's spread is {report.spread_ratio:.2f}× the plain processes'")
    lines.append(_verdict(report.processes, "the no-op patch in fresh processes"))
    lines.append(_verdict(report.blocks, "the no-op switched in blocks of one process"))
    for f in report.false_positives:
        lines.append(
            f"false-positive rate over {f.comparisons} A/A comparisons of {f.pairs} {f.unit}s resampled from "
            f"the recorded ones: {100 * f.rate:.1f}%"
        )
    lines += list(report.notes)
    lines.append(f"took {report.elapsed_s:.0f} s")
    return lines
