"""What a round shows of the work its fixes are for. `WorkProbe` counts, during each top-level module's
first call (eager, whatever wraps it later), the forward's matmul, convolution and attention work by dtype
and layout; `CompileCounts` reads what torch.compile compiled in the round; `RoundWork` holds both for a
fix to read whether it took effect (`kinds.base.Fix.not_in_effect`): bfloat16 around an `Embedding` alone
ran no matmul in bfloat16."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.util.serial import Serialized

HALF = ("bfloat16", "float16")
IN_EFFECT = 0.5  # a share of the work the fix is for below this: it did not take effect
MATMULS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation"}
CONVOLUTIONS = {"convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution"}
# ops that draw from a random generator (as a forward's dispatch sees them: dropout is `bernoulli_`,
# `native_dropout` or `_fused_dropout`; a VAE's sampling `randn_like`): compiled, they draw other numbers
RANDOM_OPS = {"bernoulli", "bernoulli_", "native_dropout", "_fused_dropout", "rand", "rand_like", "randn",
              "randn_like", "randint", "randint_like", "randperm", "normal", "normal_", "uniform_", "random_",
              "exponential_", "geometric_", "cauchy_", "log_normal_", "multinomial", "poisson",
              "_standard_gamma", "rrelu_with_noise"}  # fmt: skip
DROPOUT_OPS = {"bernoulli_", "native_dropout", "_fused_dropout"}  # what dropout modules draw with


@dataclass(frozen=True)
class WorkTally(Serialized):
    """The forward work of one module's first call: FLOPs of matmuls, convolutions and fused attention by
    input dtype, and of convolutions fed channels_last (NHWC) inputs."""

    flops: dict[str, float] = field(default_factory=dict)  # dtype -> matmul + convolution + attention
    conv_flops: float = 0.0
    conv_nhwc_flops: float = 0.0
    attention_calls: int = 0  # fused scaled_dot_product_attention kernels
    ops: int = 0  # every op the forward ran
    random_ops: int = 0  # ops that drew random numbers (RANDOM_OPS)
    sampling_ops: int = 0  # of those, the ones dropout does not draw with: a sampling of the forward's own

    @property
    def total(self) -> float:
        return sum(self.flops.values())

    def half_flops(self) -> float:
        return sum(v for k, v in self.flops.items() if k in HALF)


@dataclass(frozen=True)
class CompileCounts(Serialized):
    """What torch.compile did in a round (Dynamo's counters, from the round's start)."""

    graphs: int = 0
    frames: int = 0  # frames converted into graphs
    ops: int = 0  # calls captured into them
    graph_breaks: int = 0
    # CUDA graphs (mode="reduce-overhead") that Inductor skipped, and why ("skipping cudagraphs due to
    # mutated inputs …"): the compiled code then runs without them
    cudagraph_skips: int = 0
    cudagraph_reasons: tuple[str, ...] = ()


def summed(tallies: Sequence[WorkTally]) -> WorkTally:
    flops: dict[str, float] = {}
    for t in tallies:
        for k, v in t.flops.items():
            flops[k] = flops.get(k, 0.0) + v
    return WorkTally(
        flops,
        sum(t.conv_flops for t in tallies),
        sum(t.conv_nhwc_flops for t in tallies),
        sum(t.attention_calls for t in tallies),
        sum(t.ops for t in tallies),
        sum(t.random_ops for t in tallies),
        sum(t.sampling_ops for t in tallies),
    )


def _numel(shape: Sequence[int]) -> float:
    return float(math.prod(int(s) for s in shape))


def _transposed(name: str, args: Sequence[Any]) -> bool:
    """A transposed convolution: aten.convolution's and aten._convolution's 7th argument."""
    return name in ("convolution", "_convolution") and len(args) > 6 and args[6] is True


def op_flops(name: str, args: Sequence[Any], out: Any) -> tuple[str, float] | None:
    """(kind, FLOPs) of a matmul, convolution or fused attention op from its arguments' shapes; None for
    any other op."""
    tensors = [a for a in args if hasattr(a, "shape") and hasattr(a, "dtype")]
    if name in MATMULS:
        a, b = (
            (tensors[1], tensors[2])
            if name in ("addmm", "baddbmm", "addbmm", "_addmm_activation")
            else tensors[:2]
        )
        if a.dim() < 2 or b.dim() < 2:
            return None
        return "matmul", 2.0 * _numel(a.shape) * b.shape[-1]
    if name in CONVOLUTIONS and len(tensors) >= 2 and hasattr(out, "shape"):
        x, weight = tensors[0], tensors[1]
        if _transposed(name, args):  # weight (Cin, Cout/groups, k…): each input scatters to Cout/groups x k…
            return "conv", 2.0 * _numel(x.shape) * _numel(weight.shape[1:])
        per_output = _numel(weight.shape[1:])  # Cin/groups x the kernel's size
        return "conv", 2.0 * _numel(out.shape) * per_output
    if name.startswith("_scaled_dot_product") and len(tensors) >= 3:
        q, k = tensors[0], tensors[1]
        return "attention", 4.0 * _numel(q.shape) * k.shape[-2]
    return None


def work_probe() -> Any:
    """A TorchDispatchMode that tallies the work it sees (made on demand: it needs torch)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class WorkProbe(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.flops: dict[str, float] = {}
            self.conv = self.nhwc = 0.0
            self.attention = self.ops = self.random = self.sampling = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            self.ops += 1
            name = func.overloadpacket.__name__
            if name in RANDOM_OPS:
                self.random += 1
                self.sampling += name not in DROPOUT_OPS
            try:
                counted = op_flops(name, args, out)
            except (IndexError, AttributeError, TypeError, RuntimeError):
                counted = None
            if counted is not None:
                kind, flops = counted
                first = next(a for a in args if isinstance(a, torch.Tensor))
                if kind == "matmul" and name in ("addmm", "baddbmm", "addbmm", "_addmm_activation"):
                    first = args[1]
                dtype = str(first.dtype).removeprefix("torch.")
                self.flops[dtype] = self.flops.get(dtype, 0.0) + flops
                if kind == "conv":
                    self.conv += flops
                    if first.dim() == 4 and first.is_contiguous(memory_format=torch.channels_last):
                        self.nhwc += flops
                elif kind == "attention":
                    self.attention += 1
            return out

        def tally(self) -> WorkTally:
            return WorkTally(
                dict(self.flops), self.conv, self.nhwc, self.attention, self.ops, self.random, self.sampling
            )

    return WorkProbe()


# Inductor says why it skips CUDA graphs on this logger (torch._inductor.cudagraph_utils'
# `cudagraphs` artifact, off unless TORCH_LOGS asks: it does not reach its parents then, but a handler of
# its own still hears it)
CUDAGRAPHS_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"
MAX_REASONS = 3


class _SkipReasons(logging.Handler):
    """The distinct messages of Inductor's CUDA-graph skips in this process, in order, the first few."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: dict[str, None] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.seen) < MAX_REASONS:
            with contextlib.suppress(Exception):  # a message that does not format: not a reason
                self.seen.setdefault(" ".join(record.getMessage().split())[:300], None)


_reasons: _SkipReasons | None = None


def listen_for_cudagraph_skips() -> None:
    """Hear Inductor's reasons for skipping CUDA graphs from now on, in this process (once)."""
    global _reasons
    if _reasons is None:
        _reasons = _SkipReasons()
        logging.getLogger(CUDAGRAPHS_LOGGER).addHandler(_reasons)


def compile_counts() -> CompileCounts:
    """Dynamo's and Inductor's counters as they stand (zero where torch._dynamo was never imported), and
    the CUDA-graph skips' reasons heard so far (`listen_for_cudagraph_skips`)."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return CompileCounts()
    counters = utils.counters
    stats, frames = counters.get("stats", {}), counters.get("frames", {})
    return CompileCounts(
        graphs=int(stats.get("unique_graphs", 0)),
        frames=int(frames.get("ok", 0)),
        ops=int(stats.get("calls_captured", 0)),
        graph_breaks=int(sum(counters.get("graph_break", {}).values())),
        cudagraph_skips=int(counters.get("inductor", {}).get("cudagraph_skips", 0)),
        cudagraph_reasons=tuple(_reasons.seen) if _reasons is not None else (),
    )


def since(now: CompileCounts, start: CompileCounts) -> CompileCounts:
    return CompileCounts(
        now.graphs - start.graphs,
        now.frames - start.frames,
        now.ops - start.ops,
        now.graph_breaks - start.graph_breaks,
        now.cudagraph_skips - start.cudagraph_skips,
        tuple(r for r in now.cudagraph_reasons if r not in start.cudagraph_reasons),
    )


@dataclass(frozen=True)
class RoundWork:
    """What a round shows that a fix's evidence is read from: the forward work of the step's modules'
    first calls (None where none was probed), what torch.compile did, and how many modules the step calls."""

    work: WorkTally | None
    compiled: CompileCounts | None
    modules: int = 1

    @property
    def of_modules(self) -> str:
        return f" of the {self.modules} modules the step calls" if self.modules > 1 else ""

    @property
    def over_modules(self) -> str:
        return f" over {self.modules} modules" if self.modules > 1 else ""


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"
