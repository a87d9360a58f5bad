"""`host_sync`: the host waits for the GPU inside the step (`.item()`, `.cpu()`, printing a tensor,
explicit synchronize, synchronous device-to-host copies), which drains the GPU's queue. Nsight
Systems' "synchronization APIs" and "synchronous memcpy" rules, with the PyTorch op and source line."""

from __future__ import annotations

from gpudoctor.analysis.summary import Analysis
from gpudoctor.rules.base import finding, pct, step_phrase, us
from gpudoctor.rules.facts import Facts
from gpudoctor.rules.finding import Finding, Fix
from gpudoctor.rules.loop_advice import HOST_SYNC_INFERENCE_FIX, host_sync_fix, loop_of

FIX = Fix(
    summary="Keep per-step values on the GPU and read them back rarely; find hidden syncs with "
    "torch.cuda.set_sync_debug_mode.",
    snippet="""\
torch.cuda.set_sync_debug_mode("warn")       # warns at every synchronizing call (debug only)
running_loss = torch.zeros((), device="cuda")
for step, (inputs, targets) in enumerate(loader):
    loss = criterion(model(inputs), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    running_loss += loss.detach()            # no .item() / .cpu() / print(tensor) per step
    if step % 100 == 99:                     # one synchronization every 100 steps
        print(f"loss {running_loss.item() / 100:.4f}")
        running_loss.zero_()""",
)


__all__ = ["HOST_SYNC_INFERENCE_FIX", "host_sync"]  # the loop variants of its fix (rules.loop_advice)


def host_sync(a: Analysis, f: Facts) -> Finding | None:
    # Blocking host-to-device copies are the pageable_copy rule's; the rest drain the queue here.
    sites = [s for s in a.syncs.sites if s.kind != "copy_h2d"]
    if not sites:
        return None
    calls = sum(s.count for s in sites)
    per_step = calls / f.steps
    # With a drained queue every host delay in the step shows as GPU idle; without the syncs the host
    # runs ahead and hides them, as long as its own work fits in the step: the step cannot get shorter
    # than the host's work (its time less the time it sat blocked) nor than the GPU's.
    blocked = f.per_step(sum(s.total_us for s in sites))
    # (a traced step of zero length, from overlapping or empty ProfilerStep spans, scales nothing)
    host_work = (f.traced_step_us - blocked) * f.step_us / f.traced_step_us if f.traced_step_us > 0 else 0.0
    serialized = (f.sync_idle_us + f.host_wait_us) * f.host_scale
    drained = max(0.0, min(serialized, f.step_us - max(host_work, f.busy_us)))
    top = sites[:3]
    where = "; ".join(
        f"{s.call} in {s.op or s.inner_op or 'no op'}"
        + (f" from {s.source}" if s.source else "")
        + f" ×{s.count}"
        for s in top
    )
    evidence = [
        f"{per_step:.0f} host synchronizations {f.per}: {where}.",
        f"Each one drains the GPU's queue, so the host cannot run ahead: the GPU waits for the host "
        f"{us(serialized)} {step_phrase(f)}; the host's own work ({us(host_work)}) leaves {us(drained)} of it "
        f"({pct(f.pct(drained))}) to win back.",
    ]
    if not any(s.source for s in sites):
        evidence.append("Record with with_stack=True to see the source line of each synchronization.")
    return finding(
        "host_sync",
        "Host-device synchronizations inside the step",
        f.pct(drained),
        evidence,
        host_sync_fix(loop_of(a, f), FIX),
        {"syncs_per_step": per_step, "drained_idle_us": drained, "step_us": f.step_us},
        sources=tuple(dict.fromkeys(s.source for s in sites if s.source)),
    )
