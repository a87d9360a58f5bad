"""Gradient accumulation without an all-reduce per micro-batch: a DistributedDataParallel model that runs
k forwards and backwards per optimizer step all-reduces its gradients on the last only, as
`model.no_sync()` on the others does. The first optimizer step runs as the script wrote it and counts
its micro-batches (k); from then on the forwards before the k-th of each step run with
`require_backward_grad_sync` off (what `no_sync()` sets). A step that comes before its k-th micro-batch
(the loop's micro-batches vary) gets its gradients all-reduced by the patch before the update, so no
rank ever updates from its own gradients alone, and the fix reports that it could not take effect.
Switchable at a step boundary: off, every micro-batch all-reduces again."""

from __future__ import annotations

import sys
import weakref
from typing import Any

from gpudoctor.fixes.accumulation import no_sync_edits
from gpudoctor.fixes.patches.base import FixPatch
from gpudoctor.runner.hooks import CallSite, call_site, eager_frame, user_frame


class _Model:
    """One DDP model's micro-batches: counted since the last optimizer step, and per step (k)."""

    def __init__(self, ddp: Any) -> None:
        self.ref = weakref.ref(ddp)
        self.since_step = 0
        self.per_step: int | None = None  # k, from the first optimizer step
        self.last_synced = True
        self.saved: bool | None = None  # the script's require_backward_grad_sync while ours stands in
        self.skipped = 0
        self.name: str | None = None  # the name the script calls it by, where its frame binds one
        self.forward_site: CallSite | None = None


class NoSyncPatch(FixPatch):
    fix_id = "no_sync"
    order = 21
    switchable = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on = True
        self._models: dict[int, _Model] = {}
        self._backward_site: CallSite | None = None
        self._step_site: CallSite | None = None
        self._irregular: str | None = None

    def switch(self, on: bool) -> None:
        self._on = on

    def _apply(self) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        forward, patch = DistributedDataParallel.forward, self

        @eager_frame
        def ddp_forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():
                patch._before_forward(ddp, user_frame(sys._getframe(1)))
            return forward(ddp, *args, **kwargs)

        backward = torch.autograd.backward

        def autograd_backward(*args: Any, **kwargs: Any) -> Any:
            if patch._backward_site is None and any(m.since_step for m in patch._models.values()):
                patch._backward_site = call_site(sys._getframe(1))
            return backward(*args, **kwargs)

        self.restorer.replace(DistributedDataParallel, "forward", ddp_forward)
        self.restorer.replace(torch.autograd, "backward", autograd_backward)
        pre = register_optimizer_step_pre_hook(lambda opt, args, kwargs: self._before_step())
        post = register_optimizer_step_post_hook(lambda opt, args, kwargs: self._after_step())
        self.restorer.on_restore(pre.remove)
        self.restorer.on_restore(post.remove)
        self.not_applicable = "no DistributedDataParallel ran a forward with gradients"

    def _before_forward(self, ddp: Any, frame: Any) -> None:
        model = self._models.get(id(ddp))
        if model is None or model.ref() is not ddp:
            model = self._models[id(ddp)] = _Model(ddp)
        if model.forward_site is None and frame is not None:
            model.forward_site = CallSite(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
            model.name = next((k for k, v in {**frame.f_globals, **frame.f_locals}.items() if v is ddp), None)
        k = model.per_step
        skip = self._on and self._irregular is None and k is not None and model.since_step < k - 1
        if skip:  # off for this micro-batch, as no_sync() sets it; the script's own setting kept to put back
            if model.saved is None:
                model.saved = ddp.require_backward_grad_sync
            ddp.require_backward_grad_sync = False
        elif model.saved is not None:
            ddp.require_backward_grad_sync, model.saved = model.saved, None
        model.last_synced = bool(ddp.require_backward_grad_sync)
        model.since_step += 1
        if skip:
            model.skipped += 1
            if model.skipped == 1:
                self._record(model)

    def _before_step(self) -> None:
        """Gradients a step would read unreduced (its last micro-batch skipped the all-reduce) are
        all-reduced here, and the fix stands down."""
        for model in self._models.values():
            ddp = model.ref()
            if ddp is None or model.last_synced or not model.since_step:
                continue
            self._irregular = (
                f"the micro-batches per optimizer step vary ({model.per_step}, then {model.since_step}): "
                "every micro-batch all-reduces"
            )
            _all_reduce_grads(ddp)
            model.last_synced = True

    def _after_step(self) -> None:
        if self._step_site is None:
            self._step_site = call_site(sys._getframe(1))
        for model in self._models.values():
            if model.per_step is None and model.since_step:
                model.per_step = model.since_step
                if model.since_step == 1:
                    self.not_applicable = "one forward per optimizer step: no micro-batches to accumulate"
            model.since_step = 0

    def _record(self, model: _Model) -> None:
        k = model.per_step
        what = f"all-reduce once per optimizer step, not on each of its {k} micro-batches (no_sync)"
        site, name = model.forward_site, model.name
        if site is None or name is None or self._backward_site is None or self._step_site is None:
            self.snippet = (
                "with contextlib.nullcontext() if <last micro-batch> else model.no_sync():\n"
                "    loss = model(batch)\n    loss.backward()"
            )
            self.changed(what)
            return
        edits = no_sync_edits(site.file, site.line, self._backward_site.line, self._step_site.line, name)
        if isinstance(edits, str):
            self.snippet = (
                f"# {edits}\nwith contextlib.nullcontext() if <last micro-batch> else {name}.no_sync(): ..."
            )
            self.changed(what)
            return
        for edit in edits:
            self.changed(what, edit)

    def outcome(self) -> Any:
        if self._irregular is not None:
            self.not_applicable = self._irregular
            self._changes.clear()
        return super().outcome()


def _all_reduce_grads(ddp: Any) -> None:
    import torch.distributed as dist

    group = getattr(ddp, "process_group", None)
    size = dist.get_world_size(group)
    for p in ddp.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(size)
