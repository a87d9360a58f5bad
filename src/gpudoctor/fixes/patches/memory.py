"""No `torch.cuda.empty_cache()` inside the loop: the caching allocator keeps its blocks, so the next
step does not pay cudaMalloc/cudaFree (and the device synchronization cudaFree implies) again. The
function is replaced by one that does nothing and is put back on undo."""

from __future__ import annotations

from typing import Any

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.base import FixPatch, site_here


class NoEmptyCache(FixPatch):
    fix_id = "no_empty_cache"
    order = 20
    switchable = True
    _on = True
    _original: Any = None

    def _apply(self) -> None:
        import torch.cuda
        import torch.cuda.memory

        skip = self._skip
        for owner in (torch.cuda, torch.cuda.memory):
            if "empty_cache" in vars(owner):
                self._original = self.restorer.replace(owner, "empty_cache", skip)
        self.not_applicable = "torch.cuda.empty_cache() was never called"

    def switch(self, on: bool) -> None:
        self._on = on

    def _skip(self, *args: Any, **kwargs: Any) -> None:
        if not self._on and self._original is not None:
            self._original(*args, **kwargs)
            return
        site = site_here()
        if self.first_time_at(site):
            edit = Edit("delete_statement", site.file, site.line, call="empty_cache") if site else None
            self.snippet = "# delete torch.cuda.empty_cache() from the training loop"
            self.changed("torch.cuda.empty_cache() skipped", edit)
