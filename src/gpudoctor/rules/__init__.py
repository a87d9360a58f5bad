"""The doctor: rules that turn an `Analysis` into ranked findings — what is slow, what it costs, what to
change. One module per concern; each rule is a function (Analysis, Facts) -> Finding | None."""

from gpudoctor.rules.finding import SCHEMA, Diagnosis, Finding, Fix, Severity
from gpudoctor.rules.registry import RULES, diagnose

__all__ = ["RULES", "SCHEMA", "Diagnosis", "Finding", "Fix", "Severity", "diagnose"]
