"""The columnar `Trace`: every duration event of a Kineto trace as one row of numpy columns.

Rows are sorted by start time. Times are float µs relative to `meta.origin_us` (the file's earliest
timestamp); names are ids into `names`; a missing number is -1 (ids, sizes) or NaN (measurements).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from typing import Any

import numpy as np

from gpudoctor.device import DeviceInfo


class Kind(IntEnum):
    """What a row is. The Kineto category names map onto these (see `CATEGORY_KINDS`)."""

    OTHER = 0
    CPU_OP = 1
    USER_ANNOTATION = 2
    PYTHON = 3
    RUNTIME = 4
    DRIVER = 5
    KERNEL = 6
    MEMCPY = 7
    MEMSET = 8
    GPU_ANNOTATION = 9
    GPU_SYNC = 10


# Kineto's category names, current and older spellings; lower-cased before lookup.
# the category of the events gpudoctor adds to an annotated trace (report.annotated_trace)
ANNOTATION_CATEGORY = "gpudoctor"
CATEGORY_KINDS: dict[str, Kind] = {
    "cpu_op": Kind.CPU_OP,
    "operator": Kind.CPU_OP,
    "user_annotation": Kind.USER_ANNOTATION,
    "python_function": Kind.PYTHON,
    "python": Kind.PYTHON,
    "cuda_runtime": Kind.RUNTIME,
    "runtime": Kind.RUNTIME,
    "privateuse1_runtime": Kind.RUNTIME,
    "cuda_driver": Kind.DRIVER,
    "driver": Kind.DRIVER,
    "privateuse1_driver": Kind.DRIVER,
    "kernel": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY,
    "memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "memset": Kind.MEMSET,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
    "cuda_sync": Kind.GPU_SYNC,
    # known, and of no use to the analyses
    "trace": Kind.OTHER,
    "overhead": Kind.OTHER,
    ANNOTATION_CATEGORY: Kind.OTHER,  # an annotated trace read back: gpudoctor's own rows, on their process
}

# The ops whose argument records (record_shapes) the loader keeps: those whose FLOPs and bytes
# gpudoctor derives (analysis/roofline.py). Every op's would cost a sixth of the load time.
MATMUL_OPS = frozenset(
    {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
)
CONVOLUTION_OPS = frozenset({
    "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
    "aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::convolution_backward",
})  # fmt: skip
ATTENTION_OPS = frozenset({
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention_backward",
})  # fmt: skip
ELEMENTWISE_OPS = frozenset(
    f"aten::{name}{suffix}"
    for name in (
        "add", "sub", "mul", "div", "relu", "clamp_min", "gelu", "silu", "sigmoid", "tanh", "neg", "exp",
        "sqrt", "rsqrt", "addcmul", "addcdiv", "lerp", "threshold_backward", "gelu_backward",
        "silu_backward", "sigmoid_backward", "tanh_backward",
    )
    for suffix in ("", "_")
)  # fmt: skip
SHAPED_OPS = MATMUL_OPS | CONVOLUTION_OPS | ATTENTION_OPS | ELEMENTWISE_OPS

# The ranges torch itself records with record_function: user annotations since PyTorch 1.10, but
# "Operator" events in PyTorch <= 1.9, like every op (the loader turns them back into annotations).
_TORCH_ANNOTATION = re.compile(
    r"^(?:ProfilerStep#\d+$|Optimizer\.(?:step|zero_grad)#|enumerate\(DataLoader\)#)"
)


def is_torch_annotation(name: str) -> bool:
    """Whether a CPU range of this name is one torch records as a user annotation."""
    return _TORCH_ANNOTATION.match(name) is not None


GPU_ACTIVITY_KINDS = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
LAUNCH_KINDS = (Kind.RUNTIME, Kind.DRIVER)


RUN_STEP_KEY = (
    "gpudoctor_step"  # trace metadata: how `gpudoctor run` found the step it marked (runner.capture)
)


@dataclass(frozen=True)
class DistributedInfo:
    rank: int
    world_size: int | None
    backend: str | None


@dataclass(frozen=True)
class TraceMeta:
    """Everything about the trace that is not an event."""

    path: str
    schema_version: int | None
    base_time_ns: int | None  # epoch ns of file timestamp 0, where the trace uses relative timestamps
    origin_us: float  # the file timestamp that became 0 in `Trace.ts`
    devices: tuple[DeviceInfo, ...]
    distributed: DistributedInfo | None
    trace_name: str | None
    profiler_config: dict[str, Any] = field(default_factory=dict)
    run_step: str | None = None  # how `gpudoctor run` found the step it marked ("one call of X.forward")
    # Events of categories gpudoctor does not read (kept as Kind.OTHER), counted by category, lower-cased:
    # what a trace holds besides CUDA/ROCm activity ("mtia_ccp_events", "cuda_profiler_range").
    other_categories: dict[str, int] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.distributed.rank if self.distributed else 0

    @property
    def epoch_origin_ns(self) -> int | None:
        """Wall-clock ns of `ts == 0`; aligns the ranks of one distributed run."""
        if self.base_time_ns is not None:
            return self.base_time_ns + round(self.origin_us * 1000)
        if self.origin_us > 1e14:  # absolute µs since the epoch (older Kineto)
            return round(self.origin_us) * 1000  # origin is whole µs; * 1000 in float64 would round
        return None


@dataclass(frozen=True)
class MemoryEvents:
    """`[memory]` instant events (profile_memory): one row per allocation (+) or free (−)."""

    ts: np.ndarray  # float64 µs
    bytes: np.ndarray  # int64, negative for a free
    total_allocated: np.ndarray  # int64, -1 if absent
    total_reserved: np.ndarray  # int64, -1 if absent
    device_type: np.ndarray  # int8: 0 CPU, 1 CUDA (Kineto's c10 DeviceType)
    device_id: np.ndarray  # int16

    def __len__(self) -> int:
        return len(self.ts)


@dataclass(frozen=True)
class OpInputs:
    """A CPU op's arguments as `record_shapes` records them, one entry per argument (Kineto's
    "Input Dims", "Input type" and "Concrete Inputs"); any of them may be empty in a trace."""

    dims: tuple[
        Any, ...
    ]  # a tensor's shape (tuple of ints), () for a non-tensor, a tuple of shapes for a list
    types: tuple[str, ...]  # "c10::BFloat16", "float", "long int", "Scalar", "ScalarList", "" (None) ...
    concrete: tuple[str, ...]  # scalar arguments' values as text ("[2, 2]", "1", "True"); "" for tensors


@dataclass(frozen=True)
class CommCalls:
    """The collective calls torch.distributed recorded (`record_param_comms` CPU ops, one row each, in
    time order): what each moved, for the bandwidth of the kernel it launched (linked through the
    launch's `External id`). Element counts as recorded; -1 where absent."""

    external_id: np.ndarray  # int64: the op's External id, which its launches carry
    ts: np.ndarray  # float64 µs, relative like Trace.ts
    dur: np.ndarray  # float64 µs (host time)
    tid: np.ndarray  # int64
    in_nelems: np.ndarray  # int64
    out_nelems: np.ndarray  # int64
    group_size: np.ndarray  # int64
    collective: tuple[str, ...]  # "allreduce", "allgather_into_tensor_coalesced", "send", ...
    dtype: tuple[str, ...]  # c10 scalar type name: "Float", "BFloat16", ...
    group: tuple[str, ...]  # the process group's name ("0" for the default group)

    def __len__(self) -> int:
        return len(self.ts)

    @classmethod
    def empty(cls) -> CommCalls:
        i, f = np.empty(0, np.int64), np.empty(0, np.float64)
        return cls(i, f, f, i, i, i, i, (), (), ())


@dataclass(frozen=True, eq=False)
class Trace:
    """One rank's trace, columnar. Build it with `gpudoctor.trace.load_trace`."""

    meta: TraceMeta
    names: tuple[str, ...]
    kind: np.ndarray  # int8 Kind
    name: np.ndarray  # int32 index into names
    pid: np.ndarray  # int64 (string pids are negative ids into `labels`)
    tid: np.ndarray  # int64
    ts: np.ndarray  # float64 µs
    dur: np.ndarray  # float64 µs
    correlation: np.ndarray  # int64: runtime call <-> GPU activity
    external_id: np.ndarray  # int64: CPU op <-> runtime call <-> GPU activity
    device: np.ndarray  # int16, GPU rows
    stream: np.ndarray  # int64, GPU rows
    bytes: np.ndarray  # int64, memcpy / memset rows
    grid: np.ndarray  # int32 (n, 3), kernel rows (0 if unknown, e.g. ROCm)
    block: np.ndarray  # int32 (n, 3)
    registers: np.ndarray  # int32 per thread, kernel rows
    shared_memory: np.ndarray  # int64 bytes per block, kernel rows
    occupancy: np.ndarray  # float32, Kineto's "est. achieved occupancy %", kernel rows
    blocks_per_sm: np.ndarray  # float32
    warps_per_sm: np.ndarray  # float32
    python_id: np.ndarray  # int64, python rows
    python_parent_id: np.ndarray  # int64
    flops: np.ndarray  # float64, cpu ops with with_flops
    inputs: np.ndarray  # int32 index into op_inputs: SHAPED_OPS rows of a record_shapes trace, else -1
    memory: MemoryEvents
    labels: tuple[str, ...] = ()  # string pids/tids: id -k-2 is labels[k]
    op_inputs: tuple[OpInputs, ...] = ()  # the distinct argument records of cpu ops (record_shapes)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)  # events not kept, by reason
    # autograd's "Sequence number" and "Fwd thread id" of cpu ops (-1 elsewhere); empty if not loaded
    sequence: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    fwd_thread: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    comm_calls: CommCalls = field(default_factory=CommCalls.empty)
    _memo: dict[Any, np.ndarray] = field(default_factory=dict, repr=False)  # memo only

    def __len__(self) -> int:
        return len(self.ts)

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    def name_of(self, row: int) -> str:
        return self.names[int(self.name[row])]

    def inputs_of(self, row: int) -> OpInputs | None:
        """The recorded arguments of a CPU op row (None without record_shapes)."""
        i = int(self.inputs[row])
        return self.op_inputs[i] if i >= 0 else None

    def rows(self, *kinds: Kind) -> np.ndarray:
        """Row indices of the given kinds, in time order."""
        if len(kinds) == 1:
            return self._rows_by_kind.get(int(kinds[0]), _EMPTY_ROWS)
        parts = [self._rows_by_kind.get(int(k), _EMPTY_ROWS) for k in kinds]
        return np.sort(np.concatenate(parts)) if parts else _EMPTY_ROWS

    @cached_property
    def _rows_by_kind(self) -> dict[int, np.ndarray]:
        order = np.argsort(self.kind, kind="stable")
        counts = np.bincount(self.kind, minlength=len(Kind))
        bounds = np.concatenate(([0], np.cumsum(counts)))
        return {k: order[bounds[k] : bounds[k + 1]] for k in range(len(counts)) if counts[k]}

    def name_ids_matching(self, predicate: Any, ids: np.ndarray | None = None) -> np.ndarray:
        """Boolean mask over `names` (not rows) where predicate(name) holds, evaluated for the name
        ids given (default: all) and memoized per predicate. Entries not asked for read False: index
        the result only with the ids you passed."""
        done, mask = self._memo.get(predicate) or (
            np.zeros(len(self.names), bool),
            np.zeros(len(self.names), bool),
        )
        if ids is None:
            todo = np.flatnonzero(~done)
        else:  # the ids asked for, each once, in order: a scatter, not a sort (ids are a column's rows)
            asked = np.zeros(len(self.names), bool)
            asked[ids] = True
            todo = np.flatnonzero(asked & ~done)
        if len(todo):
            names = self.names
            mask[todo] = np.fromiter(
                (bool(predicate(names[i])) for i in todo.tolist()), dtype=bool, count=len(todo)
            )
            done[todo] = True
            self._memo[predicate] = (done, mask)
        return mask

    @property
    def has_gpu(self) -> bool:
        return len(self.rows(*GPU_ACTIVITY_KINDS)) > 0

    @property
    def device_info(self) -> DeviceInfo | None:
        """The properties of the GPU most of the trace's GPU activity ran on, if recorded."""
        gpu = self.rows(*GPU_ACTIVITY_KINDS)
        if not self.meta.devices:
            return None
        if len(gpu):
            ids, counts = np.unique(self.device[gpu], return_counts=True)
            main = int(ids[np.argmax(counts)])
            for info in self.meta.devices:
                if info.index == main:
                    return info
        return self.meta.devices[0]


_EMPTY_ROWS = np.empty(0, dtype=np.int64)
