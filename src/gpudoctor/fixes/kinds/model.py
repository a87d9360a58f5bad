"""The fixes of the model's arithmetic, applied to every top-level module the step calls: torch.compile,
bfloat16 autocast, TF32, channels_last, cuDNN's autotuner, fused attention for Hugging Face models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.evidence import IN_EFFECT, RoundWork, pct
from gpudoctor.fixes.frameworks import Framework
from gpudoctor.fixes.kinds.base import (
    HALF_TOLERANCE,
    TF32_TOLERANCE,
    Fix,
    Proposing,
    roots_named,
)
from gpudoctor.fixes.observe import Observations
from gpudoctor.fixes.patches.attention import HFSdpa
from gpudoctor.fixes.patches.autocast import Autocast
from gpudoctor.fixes.patches.backend import TF32, CudnnBenchmark
from gpudoctor.fixes.patches.base import FixPatch, PatchContext
from gpudoctor.fixes.patches.compile import MODES, Compile, CompileFunctions
from gpudoctor.fixes.patches.layout import ChannelsLast

NO_MODULE = "no nn.Module with parameters was called"
NOT = "did not take effect: "


def _fp32(obs: Observations) -> bool:
    """A float32 module the step calls, not already under autocast (the Trainer's bf16=True: bfloat16
    autocast timed on top of it measured -1.2%)."""
    return any(r.dtype == "float32" and r.autocast is None for r in obs.step_roots)


class CompileFix(Fix):
    kind = "compile"
    title = "torch.compile"
    rules = ("launch_overhead", "unfused_elementwise", "host_python")
    tolerance_note = "fused kernels reorder float arithmetic"
    reorders = True
    compiled = True
    patch: ClassVar[type[FixPatch]] = Compile
    example_arg = "compile:reduce-overhead"

    def valid_arg(self, arg: str) -> bool:
        return not arg or arg in MODES

    def title_of(self, arg: str) -> str:
        return f"{self.title} ({arg})" if arg else self.title

    def build(self, ctx: PatchContext, arg: str, *, compile_backend: str, exact_random: bool) -> FixPatch:
        return Compile(ctx, arg or "default", compile_backend, exact_random)

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        roots = p.obs.step_roots
        if not roots or not (p.obs.cuda or p.found):
            return []
        mode = f":{p.compile_mode}" if p.compile_mode and p.compile_mode != "default" else ""
        modules = "the model" if len(roots) == 1 else f"the {len(roots)} modules the step calls"
        plain = (f"compile{mode}", f"{modules} can be compiled")
        # the GPU waits on the host (launches, Python between ops) and the shapes never change: CUDA
        # graphs replay the whole step in one launch, the expert's first choice, so tried first
        host_bound = bool({"launch_overhead", "host_python"} & set(p.found)) or not p.found
        if mode or not (p.obs.cuda and p.obs.static_shapes and host_bound):
            return [plain]
        graphs = ("compile:reduce-overhead", "host-bound with static input shapes: CUDA graphs")
        # but not over several modules: their graphs share one memory pool, and an output of one that
        # another keeps is overwritten by a later replay ("accessing tensor output of CUDAGraphs that
        # has been overwritten by a subsequent run": a DCGAN's, a diffusion UNet's on the H200, and
        # both patterns in small in lab/cudagraph_modules.py)
        return [graphs, plain] if len(roots) == 1 else [plain, graphs]

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        roots = obs.step_roots
        if not roots:
            return NO_MODULE
        if all(r.compiled for r in roots):
            return f"the script compiles {'the model' if len(roots) == 1 else roots_named(obs)} itself (torch.compile)"
        return None

    def not_in_effect(self, seen: RoundWork) -> str | None:
        if seen.compiled is not None and seen.compiled.graphs == 0:
            return NOT + "torch.compile compiled no graph (the forward never ran compiled)"
        return None

    def evidence(self, seen: RoundWork) -> str | None:
        c = seen.compiled
        if c is None:
            return None

        def n(count: int, noun: str) -> str:
            return f"{count} {noun}{'' if count == 1 else 's'}"

        breaks = f", {n(c.graph_breaks, 'graph break')}" if c.graph_breaks else ""
        skipped = ""
        if c.cudagraph_skips:  # mode="reduce-overhead" without its CUDA graphs, where Inductor skipped them
            why = f": {'; '.join(c.cudagraph_reasons)}" if c.cudagraph_reasons else ""
            skipped = f"; CUDA graphs skipped {n(c.cudagraph_skips, 'time')}{why}"
        return (
            f"{n(c.graphs, 'graph')} compiled from {n(c.frames, 'frame')} ({n(c.ops, 'op')}){breaks}{skipped}"
        )

    def in_framework(self, fw: Framework, arg: str, edits: Sequence[Edit]) -> list[Edit] | None:
        if fw.name == "transformers":
            mode = {"torch_compile_mode": f'"{arg}"'} if arg and arg != "default" else {}
            return [fw.option(torch_compile="True", **mode)]
        if edits:  # the compile after the model is made (`patches.compile.written_form`): Lightning's, Accelerate's too
            return None
        if fw.name == "lightning" and (fit := fw.fit_model()) is not None:
            line, name = fit  # a LightningModule: a class Dynamo traces, which `.compile()` compiles
            code = f"{name}.compile()" if not arg or arg == "default" else f'{name}.compile(mode="{arg}")'
            return [Edit("before_statement", fw.file, line, code=(code,))]
        if fw.name == "accelerate" and (not arg or arg == "default"):
            return [fw.option(dynamo_backend='"inductor"')]
        return None


class CompileFunctionsFix(CompileFix):
    """torch.compile of the plain functions that call the step's modules, one of the compile group: tried
    before the modules are compiled one by one where the step calls several from such a function (an
    actor and a critic from `act()`, an encoder and a head from `forward_step()`), which then becomes the
    group's alternative. What it shows and how it is written: `patches.compile.CompileFunctions`."""

    kind = "compile_fn"
    group = "compile"
    title = "torch.compile of the step's functions"
    patch: ClassVar[type[FixPatch]] = CompileFunctions
    example_arg = ""

    def valid_arg(self, arg: str) -> bool:
        return not arg

    def title_of(self, arg: str) -> str:
        return self.title

    def build(self, ctx: PatchContext, arg: str, *, compile_backend: str, exact_random: bool) -> FixPatch:
        return CompileFunctions(ctx, compile_backend, exact_random)

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        roots, functions = p.obs.step_roots, p.obs.step_functions
        # a training step (its optimizer's steps count it): a step counted by its modules' calls would
        # not be counted where those calls run compiled, inside the function
        if len(roots) < 2 or not functions or not p.obs.optimizers or not (p.obs.cuda or p.found):
            return []
        names = ", ".join(f"{f.name}()" for f in functions)
        return [
            (
                self.kind,
                f"the step calls its {len(roots)} modules from {names}: compiled with the code between them",
            )
        ]

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        if not obs.step_functions:
            return (
                "no plain function of your files calls the step's modules (a loop at the top level, a method)"
            )
        if all(r.compiled for r in obs.step_roots):
            return f"the script compiles {roots_named(obs)} itself (torch.compile)"
        return None

    def in_framework(self, fw: Framework, arg: str, edits: Sequence[Edit]) -> list[Edit] | None:
        return None  # the functions are the user's own: the edits after their `def`


