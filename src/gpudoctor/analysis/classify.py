"""Names → meaning: which kernels communicate, multiply matrices, convolve, use tensor cores; which
runtime calls launch work or block the host; which way a copy goes. One place for every pattern."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from gpudoctor.trace.links import op_rows
from gpudoctor.trace.model import Kind, Trace

# HTA counts a kernel as communication when its name contains "nccl"; we add RCCL and the
# collective names that other backends (and NCCL's newer `ncclDevKernel_*`) use.
COMMUNICATION = re.compile(r"nccl|rccl|AllReduce|AllGather|ReduceScatter|AllToAll|SendRecv|Broadcast", re.I)
# rocBLAS / hipBLASLt name their Tensile GEMM kernels `Cijk_<A>_<B>_<types>_MT…` (C[i,j] = Σk A·B).
MATMUL = re.compile(
    r"gemm|matmul|nvjet|cutlass|xmma|_mma|gmma|cublas|hipblaslt|rocblas|splitK|Kernel2|^Cijk_", re.I
)
# Fused attention (FlashAttention, cuDNN / CUTLASS fused MHA, memory-efficient attention).
ATTENTION = re.compile(r"flash|fmha|attention|sdpa|_mha|mem_eff", re.I)
NORMALIZATION = re.compile(r"batch_?norm|bn_fw|bn_bw|layer_?norm|rms_?norm|group_?norm|instance_?norm", re.I)
LOSS = re.compile(r"LogSoftMax|log_softmax|nll_loss|cross_entropy", re.I)
SOFTMAX = re.compile(r"softmax", re.I)
# Optimizers' multi-tensor kernels (foreach / fused); per-parameter optimizers look like elementwise.
OPTIMIZER = re.compile(r"multi_tensor_apply|fused_?adam|FusedAdam|fused_sgd", re.I)
COMPILED = re.compile(r"^triton_|^fused_|^cutlass_fused", re.I)  # kernels a compiler already fused
REDUCTION = re.compile(r"reduce_kernel|reduction|cub::|radix_?sort|scan_kernel", re.I)
ELEMENTWISE = re.compile(
    r"elementwise|pointwise|fill_kernel|copy_kernel|CatArrayBatchedCopy|index_?select|gather|scatter|"
    r"dropout|where_kernel|masked_fill",
    re.I,
)
CHANNELS_LAST = re.compile(r"channels_?last|nhwc", re.I)  # kernels written for the NHWC layout
# cuDNN's layout conversions around NCHW convolutions (what channels_last removes), and transposes.
LAYOUT = re.compile(r"nchwToNhwc|nhwcToNchw|nchw2nhwc|nhwc2nchw|transpose", re.I)
# cuDNN's own kernels name the convolution only in part: its SIMT and tensor-core engines
# (`volta_scudnn_128x64_relu_interior_nn_v1`, `volta_fp16_s884cudnn_fp16_…`, `turing_h1688cudnn_…`), its
# FFT path (`fft2d_r2c_32x32`, `volta_gcgemm_32x32_nt`, `flip_filter`) and its implicit-GEMM offsets.
CONVOLUTION = re.compile(
    r"conv(?!ert)|implicit_?gemm|fprop|dgrad|wgrad|winograd|precomputed_convolve|im2col|"
    r"[sdh]cudnn|\d{3,5}cudnn|fft2d_|gcgemm|flip_filter|computeOffsetsKernel",
    re.I,
)
# The ops whose kernels are convolutions, whatever the kernels are called (cuDNN runs some convolutions
# as GEMMs, `volta_sgemm_*`, `nvjet_*`): the op that launched a matmul-named kernel says so.
CONVOLUTION_OPS = re.compile(r"^aten::\w*conv(?!ert)", re.I)
# Tensor-core kernels announce the MMA shape or instruction, or a reduced-precision tile;
# SIMT kernels (no tensor cores) say sgemm/dgemm/simt or name a plain fp32 tile.
TENSOR_CORE = re.compile(
    r"h\d{3,5}gemm|s\d{3,5}gemm|i\d{3,5}gemm|884|1688|16816|16832|hmma|gmma|wgmma|xmma|tensorop|"
    r"tf32|bf16|f16|fp16|e4m3|e5m2|nvjet|sm\d\d_xmma|_h16|tst|"
    r"^Cijk_.*_MI\d+x\d+x\d+_",  # Tensile on AMD's matrix cores (MFMA instruction MIMxNxK)
    re.I,
)
# cuDNN's single- and double-precision engines are SIMT: `scudnn`, `dcudnn`, the pre-Volta-style
# `dgrad_engine<float, …>` / `wgrad_alg0_engine<float, …>`, and its complex GEMM for FFT convolutions.
NOT_TENSOR_CORE = re.compile(
    r"simt|sgemm(?!.*tf32)|dgemm|gemv|gemvx|fp32_?nt|_f32f32_f32f32|"
    r"[sd]cudnn|(?:dgrad|wgrad)(?:2d)?_(?:alg\d|engine)\w*<(?:float|double)\b|gcgemm",
    re.I,
)
# Tensor-core kernels on float32 tensors, in TF32: cuDNN / cuBLAS name the type (`tf32f32`, `_tf32_`),
# CUTLASS's TF32 MMA is `s1688gemm` (m16n8k8; bfloat16's is 16816, named with its `bf16_`/`h` input)
TF32 = re.compile(r"tf32|(?<![a-z0-9])(?:tensorop_)?s1688gemm", re.I)
REDUCED_PRECISION = re.compile(r"bf16|f16|fp16|h\d{3,5}gemm|e4m3|e5m2|int8|i\d{3,5}gemm", re.I)


def is_tf32(name: str) -> bool:
    """A kernel on float32 tensors in TF32 (named so, and not for a 16-bit or 8-bit input)."""
    return bool(TF32.search(name)) and not REDUCED_PRECISION.search(name)


LAUNCH_CALLS = re.compile(
    r"^(cuda|hip)(LaunchKernel|LaunchKernelExC|LaunchCooperativeKernel|GraphLaunch|MemcpyAsync|"
    r"MemsetAsync|Memcpy2DAsync|MemcpyPeerAsync|ExtModuleLaunchKernel|ModuleLaunchKernel)|^cu(LaunchKernel|LaunchKernelEx|GraphLaunch)"
)
SYNC_CALLS = re.compile(
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|Memcpy2D|MemcpyToSymbol|"
    r"MemcpyFromSymbol|Memset)$|^cu(CtxSynchronize|StreamSynchronize|EventSynchronize|MemcpyDtoH|MemcpyHtoD)(_v2)?$"
)
COPY_CALLS = re.compile(r"^(cuda|hip)Memcpy|^cuMemcpy")
ALLOCATOR_CALLS = re.compile(
    r"^(cuda|hip)(Malloc|Free|MallocHost|FreeHost|MallocAsync|FreeAsync)$|^cuMem(Alloc|Free)"
)
_COPY_DIRECTION = re.compile(r"(HtoD|DtoH|DtoD|HtoH|PtoP|Peer)", re.I)
_COPY_KINDS = re.compile(r"\((\w+)\s*->\s*(\w+)\)")

COPY_DIRECTIONS = ("h2d", "d2h", "d2d", "other")


def name_mask(trace: Trace, pattern: re.Pattern[str], rows: np.ndarray) -> np.ndarray:
    """Boolean mask over `trace.names` of the names the pattern matches, valid for the names of `rows`
    (only those are matched: regexes over every Python frame's name would cost more than the rest)."""
    return trace.name_ids_matching(searcher(pattern), trace.name[rows])


_SEARCHERS: dict[re.Pattern[str], Callable[[str], bool]] = {}
# What a pattern may hold to be searched as its lower-case twin: no escape that names a character
# (\x41, \u0041, \N{..}, octal or a back-reference), no inline flag or named group, and no capital
# inside a character class ([A-z] would change meaning once lower-cased).
_NOT_LOWERABLE = re.compile(r"\\[xuUN0-9]|\(\?[^:=!<]|\(\?<[^=!]|\[[^\]]*[A-Z]")


def searcher(pattern: re.Pattern[str]) -> Callable[[str], bool]:
    """Whether `pattern.search` finds the name, the same answer faster, one function per pattern (it
    keys `name_ids_matching`'s memo). IGNORECASE keeps Python's `re` from skipping ahead to where a
    match can start, so such a pattern is searched, in an ASCII name, as its lower-case twin in the
    lower-cased name; any other name, or a pattern it cannot be done for, is searched as it is."""
    found = _SEARCHERS.get(pattern)
    if found is None:
        found = _SEARCHERS[pattern] = _lowered_search(pattern) or (lambda name: bool(pattern.search(name)))
    return found


def _lowered_search(pattern: re.Pattern[str]) -> Callable[[str], bool] | None:
    if not pattern.flags & re.IGNORECASE or _NOT_LOWERABLE.search(pattern.pattern):
        return None
    source = re.sub(
        r"\\.|.",
        lambda m: m.group() if len(m.group()) > 1 else m.group().lower(),
        pattern.pattern,
        flags=re.S,
    )
    twin = re.compile(source, pattern.flags & ~re.IGNORECASE)
    original = pattern.search
    return lambda name: bool(twin.search(name.lower()) if name.isascii() else original(name))


def rows_matching(trace: Trace, rows: np.ndarray, pattern: re.Pattern[str]) -> np.ndarray:
    """The subset of `rows` whose name matches."""
    return rows[name_mask(trace, pattern, rows)[trace.name[rows]]]


def copy_direction(name: str) -> str:
    """'h2d', 'd2h', 'd2d' or 'other' from a Kineto memcpy name such as 'Memcpy HtoD (Pageable -> Device)'."""
    m = _COPY_DIRECTION.search(name)
    if not m:
        return "other"
    return {"htod": "h2d", "dtoh": "d2h", "dtod": "d2d"}.get(m.group(1).lower(), "other")


def copy_directions(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """copy_direction of each memcpy row, as an object array."""
    ids, inverse = np.unique(trace.name[rows], return_inverse=True)
    per_name = np.array([copy_direction(trace.names[i]) for i in ids.tolist()], dtype=object)
    return per_name[inverse] if len(rows) else np.array([], dtype=object)


def copy_memory_kinds(name: str) -> tuple[str, str] | None:
    """('Pageable', 'Device') from 'Memcpy HtoD (Pageable -> Device)'; None if the name has none."""
    m = _COPY_KINDS.search(name)
    return (m.group(1), m.group(2)) if m else None


def is_pageable(name: str) -> bool:
    kinds = copy_memory_kinds(name)
    return kinds is not None and "pageable" in (kinds[0].lower(), kinds[1].lower())


def gpu_activity_label(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """Per GPU row: 'compute', 'communication', 'memcpy_h2d' / _d2h / _d2d / _other, or 'memset'."""
    labels = np.empty(len(rows), dtype=object)
    kinds = trace.kind[rows]
    comm = name_mask(trace, COMMUNICATION, rows)[trace.name[rows]]
    labels[(kinds == Kind.KERNEL) & ~comm] = "compute"
    labels[(kinds == Kind.KERNEL) & comm] = "communication"
    labels[kinds == Kind.MEMSET] = "memset"
    copies = np.flatnonzero(kinds == Kind.MEMCPY)
    if len(copies):
        labels[copies] = "memcpy_" + copy_directions(trace, rows[copies])
    return labels


# Kernel categories, most specific first: a kernel gets the first that matches its name.
KERNEL_CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", COMMUNICATION),
    ("compiled", COMPILED),  # already fused, whatever ops they hold
    ("attention", ATTENTION),
    ("loss", LOSS),
    ("softmax", SOFTMAX),
    ("normalization", NORMALIZATION),
    ("layout", LAYOUT),
    ("convolution", CONVOLUTION),
    ("matmul", MATMUL),
    ("optimizer", OPTIMIZER),
    ("reduction", REDUCTION),
    ("elementwise", ELEMENTWISE),
)


def kernel_category(trace: Trace) -> np.ndarray:
    """Per name id, the kernel category (see KERNEL_CATEGORIES; 'other' if none matches); valid for the
    names of kernels. A kernel whose name says matmul is a convolution where convolution ops launched
    most of its time (`CONVOLUTION_OPS`); unnamed helpers of a convolution (padding, scaling) stay other."""
    memo = trace._memo.get("kernel_category")
    if memo is None:
        kernels = trace.rows(Kind.KERNEL)
        memo = np.full(len(trace.names), "other", dtype=object)
        unset = np.ones(len(trace.names), dtype=bool)
        for label, pattern in KERNEL_CATEGORIES:
            hit = unset & name_mask(trace, pattern, kernels)
            memo[hit] = label
            unset &= ~hit
        memo[_launched_by_convolutions(trace, kernels, memo)] = "convolution"
        trace._memo["kernel_category"] = memo
    return memo


def _launched_by_convolutions(trace: Trace, kernels: np.ndarray, category: np.ndarray) -> np.ndarray:
    """Name ids (a mask over `trace.names`) of matmul kernels that convolution ops launched for at least
    half of their time."""
    out = np.zeros(len(trace.names), dtype=bool)
    open_ = kernels[category[trace.name[kernels]] == "matmul"]
    if not len(open_):
        return out
    ops = op_rows(trace, open_)
    linked = ops >= 0
    conv = np.zeros(len(open_), dtype=bool)
    conv[linked] = name_mask(trace, CONVOLUTION_OPS, ops[linked])[trace.name[ops[linked]]]
    names, dur = trace.name[open_], trace.dur[open_]
    by_conv = np.bincount(names, weights=np.where(conv, dur, 0.0), minlength=len(trace.names))
    total = np.bincount(names, weights=dur, minlength=len(trace.names))
    out[(by_conv > 0) & (by_conv >= 0.5 * total)] = True
    return out


ACTIVITY_LABELS = (
    "compute",
    "communication",
    "memcpy_h2d",
    "memcpy_d2h",
    "memcpy_d2d",
    "memcpy_other",
    "memset",
)
