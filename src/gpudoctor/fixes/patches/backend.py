"""Global backend settings: TF32 for float32 matmuls and convolutions, and cuDNN's autotuner. Both are
flags read at every op, set before the script runs and put back after it."""

from __future__ import annotations

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.base import FixPatch, PatchContext

TF32_LINE = 'torch.set_float32_matmul_precision("high")  # TF32 tensor cores for float32 matmuls'
CUDNN_LINE = "torch.backends.cudnn.benchmark = True  # pick the fastest convolution algorithms per shape"


class TF32(FixPatch):
    fix_id = "tf32"
    order = 10
    switchable = True

    def __init__(self, ctx: PatchContext) -> None:
        super().__init__(ctx)
        self._before: tuple[str, bool] | None = None  # the precision and cuDNN's TF32 flag it found

    def _apply(self) -> None:
        import torch

        before = torch.get_float32_matmul_precision()
        if before != "highest":
            self.not_applicable = f"float32 matmul precision is already {before!r}"
            return
        self.restorer.on_restore(lambda: torch.set_float32_matmul_precision(before))
        torch.set_float32_matmul_precision("high")
        self._before = (before, self.restorer.set_flag(torch.backends.cudnn, "allow_tf32", True))
        self._record(TF32_LINE, 'torch.set_float32_matmul_precision("high")')

    def switch(self, on: bool) -> None:
        import torch

        if self._before is None:
            return
        precision, cudnn = self._before
        torch.set_float32_matmul_precision("high" if on else precision)
        torch.backends.cudnn.allow_tf32 = True if on else cudnn

    def _record(self, line: str, what: str) -> None:
        edit = Edit("insert_after_imports", self.ctx.script, code=(line,)) if self.ctx.script else None
        self.snippet = line
        self.changed(what, edit)


class CudnnBenchmark(TF32):
    fix_id = "cudnn_benchmark"

    def _apply(self) -> None:
        import torch

        if torch.backends.cudnn.benchmark:
            self.not_applicable = "torch.backends.cudnn.benchmark is already on"
            return
        self.restorer.set_flag(torch.backends.cudnn, "benchmark", True)
        self._before = ("", False)
        self._record(CUDNN_LINE, "torch.backends.cudnn.benchmark = True")

    def switch(self, on: bool) -> None:
        import torch

        if self._before is not None:
            torch.backends.cudnn.benchmark = on