class AutocastFix(Fix):
    kind = "autocast"
    title = "bfloat16 autocast"
    draws_differ = True
    rules = ("tensor_cores_unused", "tf32_not_bf16", "unfused_elementwise")
    tolerance = HALF_TOLERANCE
    tolerance_note = "bfloat16 keeps 8 mantissa bits"
    patch: ClassVar[type[FixPatch]] = Autocast
    example_arg = "autocast:float16"

    def valid_arg(self, arg: str) -> bool:
        return arg in ("", "auto", "bfloat16", "float16")

    def title_of(self, arg: str) -> str:
        return f"{self.title} ({arg})" if arg else self.title

    def build(self, ctx: PatchContext, arg: str, *, compile_backend: str, exact_random: bool) -> FixPatch:
        return Autocast(ctx, arg or "auto")

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        if _fp32(p.obs) and (p.obs.cuda or "tensor_cores_unused" in p.found):
            return [("autocast", "float32 model: bfloat16 tensor cores")]
        return []

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        roots = obs.step_roots
        if not roots:
            return NO_MODULE
        if all(r.autocast is not None for r in roots):
            return f"{roots_named(obs)} already run{'s' if len(roots) == 1 else ''} under {roots[0].autocast} autocast"
        if all(r.dtype != "float32" or r.autocast is not None for r in roots):
            dtypes = ", ".join(dict.fromkeys(r.dtype for r in roots))
            return f"the parameters of {roots_named(obs)} are {dtypes}, not float32"
        return None

    def not_in_effect(self, seen: RoundWork) -> str | None:
        w = seen.work
        if w is None:
            return None
        if not w.total:
            return NOT + f"no matmul or convolution ran in the forward{seen.of_modules}"
        share = w.half_flops() / w.total
        if share < IN_EFFECT:
            return NOT + (
                f"{pct(share)} of the forward's matmul and convolution work{seen.of_modules} ran in "
                "reduced precision"
            )
        return None

    def evidence(self, seen: RoundWork) -> str | None:
        w = seen.work
        if w is None or not w.total:
            return None
        share = pct(w.half_flops() / w.total)
        return f"{share} of the forward's matmul/convolution work in reduced precision{seen.over_modules}"

    def in_framework(self, fw: Framework, arg: str, edits: Sequence[Edit]) -> list[Edit] | None:
        fp16 = arg == "float16" or any("float16" in e.wrap.replace("bfloat16", "") for e in edits)
        if fw.name == "transformers":
            return [fw.option(**{"fp16" if fp16 else "bf16": "True"})]
        if fw.name == "lightning":
            return [fw.option(precision='"16-mixed"' if fp16 else '"bf16-mixed"')]
        if fw.name == "accelerate":
            return [fw.option(mixed_precision='"fp16"' if fp16 else '"bf16"')]
        return None


