"""`pipeline_bubble`: a pipeline-parallel stage (its collectives are point-to-point sends and
receives of activations and gradients) that idles or waits on its neighbours for part of each step:
the pipeline's bubble, (stages − 1) / (micro-batches + stages − 1) of the step with a plain 1F1B
schedule, plus whatever an uneven split of layers adds."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix

FIX = Fix(
    summary="Shrink the bubble: more micro-batches per step (at least 4× the stages), an interleaved "
    "or zero-bubble schedule (several virtual stages per rank), and stages of equal cost.",
    snippet="""\
from torch.distributed.pipelining import ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble

# two (or more) stages per rank, micro-batches a multiple of the pipeline's ranks
schedule = ScheduleInterleaved1F1B(stages, n_microbatches=4 * pp_size, loss_fn=loss_fn)
# or: schedule = ScheduleInterleavedZeroBubble(stages, n_microbatches=4 * pp_size, loss_fn=loss_fn)
schedule.step(inputs, target=targets, losses=losses)""",
)


def pipeline_bubble(a: Analysis, f: Facts) -> Finding | None:
    c = a.comms
    if c is None or "send_recv" not in c.comm_by_collective_us:
        return None
    p2p = [x for x in c.calls if x.collective == "send_recv" and x.step is not None]
    waiting_us = f.per_step(c.exposed_by_collective_us.get("send_recv", 0.0))
    bubble_us = waiting_us + f.idle_us  # the stage does nothing useful: waits on a neighbour, or idles
    if bubble_us <= 0:
        return None
    evidence = [
        f"Each step this stage waits on its neighbours' sends and receives {us(waiting_us)} with no compute "
        f"beside them, and idles {us(f.idle_us)}: {us(bubble_us)} {step_phrase(f)} "
        f"({pct(f.pct(bubble_us))}).",
    ]
    if p2p:
        steps = len({x.step for x in p2p})
        evidence.append(
            f"{len(p2p) / steps:.0f} point-to-point transfers per step (activations and gradients)."
        )
    return finding(
        "pipeline_bubble",
        "The pipeline stage idles in its bubble",
        f.pct(min(bubble_us, f.step_us)),
        evidence,
        FIX,
        {"p2p_exposed_us": waiting_us, "idle_us": f.idle_us},
    )
