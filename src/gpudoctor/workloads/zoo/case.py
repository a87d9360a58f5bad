"""What a zoo entry is. A `ZooCase` pairs a workload with one planted bottleneck (`slow`) and the same
workload with only the expert fix applied (`fixed`); `rule` is the finding id the doctor must rank first
on the slow trace. A `ZooControl` is a well-configured workload that must get no critical or major finding."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpudoctor.workloads.base import Workload


@dataclass(frozen=True)
class ZooCase:
    """A planted bottleneck and its fix. `samples_per_step_*` let throughput be compared per sample (they
    differ only where the batch size is the cause); `profile_*` are `runner.profile.StepTraceOptions`
    overrides (with_stack, record_shapes, profile_memory) that the recorder applies to that variant's
    trace."""

    rule: str
    title: str
    slow: Workload
    fixed: Workload
    samples_per_step_slow: int
    samples_per_step_fixed: int
    note: str
    profile_slow: Mapping[str, bool] = field(default_factory=dict)
    profile_fixed: Mapping[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class ZooControl:
    """A workload with nothing planted; `note` says what should bound it."""

    name: str
    title: str
    workload: Workload
    samples_per_step: int
    note: str
    profile: Mapping[str, bool] = field(default_factory=dict)