class TF32Fix(Fix):
    kind = "tf32"
    title = "TF32 for float32 matmuls"
    rules = ("tensor_cores_unused",)
    tolerance = TF32_TOLERANCE
    tolerance_note = "TF32 rounds matmul inputs to 10 mantissa bits"
    group = "precision"
    patch: ClassVar[type[FixPatch]] = TF32

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        if (
            _fp32(p.obs)
            and (p.obs.cuda or "tensor_cores_unused" in p.found)
            and p.obs.float32_matmul_precision == "highest"
        ):
            return [("tf32", "float32 matmuls at full precision")]
        return []

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        if obs.float32_matmul_precision != "highest":
            return f"float32 matmul precision is already {obs.float32_matmul_precision!r}"
        return None

    def not_in_effect(self, seen: RoundWork) -> str | None:
        w = seen.work
        if w is not None and w.total and not w.flops.get("float32", 0.0):
            return NOT + "no float32 matmul or convolution ran in the forward"
        return None

    def in_framework(self, fw: Framework, arg: str, edits: Sequence[Edit]) -> list[Edit] | None:
        return [fw.option(tf32="True")] if fw.name == "transformers" else None


class ChannelsLastFix(Fix):
    kind = "channels_last"
    title = "channels_last memory format"
    rules = ("conv_layout",)
    tolerance_note = "other convolution algorithms"
    reorders = True
    patch: ClassVar[type[FixPatch]] = ChannelsLast

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        nchw = [r for r in p.obs.step_roots if r.conv2d and not r.channels_last]
        if nchw and _convolutions(p):
            return [(self.kind, "convolutions in NCHW")]
        return []

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        why = _no_convolutions(obs)
        if why is None and all(r.channels_last for r in obs.step_roots if r.conv2d):
            return "the script already makes its convolutions' weights channels_last"
        return why

    def not_in_effect(self, seen: RoundWork) -> str | None:
        w = seen.work
        if w is None:
            return None
        if not w.conv_flops:
            return NOT + f"no convolution ran in the forward{seen.of_modules}"
        share = w.conv_nhwc_flops / w.conv_flops
        if share < IN_EFFECT:
            return NOT + f"{pct(share)} of the convolution work{seen.of_modules} was fed channels_last"
        return None

    def evidence(self, seen: RoundWork) -> str | None:
        w = seen.work
        if w is None or not w.conv_flops:
            return None
        return f"{pct(w.conv_nhwc_flops / w.conv_flops)} of the convolution work fed channels_last{seen.over_modules}"


