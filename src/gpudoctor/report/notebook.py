"""A `RunReport` as a notebook or a console shows it (`gpudoctor.profile()`'s `.report`,
`gpudoctor.diagnose()`): its text in a console (`print(report)`, or `report.print()` in colour), and in
Jupyter the HTML report inline (`_repr_html_`), in a sandboxed frame so that its styles stay its own.
Renders only."""

from __future__ import annotations

from html import escape

from gpudoctor.doctor.report import RunReport
from gpudoctor.report.run_view import render_report, report_html, report_text
from gpudoctor.rules.finding import Finding

FRAME_HEIGHT_PX = 720


class Shown:
    """What `gpudoctor.profile()` and `gpudoctor.diagnose()` give: the report, shown."""

    def __init__(self, report: RunReport) -> None:
        self.run_report = report

    @property
    def findings(self) -> tuple[Finding, ...]:
        return self.run_report.findings

    def text(self, width: int = 100) -> str:
        return report_text(self.run_report, width)

    def html(self) -> str:
        """The whole HTML report, as `gpudoctor report` writes it."""
        return report_html(self.run_report)

    def print(self) -> None:
        """The terminal report on stdout, in colour where stdout is a terminal."""
        from gpudoctor.report.console import SafeConsole

        render_report(self.run_report, SafeConsole())

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return (
            f'<iframe class="gpudoctor-report" srcdoc="{escape(self.html(), quote=True)}" '
            f'sandbox="allow-scripts" style="width: 100%; height: {FRAME_HEIGHT_PX}px; border: 0; '
            'resize: vertical"></iframe>'
        )
