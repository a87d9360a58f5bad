"""`fsdp_exposed`: FSDP's all-gathers (parameters before each unit's forward and backward) and
reduce-scatters (gradients after its backward) that run with no compute beside them. FSDP overlaps a
unit's all-gather with the previous unit's compute only when it is issued early enough (prefetch); an
all-gather that waits for the CPU to reach the unit, or one limited by memory (`limit_all_gathers`,
resharding), runs alone."""

from __future__ import annotations

import statistics

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, size, us
from gpudoctor.rules.communication import exposed_in_step, exposed_sentence
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix

SHARDED = ("all_gather", "reduce_scatter")

FIX = Fix(
    summary="Prefetch FSDP's all-gathers so each overlaps the previous unit's compute: FSDP2 "
    "(`fully_shard`) explicit forward/backward prefetch, or FSDP1's forward_prefetch and "
    "BACKWARD_PRE; do not reshard the last units after forward; wrap fewer, larger units; keep the "
    "sharding inside a node (HSDP) when the all-gathers cross nodes.",
    snippet="""\
from torch.distributed.fsdp import fully_shard   # FSDP2

layers = list(model.layers)
for layer in layers:
    fully_shard(layer)
fully_shard(model, reshard_after_forward=False)  # the root's parameters stay gathered for backward
for i, layer in enumerate(layers[:-1]):
    layer.set_modules_to_forward_prefetch([layers[i + 1]])   # all-gather the next unit while this one runs
for i, layer in enumerate(layers[1:], start=1):
    layer.set_modules_to_backward_prefetch([layers[i - 1]])

# FSDP1: FSDP(model, forward_prefetch=True, backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
#             limit_all_gathers=True, auto_wrap_policy=...)""",
)


def fsdp_exposed(a: Analysis, f: Facts) -> Finding | None:
    c = a.comms
    if c is None or not c.steps:
        return None
    exposed = {k: f.per_step(c.exposed_by_collective_us.get(k, 0.0)) for k in SHARDED}
    total = {k: f.per_step(c.comm_by_collective_us.get(k, 0.0)) for k in SHARDED}
    traced_us = sum(exposed.values())
    if traced_us <= 0:
        return None
    saving_us = exposed_in_step(f, traced_us)
    evidence = [
        exposed_sentence(f, saving_us, traced_us, "of all-gather and reduce-scatter has no compute beside it")
        + f": all-gather {us(exposed['all_gather'])} of {us(total['all_gather'])}, reduce-scatter "
        f"{us(exposed['reduce_scatter'])} of {us(total['reduce_scatter'])} per traced step.",
    ]
    gathers = [x for x in c.calls if x.collective == "all_gather" and x.step is not None]
    if gathers:
        steps = len({x.step for x in gathers})
        evidence.append(
            f"{len(gathers) / steps:.0f} all-gathers per step, {size(statistics.median(x.bytes for x in gathers))} "
            "median (one per FSDP unit in forward, again in backward where parameters were resharded)."
        )
    return finding(
        "fsdp_exposed",
        "FSDP's all-gathers and reduce-scatters are exposed",
        f.pct(saving_us),
        evidence,
        FIX,
        {
            "exposed_all_gather_us": exposed["all_gather"],
            "exposed_reduce_scatter_us": exposed["reduce_scatter"],
        },
    )
