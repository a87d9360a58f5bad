"""What wraps the root module's forward — autocast, torch.compile — and how a running process switches
the root between two such forwards. `ForwardWrapper`: a patch whose `wrap(forward)` makes its wrapper of
any forward; alone, it wraps the root's forward when the root is found (the instance's `forward`
replaced, deleted on undo), and `switch` takes its wrapper off and puts it back. `ForwardVariants`: the
forward of each side of an in-process A/B, built from that side's wrappers over the module's own
forward and held at once, the root pointed at one or the other at a block boundary — so that a wrapper
can leave from beneath one that stays (autocast under torch.compile, which compiled what autocast had
wrapped) or take another's place (one compile mode for another)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpudoctor.fixes.patches.base import FixPatch, PatchContext
from gpudoctor.runner.hooks import Restorer, RootFinder

_MISSING = object()


class ForwardSlot:
    """The root module's `forward` (an instance attribute) switched between `on` and `off`; `off` None:
    what the instance held before (nothing: the class's forward)."""

    def __init__(self, module: Any, on: Callable[..., Any], off: Callable[..., Any] | None = None) -> None:
        self.module, self.on, self.off = module, on, off
        self.before = vars(module).get("forward", _MISSING)

    def set(self, on: bool) -> None:
        value = self.on if on else self.off
        if value is not None:
            self.module.forward = value
        elif self.before is _MISSING:
            vars(self.module).pop("forward", None)
        else:
            self.module.forward = self.before


class ForwardWrapper(FixPatch):
    """A patch that wraps the root's forward. Subclasses implement `prepare` (does it apply to this root,
    and what it changes) and `wrap` (its wrapper of a forward, made as often as asked)."""

    # the root's forward is built by `ForwardVariants` from this patch's `wrap`, not installed by it
    held = False

    def __init__(self, ctx: PatchContext) -> None:
        super().__init__(ctx)
        self.ready = False  # it applies to the root found
        self._slot: ForwardSlot | None = None

    def _apply(self) -> None:
        self.ctx.finder.on_root(self._on_root)
        self.not_applicable = "no nn.Module with parameters was called"

    def _on_root(self, module: Any, args: tuple[Any, ...]) -> None:
        self.ready = self.prepare(module)
        if not self.ready or self.held:
            return
        wrapped = self.wrap(module.forward)
        self._slot = ForwardSlot(module, wrapped)
        self.restorer.replace(module, "forward", wrapped)

    def prepare(self, module: Any) -> bool:
        """Whether it applies to the root `module` (else `not_applicable` says why); records its change."""
        raise NotImplementedError

    def wrap(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        raise NotImplementedError

    def switch(self, on: bool) -> None:
        if self._slot is not None:
            self._slot.set(on)


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
        self.restorer = Restorer()
        self._slot: ForwardSlot | None = None

    def apply(self) -> None:
        self.finder.on_root(self._on_root)

    def undo(self) -> None:
        self.restorer.restore()

    def _on_root(self, module: Any, args: tuple[Any, ...]) -> None:
        own = module.forward
        a = [p for p in self.a if p.ready]
        b = [p for p in self.b if p.ready]
        self._slot = ForwardSlot(module, _wrapped(own, b), _wrapped(own, a) if a else None)
        self.restorer.replace(module, "forward", self._slot.on)

    def switch(self, on: bool) -> None:
        """At a step boundary: B's forward (on) or A's. A wrapper that cannot leave the running process
        (float16 autocast's loss scaling is the run's) raises `NotSwitchable` first."""
        for p in self.join:
            p.switch(on)
        for p in self.leave:
            p.switch(not on)
        if self._slot is not None:
            self._slot.set(on)


def _wrapped(forward: Callable[..., Any], wrappers: Sequence[ForwardWrapper]) -> Callable[..., Any]:
    for p in wrappers:
        forward = p.wrap(forward)
    return forward
