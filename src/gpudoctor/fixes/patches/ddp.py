"""DistributedDataParallel's knobs, for a step whose gradient all-reduce is exposed: `static_graph=True`
(the autograd graph is recorded once: no search for unused parameters at every step, the buckets rebuilt
in the order gradients come), `gradient_as_bucket_view=True` (gradients live in the all-reduce buckets:
no copy into them and back) and, where the script asked for it, `find_unused_parameters=False` (static
graph finds them once) — given to every DistributedDataParallel the script builds on a line of its own
files, by wrapping the class's constructor. Not switchable: the reducer is built by the constructor. A
model whose graph changes from step to step fails under `static_graph` in its first steps, so the A/B
reports it and nothing is kept.

A DistributedDataParallel a framework builds gets the knobs its users can set: under 🤗 Accelerate (one
`Accelerator(...)` without `kwargs_handlers` of its own) all three, written as
`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(...)])`; under Hugging Face's `Trainer`
only `find_unused_parameters=False` where it was True (its default for a model without gradient
checkpointing), written as `TrainingArguments(ddp_find_unused_parameters=False)`; under Lightning's
strategy none yet."""

from __future__ import annotations

from typing import Any

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.base import FixPatch, site_here
from gpudoctor.runner.hooks import CallSite

KNOBS = ("static_graph", "gradient_as_bucket_view")
NAMES = ("DistributedDataParallel", "DDP")  # the class, and the alias its users import it as


FRAMEWORKS = ("accelerate", "transformers")  # those whose DDP the fix sets, in their own terms


def knobs_to_set(kwargs: dict[str, Any], framework: str | None = None) -> dict[str, bool]:
    """What the fix changes in a DistributedDataParallel(...) call's keywords (empty: nothing): built on
    the user's line (`framework` None) or by Accelerate, every knob; by the HF Trainer, only what
    `TrainingArguments` can say (find_unused_parameters)."""
    new = {k: True for k in KNOBS if not kwargs.get(k)} if framework != "transformers" else {}
    if kwargs.get("find_unused_parameters"):
        new["find_unused_parameters"] = False
    return new


def builder(site: CallSite | None) -> str | None:
    """The framework of the user's file whose call built a DistributedDataParallel that the user's line
    did not, where the fix can set its knobs in that framework's terms (`FRAMEWORKS`): None otherwise
    (Lightning, an Accelerator given `kwargs_handlers` already, no framework)."""
    from gpudoctor.fixes.frameworks import framework_of

    fw = framework_of(site.file) if site is not None else None
    if fw is None or fw.name not in FRAMEWORKS:
        return None
    if fw.name == "accelerate" and any(k.arg == "kwargs_handlers" for k in fw.call.keywords):
        return None
    return fw.name


def built_at(site: CallSite | None, kwargs: dict[str, Any]) -> tuple[str | None, str | None, dict[str, bool]]:
    """A DistributedDataParallel(...) called from the user's `site` with `kwargs`: the name the user's
    line calls it by (None: a library built it), the framework whose terms the fix writes it in where a
    library did (`builder`), and the knobs the fix changes (empty where neither)."""
    call = own_call(site)
    framework = builder(site) if call is None else None
    return call, framework, knobs_to_set(kwargs, framework) if call is not None or framework else {}


def own_call(site: CallSite | None) -> str | None:
    """The name DistributedDataParallel is called by on the user's line, where the line calls it."""
    from gpudoctor.fixes.diff import call_on_line

    if site is None:
        return None
    return next((n for n in NAMES if call_on_line(site.file, site.line, n) is not None), None)


class DdpKnobs(FixPatch):
    fix_id = "ddp"
    order = 20

    def _apply(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        init, patch = DistributedDataParallel.__init__, self

        def __init__(ddp: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            site = site_here()
            call, framework, new = built_at(site, kwargs)
            init(ddp, module, *args, **{**kwargs, **new})
            if call is None and framework is None:
                patch.not_applicable = (
                    "DistributedDataParallel is built by a library, not on a line of your files"
                )
            elif not new:
                patch.not_applicable = "DistributedDataParallel already has a static graph and bucket views"
            elif site is not None and patch.first_time_at(site):
                shown = {k: str(v) for k, v in new.items()}
                patch.snippet = "model = DistributedDataParallel(model, ..., static_graph=True, gradient_as_bucket_view=True)"
                what = ", ".join(f"{k}={v}" for k, v in shown.items())
                # built by a framework: the edit names the user's line and the knobs; the fix writes them
                # as the framework's option (`kinds.dist.DdpFix.in_framework`)
                patch.changed(f"DistributedDataParallel({what})" + (f", built by {framework}" if framework else ""),
                              Edit("set_kwargs", site.file, site.line, call=call or "DistributedDataParallel",
                                   kwargs=shown))  # fmt: skip

        self.restorer.replace(DistributedDataParallel, "__init__", __init__)
        self.not_applicable = "no DistributedDataParallel was built"
