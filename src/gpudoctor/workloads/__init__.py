"""Built-in demo workloads, by name. `get(name).build(device, small=...)` returns a ready `Step`; nothing
here runs or allocates at import. Only tools, tests and the CLI import this package."""

from __future__ import annotations

from gpudoctor.util import UsageError
from gpudoctor.workloads import (
    conv_bf16_train,
    dataloader_bound,
    inference,
    sync_every_step,
    transformer_train,
)
from gpudoctor.workloads.base import Builder, Step, Workload

_REGISTRY: dict[str, Workload] = {
    w.name: w
    for w in (
        conv_bf16_train.WORKLOAD,
        transformer_train.WORKLOAD,
        dataloader_bound.WORKLOAD,
        sync_every_step.WORKLOAD,
        inference.WORKLOAD,
    )
}


def names() -> list[str]:
    """Workload names in registry order."""
    return list(_REGISTRY)


def get(name: str) -> Workload:
    """The workload called `name`: a built-in, or a zoo workload (`<rule>.slow`, `<rule>.fixed`, a control);
    a `UsageError` naming the known ones if there is none."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    from gpudoctor.workloads import zoo  # on demand: most callers never need the zoo

    found = zoo.workloads().get(name)
    if found is None:
        raise UsageError(
            f"unknown workload {name!r}; known: {', '.join(_REGISTRY)}, "
            "and the zoo's <rule>.slow / <rule>.fixed and control_* workloads"
        )
    return found


__all__ = ["Builder", "Step", "Workload", "get", "names"]
