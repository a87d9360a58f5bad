"""Every fix gpudoctor can apply: its id (`kind` or `kind:argument`, e.g. `workers:8`,
`compile:reduce-overhead`), what it is called, the findings it answers, the numerics tolerance it is held
to (none for a loader fix: it changes where batches are made, not the model's arithmetic), the group of
alternatives it belongs to (one of a group is kept), whether it can be switched in a running process
(its A/B then runs in blocks of one process, also in a kept fix's place where both wrap the root's
forward), and the patch that applies it."""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.fixes.patches.attention import HFSdpa
from gpudoctor.fixes.patches.autocast import Autocast
from gpudoctor.fixes.patches.backend import TF32, CudnnBenchmark
from gpudoctor.fixes.patches.base import FixPatch, PatchContext
from gpudoctor.fixes.patches.compile import MODES, Compile
from gpudoctor.fixes.patches.forward import ForwardWrapper
from gpudoctor.fixes.patches.layout import ChannelsLast
from gpudoctor.fixes.patches.loader import LargerBatch, PinMemory, Workers
from gpudoctor.fixes.patches.memory import NoEmptyCache
from gpudoctor.fixes.patches.noop import NoOp
from gpudoctor.fixes.patches.optimizer import FusedOptimizer, ZeroGradSetToNone
from gpudoctor.util.errors import UsageError

# Largest relative difference of the first steps' losses (or outputs) from the baseline's. Changes that
# only reorder floating-point work are held tight; reduced-precision arithmetic is allowed its rounding.
TIGHT = 1e-3
TF32_TOLERANCE = 1e-2  # 10-bit mantissa products, float32 accumulation
HALF_TOLERANCE = 5e-2  # bfloat16's 8-bit mantissa; the loss of a few steps moves by about a percent
# a script already computing in bfloat16 or float16: work reordered in it rounds at their precision
# (BERT under the Trainer's bf16=True, compiled: 0.1% over 5 steps, past float32's TIGHT)
HALF_REORDER_TOLERANCE = 1e-2


@dataclass(frozen=True)
class FixSpec:
    kind: str
    title: str
    rules: tuple[str, ...]  # the findings this fix answers
    tolerance: float | None  # None: results are not comparable (the batch changes): finite is enough
    tolerance_note: str
    group: str  # alternatives: only one of a group goes into the combination (bfloat16 autocast
    # leaves TF32 little to do: its matmuls no longer run in float32)
    # judged on speed alone: where batches are made changes, not the model's arithmetic (its losses are
    # still reported, and a fix combined with it is held to its own tolerance against it alone)
    speed_only: bool = False


SPECS: dict[str, FixSpec] = {
    s.kind: s
    for s in (
        FixSpec(
            "tf32",
            "TF32 for float32 matmuls",
            ("tensor_cores_unused",),
            TF32_TOLERANCE,
            "TF32 rounds matmul inputs to 10 mantissa bits",
            "precision",
        ),
        FixSpec(
            "autocast",
            "bfloat16 autocast",
            ("tensor_cores_unused", "tf32_not_bf16", "unfused_elementwise"),
            HALF_TOLERANCE,
            "bfloat16 keeps 8 mantissa bits",
            "autocast",
        ),
        FixSpec(
            "compile",
            "torch.compile",
            ("launch_overhead", "unfused_elementwise", "host_python"),
            TIGHT,
            "fused kernels reorder float arithmetic",
            "compile",
        ),
        FixSpec(
            "channels_last",
            "channels_last memory format",
            ("conv_layout",),
            TIGHT,
            "other convolution algorithms",
            "channels_last",
        ),
        FixSpec(
            "cudnn_benchmark",
            "cudnn.benchmark",
            ("conv_layout",),
            TIGHT,
            "other convolution algorithms",
            "cudnn_benchmark",
        ),
        FixSpec(
            "fused_optimizer",
            "fused optimizer",
            ("optimizer_unfused",),
            TIGHT,
            "the same update in fewer kernels",
            "fused_optimizer",
        ),
        FixSpec(
            "zero_grad_none",
            "zero_grad(set_to_none=True)",
            ("optimizer_unfused",),
            TIGHT,
            "gradients start from None instead of zeros",
            "zero_grad_none",
        ),
        FixSpec(
            "workers",
            "DataLoader workers",
            ("input_pipeline",),
            None,
            "judged on speed: the model's arithmetic is unchanged, and batches made in worker "
            "processes may draw other random numbers (random augmentation)",
            "workers",
            speed_only=True,
        ),
        FixSpec(
            "pin_memory",
            "pinned memory, non-blocking copies",
            ("input_pipeline", "pageable_copy"),
            None,
            "judged on speed: the same bytes, copied asynchronously",
            "pin_memory",
            speed_only=True,
        ),
        FixSpec(
            "no_empty_cache",
            "no empty_cache() in the loop",
            ("allocator_thrash",),
            TIGHT,
            "memory is reused instead of returned",
            "no_empty_cache",
        ),
        FixSpec(
            "sdpa",
            "scaled_dot_product_attention",
            ("attention_materialized",),
            TIGHT,
            "fused attention kernels reorder float arithmetic",
            "sdpa",
        ),
        FixSpec("noop", "nothing (A/A)", (), TIGHT, "the unchanged script", "noop"),
        FixSpec(
            "batch",
            "larger batch",
            ("small_batch",),
            None,
            "another batch size gives other losses: only checked to stay finite",
            "batch",
        ),
    )
}


