"""The doctor's verdict in the terminal: what bounds the step, then each finding — severity, what its
fix can save, the evidence and the change to make, with its code. Renders only."""

from __future__ import annotations

from rich.console import Console
from rich.syntax import Syntax
from rich.text import Text

from gpudoctor.report.style import section
from gpudoctor.rules.finding import Diagnosis, Finding, Severity
from gpudoctor.util.text import printable, printable_block
from gpudoctor.util.units import fmt_bytes

SEVERITY_STYLE = {
    Severity.CRITICAL: "bold white on red",
    Severity.MAJOR: "bold black on dark_orange",
    Severity.MINOR: "black on yellow",
    Severity.INFO: "black on grey70",
}
SNIPPETS_SHOWN = 3  # the code of the first few findings; the rest show their one-line fix


def render_diagnosis(diagnosis: Diagnosis, console: Console) -> None:
    section(console, "Diagnosis")
    console.print(Text(f"  {printable(diagnosis.bound)}", style="bold"))
    if not diagnosis.findings:
        if diagnosis.judged:
            console.print(
                Text("  No bottleneck found that a change would shorten by 2% or more.", style="green")
            )
        return
    for i, finding in enumerate(diagnosis.findings):
        _render_finding(finding, console, with_snippet=i < SNIPPETS_SHOWN, of=diagnosis.saving_of)


def render_findings(findings: tuple[Finding, ...], console: Console) -> None:
    """Findings alone, without the bound sentence (the findings about several ranks together)."""
    for i, finding in enumerate(findings):
        _render_finding(finding, console, with_snippet=i < SNIPPETS_SHOWN)


def _render_finding(f: Finding, console: Console, with_snippet: bool, of: str = "step") -> None:
    console.print()
    head = Text("  ")
    head.append(f" {f.severity.value.upper()} ", style=SEVERITY_STYLE[f.severity])
    head.append(f"  {printable(f.title)}", style="bold")
    saving = f"  up to {f.est_saving_pct:g}% of the {of}" if f.est_saving_pct > 0 else ""
    if f.est_memory_bytes:
        saving += f"  frees up to {fmt_bytes(f.est_memory_bytes)}"
    head.append(saving, style="bold green")
    head.append(f"  [{f.id}]", style="dim")
    console.print(head)
    for sentence in f.evidence:
        console.print(Text(f"    • {printable(sentence)}"))
    fix = Text("    fix: ", style="bold cyan")
    fix.append(printable(f.fix.summary))
    console.print(fix)
    if with_snippet:
        # Highlighted only where colours are written: elsewhere the plain lexer lays out the same text
        # without compiling the regular expressions of pygments' Python lexer.
        lexer = "python" if console.color_system is not None else "text"
        console.print(
            Syntax(
                printable_block(f.fix.snippet),
                lexer,
                theme="ansi_dark",
                background_color="default",
                padding=(0, 6),
            )
        )