def _no_convolutions(obs: Observations) -> str | None:
    """Why the step's modules run no convolution, or None."""
    roots = obs.step_roots
    if not roots:
        return NO_MODULE
    if not any(r.conv2d for r in roots):
        return f"{roots_named(obs)} {'has' if len(roots) == 1 else 'have'} no 2-D convolution"
    return None


def _convolutions(p: Proposing) -> bool:
    """The step's modules run convolutions, on a GPU (or the diagnosis saw NCHW convolutions)."""
    return any(r.conv2d for r in p.obs.step_roots) and (p.obs.cuda or "conv_layout" in p.found)


class CudnnBenchmarkFix(ChannelsLastFix):
    kind = "cudnn_benchmark"
    title = "cudnn.benchmark"
    patch: ClassVar[type[FixPatch]] = CudnnBenchmark

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        if _convolutions(p) and not p.obs.cudnn_benchmark:
            return [(self.kind, "convolutions without cuDNN's autotuner")]
        return []

    def not_in_effect(self, seen: RoundWork) -> str | None:
        return None  # the autotuner's choice shows in no layout or dtype

    def evidence(self, seen: RoundWork) -> str | None:
        return None

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        why = _no_convolutions(obs)
        if why is None and not obs.cuda:
            return "no CUDA device: cuDNN is not used"
        if why is None and obs.cudnn_benchmark:
            return "torch.backends.cudnn.benchmark is already on"
        return why


class SdpaFix(Fix):
    kind = "sdpa"
    title = "scaled_dot_product_attention"
    rules = ("attention_materialized",)
    tolerance_note = "fused attention kernels reorder float arithmetic"
    reorders = True
    patch: ClassVar[type[FixPatch]] = HFSdpa

    def propose(self, p: Proposing) -> list[tuple[str, str]]:
        if any(r.hf_attention == "eager" for r in p.obs.step_roots):
            return [(self.kind, "a Hugging Face model with eager attention")]
        return []

    def why_not(self, obs: Observations, arg: str, steps: int) -> str | None:
        roots = obs.step_roots
        if not roots:
            return NO_MODULE
        if not any(r.hf_attention == "eager" for r in roots):
            verb = "is" if len(roots) == 1 else "are"
            return f"{roots_named(obs)} {verb} not a Hugging Face model with eager attention"
        return None

    def not_in_effect(self, seen: RoundWork) -> str | None:
        w = seen.work
        if w is not None and not w.attention_calls:
            return NOT + "no fused scaled_dot_product_attention ran in the forward"
        return None

    def evidence(self, seen: RoundWork) -> str | None:
        w = seen.work
        if w is None or not w.total:
            return None
        return f"{w.attention_calls} fused attention calls in the forward{seen.over_modules}"