def spec_of(fix_id: str) -> FixSpec:
    kind = fix_id.split(":", 1)[0]
    if kind not in SPECS:
        raise UsageError(f"unknown fix {fix_id!r} (known: {', '.join(SPECS)})")
    return SPECS[kind]


def title_of(fix_id: str) -> str:
    kind, _, arg = fix_id.partition(":")
    title = spec_of(fix_id).title
    if kind == "workers":
        return f"{title} ({arg})"
    if kind in ("compile", "autocast") and arg:
        return f"{title} ({arg})"
    if kind == "batch":
        return f"{title} ({arg})"
    return title


def validate(fix_id: str) -> str:
    """The id if it names a fix and a valid argument; a UsageError otherwise."""
    kind, _, arg = fix_id.partition(":")
    spec_of(fix_id)
    ok = {
        "workers": lambda a: a.isdigit() and int(a) > 0,
        "compile": lambda a: a in MODES,
        "autocast": lambda a: a in ("auto", "bfloat16", "float16"),
        "batch": lambda a: a.removeprefix("x").isdigit() and int(a.removeprefix("x")) > 1,
    }
    needs = kind in ("workers", "batch")
    if (needs and not arg) or (arg and (kind not in ok or not ok[kind](arg))):
        raise UsageError(
            f"bad fix {fix_id!r}: e.g. workers:4, compile:reduce-overhead, autocast:float16, batch:x2"
        )
    return fix_id


PATCH_CLASSES: dict[str, type[FixPatch]] = {
    "tf32": TF32,
    "channels_last": ChannelsLast,
    "cudnn_benchmark": CudnnBenchmark,
    "fused_optimizer": FusedOptimizer,
    "zero_grad_none": ZeroGradSetToNone,
    "pin_memory": PinMemory,
    "no_empty_cache": NoEmptyCache,
    "sdpa": HFSdpa,
    "noop": NoOp,
    "workers": Workers,
    "batch": LargerBatch,
    "compile": Compile,
    "autocast": Autocast,
}


def can_switch(switched: tuple[str, ...], replaced: tuple[str, ...] = ()) -> bool:
    """Can a running process turn `switched` on and `replaced` off (its B side), and back (its A side),
    the rest of its fixes staying on? Each must be switchable, and what is replaced must wrap the root's
    forward: where wrappers differ, each side's forward is built from its own (`ForwardVariants`), so
    autocast can leave from beneath a torch.compile that stays (compile(forward) beside
    compile(autocast(forward))) and one compile mode take another's place."""
    kinds = [f.split(":", 1)[0] for f in (*switched, *replaced)]
    if not switched or not all(k in PATCH_CLASSES and PATCH_CLASSES[k].switchable for k in kinds):
        return False
    return all(wraps_forward(f) for f in replaced)


def wraps_forward(fix_id: str) -> bool:
    """Does the fix wrap the root module's forward (autocast, torch.compile)?"""
    cls = PATCH_CLASSES.get(fix_id.split(":", 1)[0])
    return cls is not None and issubclass(cls, ForwardWrapper)


def build_patch(
    fix_id: str, ctx: PatchContext, *, compile_backend: str = "inductor", exact_random: bool = False
) -> FixPatch:
    kind, _, arg = validate(fix_id).partition(":")
    patch: FixPatch
    if kind == "workers":
        patch = Workers(ctx, int(arg))
    elif kind == "batch":
        patch = LargerBatch(ctx, int(arg.removeprefix("x")))
    elif kind == "compile":
        patch = Compile(ctx, arg or "default", compile_backend, exact_random)
    elif kind == "autocast":
        patch = Autocast(ctx, arg or "auto")
    else:
        patch = PATCH_CLASSES[kind](ctx)
    patch.name = fix_id
    return patch
