"""The zoo: planted-bottleneck workloads, each a `ZooCase` (slow variant, expert fix, the finding id the
doctor must rank first), and well-configured `ZooControl`s. Workload names are `<rule>.slow`,
`<rule>.fixed` and the control names; nothing runs or allocates at import."""

from __future__ import annotations

from gpudoctor.util import UsageError
from gpudoctor.workloads.base import Workload
from gpudoctor.workloads.zoo import (
    attention,
    cnn_cases,
    copy_overlap,
    gpt_cases,
    host_sync,
    input_pipeline,
    launch_overhead,
    optimizer,
    pageable_copy,
    tensor_cores,
    unfused_elementwise,
    well_configured,
)
from gpudoctor.workloads.zoo.case import ZooCase, ZooControl

_CASES: dict[str, ZooCase] = {
    c.rule: c
    for c in (
        input_pipeline.CASE,
        host_sync.CASE,
        launch_overhead.CASE,
        pageable_copy.CASE,
        copy_overlap.CASE,
        tensor_cores.CASE,
        tensor_cores.TF32_CASE,
        attention.CASE,
        unfused_elementwise.CASE,
        cnn_cases.CONV_LAYOUT,
        gpt_cases.ALLOCATOR_THRASH,
        optimizer.CASE,
        cnn_cases.SMALL_BATCH_CASE,
        gpt_cases.MEMORY_PRESSURE,
        cnn_cases.PROFILER_DISTORTION,
    )
}
_CONTROLS: dict[str, ZooControl] = {c.name: c for c in well_configured.CONTROLS}


def cases() -> list[ZooCase]:
    """Every case, one per rule id, in the issue's order."""
    return list(_CASES.values())


def case(rule: str) -> ZooCase:
    try:
        return _CASES[rule]
    except KeyError:
        raise UsageError(f"no zoo case {rule!r}; known: {', '.join(_CASES)}") from None


def controls() -> list[ZooControl]:
    return list(_CONTROLS.values())


def control(name: str) -> ZooControl:
    try:
        return _CONTROLS[name]
    except KeyError:
        raise UsageError(f"no zoo control {name!r}; known: {', '.join(_CONTROLS)}") from None


def names() -> list[str]:
    """Case rule ids, then control names."""
    return [*_CASES, *_CONTROLS]


def workloads() -> dict[str, Workload]:
    """Every zoo workload by name: `<rule>.slow`, `<rule>.fixed`, and each control."""
    found = {w.name: w for c in _CASES.values() for w in (c.slow, c.fixed)}
    return found | {c.name: c.workload for c in _CONTROLS.values()}


__all__ = ["ZooCase", "ZooControl", "case", "cases", "control", "controls", "names", "workloads"]
