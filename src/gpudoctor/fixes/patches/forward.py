"""What wraps the forward of the modules the step calls — autocast, torch.compile — and how a running
process switches them between two such forwards. `ForwardWrapper`: a patch whose `wrap(forward)` makes its
wrapper of any forward; alone, it wraps the forward of every top-level module it applies to when that
module is first called (the instance's `forward` replaced, deleted on undo), and `switch` takes its
wrappers off and puts them back. `ForwardVariants`: the forward of each side of an in-process A/B, built
per module from that side's wrappers over the module's own forward and held at once, each module pointed
at one or the other at a block boundary — so that a wrapper can leave from beneath one that stays
(autocast under torch.compile, which compiled what autocast had wrapped) or take another's place (one
compile mode for another)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from gpudoctor.fixes.patches.base import FixPatch, PatchContext
from gpudoctor.runner.hooks import Restorer, RootFinder

_MISSING = object()


def data_parallel_inner(module: Any) -> Any:
    """The module a DistributedDataParallel wraps (None for any other module): the wrappers act on its
    forward, DDP's own forward (the reducer's bookkeeping, which Dynamo leaves eager) staying as it is, as
    torch.compile(ddp_model) does — Dynamo's DDPOptimizer then splits the graph at the gradient buckets."""
    if type(module).__name__ != "DistributedDataParallel":
        return None
    return getattr(module, "module", None)


def forward_owner(module: Any) -> Any:
    """The module whose forward the wrappers replace: the one a DDP wraps, else the module itself."""
    inner = data_parallel_inner(module)
    return module if inner is None else inner


class ForwardSlot:
    """A module's `forward` (an instance attribute) switched between `on` and `off`; either None: what
    the instance held before (nothing: the class's forward)."""

    def __init__(
        self, module: Any, on: Callable[..., Any] | None, off: Callable[..., Any] | None = None
    ) -> None:
        self.module, self.on, self.off = module, on, off
        self.before = vars(module).get("forward", _MISSING)

    def set(self, on: bool) -> None:
        value = self.on if on else self.off
        if value is not None:
            self.module.forward = value
        else:
            self.restore()

    def restore(self) -> None:
        if self.before is _MISSING:
            vars(self.module).pop("forward", None)
        else:
            self.module.forward = self.before


class ForwardWrapper(FixPatch):
    """A patch that wraps the forward of each top-level module it applies to. Subclasses implement
    `prepare` (does it apply to this module, and what it changes) and `wrap` (its wrapper of a forward,
    made as often as asked); `first_call` may give a context for a module's first call, which runs
    before any wrapper can (autocast: so that the first step computes as the others do)."""

    # the forwards are built by `ForwardVariants` from this patch's `wrap`, not installed by it
    held = False

    def __init__(self, ctx: PatchContext) -> None:
        super().__init__(ctx)
        self.modules: dict[int, Any] = {}  # the top-level modules it applies to, by id
        self.on = True  # switched on (every fix of a round is on from its start)
        self._slots: list[ForwardSlot] = []

    @property
    def ready(self) -> bool:
        """It applies to at least one of the modules found."""
        return bool(self.modules)

    def applies_to(self, module: Any) -> bool:
        return id(module) in self.modules

    def _apply(self) -> None:
        self.ctx.finder.on_root(self._on_root)
        self.ctx.finder.around_first_call(self._first_call)
        self.ctx.finder.after_first_call(self._first_output)
        self.not_applicable = "no nn.Module with parameters was called"

    def _on_root(self, module: Any, args: tuple[Any, ...]) -> None:
        if not self.prepare(module):
            return
        self.modules[id(module)] = module
        if self.held:
            return
        owner = forward_owner(module)
        slot = ForwardSlot(owner, self.wrap(owner.forward))
        slot.set(self.on)
        self._slots.append(slot)
        self.restorer.on_restore(lambda: slot.set(False))

    def _first_call(self, module: Any) -> contextlib.AbstractContextManager[Any] | None:
        if not self.on or id(module) not in self.modules:
            return None
        return self.first_call(module)

    def first_call(self, module: Any) -> contextlib.AbstractContextManager[Any] | None:
        """A context for the module's first call (its forward was fetched before it was wrapped)."""
        return None

    def _first_output(self, module: Any, output: Any) -> Any:
        if not self.on or id(module) not in self.modules:
            return output
        return self.first_output(module, output)

    def first_output(self, module: Any, output: Any) -> Any:
        """What the module's first call returns, as its wrapper would have returned it."""
        return output

    def prepare(self, module: Any) -> bool:
        """Whether it applies to `module` (else `not_applicable` says why); records its change."""
        raise NotImplementedError

    def wrap(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        raise NotImplementedError

    def switch(self, on: bool) -> None:
        self.on = on
        for slot in self._slots:
            slot.set(on)


class ForwardVariants:
    """The root's forward for each side of an in-process A/B, each built once when the root is found
    from its side's wrappers, in their order, over the module's own forward: B's (the wrappers that stay
    and those that join) installed, as every fix of the round is on from its start, and A's (those that
    stay and those B's replace) beside it; `switch(False)` points the root at A's, `switch(True)` back at
    B's. Each compiles at its first call — B's in the warm-up, A's in the blocks' untimed prewarm — and
    stays compiled: Dynamo keeps the two apart (other code, or the same code guarded on the autocast
    state and the backend), each with CUDA graphs of its own under reduce-overhead. Applied after the
    wrappers (its root callback runs after theirs); undo puts back what the root held."""

    name = "forward_variants"

    def __init__(
        self,
        finder: RootFinder,
        stay: Sequence[ForwardWrapper],
        join: Sequence[ForwardWrapper],
        leave: Sequence[ForwardWrapper] = (),
    ) -> None:
        if not join and not leave:
            raise ValueError("forward variants that do not differ")
        self.finder = finder
        self.join, self.leave = tuple(join), tuple(leave)
        self.a = sorted([*stay, *leave], key=lambda p: p.order)
        self.b = sorted([*stay, *join], key=lambda p: p.order)
        self.order = max(p.order for p in (*stay, *join, *leave))
        for p in (*stay, *join, *leave):
            p.held = True
        for p in leave:
            p.on = False  # the B side is on from the start: what it replaces is off
        self.restorer = Restorer()
        self._slots: list[ForwardSlot] = []
        self._on = True

    def apply(self) -> None:
        self.finder.on_root(self._on_root)

    def undo(self) -> None:
        self.restorer.restore()

    def _on_root(self, module: Any, args: tuple[Any, ...]) -> None:
        a = [p for p in self.a if p.applies_to(module)]
        b = [p for p in self.b if p.applies_to(module)]
        if not a and not b:
            return
        owner = forward_owner(module)
        own = owner.forward
        slot = ForwardSlot(owner, _wrapped(own, b) if b else None, _wrapped(own, a) if a else None)
        slot.set(self._on)
        self._slots.append(slot)
        self.restorer.on_restore(lambda: slot.restore())

    def switch(self, on: bool) -> None:
        """At a step boundary: B's forwards (on) or A's. A wrapper that cannot leave the running process
        (float16 autocast's loss scaling is the run's) raises `NotSwitchable` first."""
        for p in self.join:
            p.switch(on)
        for p in self.leave:
            p.switch(not on)
        self._on = on
        for slot in self._slots:
            slot.set(on)


def _wrapped(forward: Callable[..., Any], wrappers: Sequence[ForwardWrapper]) -> Callable[..., Any]:
    for p in wrappers:
        forward = p.wrap(forward)
    return forward
