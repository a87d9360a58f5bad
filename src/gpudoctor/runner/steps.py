"""Where a step of the user's loop ends, found without changing the script: torch's global optimizer
step post-hook; in loops that never step an optimizer, DataLoader iteration (the fetch of each batch after
the first ends the step of the batch before); `gpudoctor.step()`, which overrides both once called.

`StepDetector.install()` / `uninstall()` put in and take out every hook; each boundary calls `on_step()`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class StepDetector:
    def __init__(self, on_step: Callable[[], None]) -> None:
        self.on_step = on_step
        self.explicit = False  # gpudoctor.step() was called: the other sources no longer count
        self._hook: Any = None
        self._optimizer_seen = False
        self._batches = 0
        self._loader_next: Any = None  # DataLoader iterators' own __next__, while ours stands in

    def install(self) -> StepDetector:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.utils.data import dataloader

        self._hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        original = dataloader._BaseDataLoaderIter.__next__
        detector = self

        def __next__(iterator: Any) -> Any:
            batch = original(iterator)
            detector._on_batch()
            return batch

        dataloader._BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign]
        self._loader_next = original
        return self

    def uninstall(self) -> None:
        """Safe to call twice, also after a failure."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._loader_next is not None:
            from torch.utils.data import dataloader

            dataloader._BaseDataLoaderIter.__next__ = self._loader_next  # type: ignore[method-assign]
            self._loader_next = None

    def explicit_step(self) -> None:
        self.explicit = True
        self.on_step()

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._optimizer_seen = True
        if not self.explicit:
            self.on_step()

    def _on_batch(self) -> None:
        """A DataLoader batch: in a loop with no optimizer and no gpudoctor.step(), the fetch of each
        batch after the first ends the step of the batch before."""
        if self.explicit or self._optimizer_seen:
            return
        self._batches += 1
        if self._batches > 1:
            self.on_step()
