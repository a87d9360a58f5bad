"""The work of one PyTorch op from its recorded arguments (record_shapes): FLOPs as
`torch.utils.flop_counter` counts them (1 per output element for elementwise ops), the bytes it must move
at least (every input read once, every output written once), and the dtype of its math. An op whose
arguments do not fit its formula gets None: nothing is guessed. The formulas: docs/analysis.md."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpudoctor.trace.model import ATTENTION_OPS, CONVOLUTION_OPS, ELEMENTWISE_OPS, MATMUL_OPS, OpInputs

# Kineto's "Input type" of a tensor -> (dtype name, bytes per element)
DTYPES: dict[str, tuple[str, int]] = {
    "c10::BFloat16": ("bfloat16", 2),
    "c10::Half": ("float16", 2),
    "float": ("float32", 4),
    "double": ("float64", 8),
    "c10::Float8_e4m3fn": ("float8_e4m3fn", 1),
    "c10::Float8_e5m2": ("float8_e5m2", 1),
    "c10::Float8_e4m3fnuz": ("float8_e4m3fnuz", 1),
    "c10::Float8_e5m2fnuz": ("float8_e5m2fnuz", 1),
    "long int": ("int64", 8),
    "int": ("int32", 4),
    "short int": ("int16", 2),
    "signed char": ("int8", 1),
    "unsigned char": ("uint8", 1),
    "bool": ("bool", 1),
    "c10::complex<float>": ("complex64", 8),
    "c10::complex<double>": ("complex128", 16),
}
FAMILIES = ("matmul", "convolution", "attention", "elementwise")


@dataclass(frozen=True)
class OpWork:
    flops: float
    bytes: float
    family: str  # one of FAMILIES
    dtype: str  # of the math (the first tensor input): "bfloat16", "float32", ...


@dataclass(frozen=True)
class _Tensor:
    shape: tuple[int, ...]
    itemsize: int
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


def op_family(name: str) -> str | None:
    for family, names in zip(
        FAMILIES, (MATMUL_OPS, CONVOLUTION_OPS, ATTENTION_OPS, ELEMENTWISE_OPS), strict=True
    ):
        if name in names:
            return family
    return None


def op_work(name: str, inputs: OpInputs) -> OpWork | None:
    """FLOPs, minimum bytes and dtype of op `name` called with `inputs`; None where unknown."""
    family = op_family(name)
    if family is None:
        return None
    tensors = [_tensor(inputs, i) for i in range(len(inputs.dims))]
    try:
        got = _FORMULAS[family](name.removeprefix("aten::"), tensors, inputs.concrete)
    except (ValueError, TypeError, IndexError, ZeroDivisionError, AttributeError):
        return None
    if got is None:
        return None
    flops, nbytes = got
    first = next((t for t in tensors if t is not None), None)
    if first is None or not (flops > 0 and nbytes > 0):
        return None
    return OpWork(float(flops), float(nbytes), family, first.dtype)


def _tensor(inputs: OpInputs, i: int) -> _Tensor | None:
    """Argument i as a tensor, or None (a scalar, a list, None, an unknown dtype)."""
    kind = inputs.types[i] if i < len(inputs.types) else ""
    dims = inputs.dims[i]
    if kind not in DTYPES or not isinstance(dims, tuple):
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        return None
    name, size = DTYPES[kind]
    return _Tensor(dims, size, name)


def _reads(tensors: Sequence[_Tensor | None]) -> int:
    return sum(t.nbytes for t in tensors if t is not None)


Work = tuple[float, float] | None


# ---- matmul ------------------------------------------------------------------------------------
def _matmul(name: str, ts: list[_Tensor | None], concrete: tuple[str, ...]) -> Work:
    if name in ("mm", "bmm"):
        a, b = ts[0], ts[1]
    elif name in ("addmm", "baddbmm"):
        a, b = ts[1], ts[2]
    elif name == "linear":
        x, w = ts[0], ts[1]
        if x is None or w is None or len(w.shape) != 2 or not x.shape or x.shape[-1] != w.shape[1]:
            return None
        rows = math.prod(x.shape[:-1])
        flops = 2 * rows * w.shape[0] * w.shape[1]
        return flops, _reads(ts) + rows * w.shape[0] * x.itemsize
    else:  # matmul
        a, b = ts[0], ts[1]
    if a is None or b is None:
        return None
    batch, m, k, n = _mm_dims(name, a.shape, b.shape)
    return 2 * batch * m * n * k, _reads(ts) + batch * m * n * a.itemsize


def _mm_dims(name: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(batch, M, K, N) of a @ b; raises ValueError where the shapes do not multiply."""
    if name in ("mm", "addmm"):
        if len(a) != 2 or len(b) != 2:
            raise ValueError("mm needs 2-D operands")
    elif name in ("bmm", "baddbmm") and (len(a) != 3 or len(b) != 3 or a[0] != b[0]):
        raise ValueError("bmm needs 3-D operands of one batch")
    if not a or not b:
        raise ValueError("matmul of a scalar")
    a2 = (1, a[0]) if len(a) == 1 else a[-2:]
    b2 = (b[0], 1) if len(b) == 1 else b[-2:]
    if a2[1] != b2[0]:
        raise ValueError("inner dimensions differ")
    batch = math.prod(_broadcast(a[:-2], b[:-2]))
    return batch, a2[0], a2[1], b2[1]


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    out: list[int] = []
    for dims in zip(*(((1,) * (max(map(len, shapes)) - len(s)) + s) for s in shapes), strict=True):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ValueError("shapes do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


# ---- convolution -------------------------------------------------------------------------------
# argument positions: (bias, stride, padding, dilation, transposed, output_padding, groups); -1: none
_CONV_ARGS: dict[str, tuple[int, int, int, int, int, int, int]] = {
    "conv1d": (2, 3, 4, 5, -1, -1, 6),
    "conv2d": (2, 3, 4, 5, -1, -1, 6),
    "conv3d": (2, 3, 4, 5, -1, -1, 6),
    "convolution": (2, 3, 4, 5, 6, 7, 8),
    "_convolution": (2, 3, 4, 5, 6, 7, 8),
    "cudnn_convolution": (-1, 3, 2, 4, -1, -1, 5),
    "cudnn_convolution_transpose": (-1, 4, 2, 5, -2, 3, 6),  # -2: always transposed
}


def _convolution(name: str, ts: list[_Tensor | None], concrete: tuple[str, ...]) -> Work:
    if name == "convolution_backward":
        return _convolution_backward(ts, concrete)
    bias_at, stride_at, pad_at, dil_at, transposed_at, outpad_at, groups_at = _CONV_ARGS[name]
    x, w = ts[0], ts[1]
    if x is None or w is None or len(x.shape) != len(w.shape) or len(x.shape) < 3:
        return None
    spatial = len(x.shape) - 2
    transposed = transposed_at == -2 or (transposed_at >= 0 and _flag(concrete[transposed_at]))
    groups = int(concrete[groups_at])
    k = w.shape[2:]
    stride, dilation = _ints(concrete[stride_at], spatial), _ints(concrete[dil_at], spatial)
    padding = _padding(concrete[pad_at], spatial, k, dilation)
    if padding is None:
        return None
    if transposed:
        out_pad = _ints(concrete[outpad_at], spatial) if outpad_at >= 0 else (0,) * spatial
        out_sp = tuple(
            (i - 1) * s - 2 * p + d * (kk - 1) + op + 1
            for i, s, p, d, kk, op in zip(x.shape[2:], stride, padding, dilation, k, out_pad, strict=True)
        )
        c_out = w.shape[1] * groups
    else:
        out_sp = tuple(
            (i + 2 * p - d * (kk - 1) - 1) // s + 1
            for i, s, p, d, kk in zip(x.shape[2:], stride, padding, dilation, k, strict=True)
        )
        c_out = w.shape[0]
    if min(out_sp) <= 0:
        return None
    flops = _conv_flops(x.shape, w.shape, out_sp, transposed)
    bias = ts[bias_at] if bias_at >= 0 else None
    out_bytes = x.shape[0] * c_out * math.prod(out_sp) * x.itemsize
    return flops, x.nbytes + w.nbytes + (bias.nbytes if bias else 0) + out_bytes


def _conv_flops(x: tuple[int, ...], w: tuple[int, ...], out_sp: tuple[int, ...], transposed: bool) -> int:
    """torch's conv_flop_count: 2 · batch · each output (input, if transposed) position · weight size."""
    return 2 * x[0] * math.prod(x[2:] if transposed else out_sp) * math.prod(w)


def _convolution_backward(ts: list[_Tensor | None], concrete: tuple[str, ...]) -> Work:
    grad_out, x, w = ts[0], ts[1], ts[2]
    if grad_out is None or x is None or w is None or len(concrete) < 11:
        return None
    transposed = _flag(concrete[7])
    mask = [_flag(v) for v in _list(concrete[10])]
    if len(mask) != 3:
        return None
    # the forward's FLOPs, once per gradient computed (torch counts grad_weight of a grouped
    # convolution `groups` times over; this counts each gradient as one forward)
    forward = _conv_flops(x.shape, w.shape, grad_out.shape[2:], transposed)
    flops = forward * (mask[0] + mask[1])
    reads = grad_out.nbytes + (w.nbytes if mask[0] else 0) + (x.nbytes if mask[1] else 0)
    c_out = grad_out.shape[1]
    writes = (
        (x.nbytes if mask[0] else 0) + (w.nbytes if mask[1] else 0) + (c_out * w.itemsize if mask[2] else 0)
    )
    return flops, reads + writes


def _flag(text: str) -> bool:
    if text not in ("True", "False", "1", "0"):
        raise ValueError(f"not a flag: {text!r}")
    return text in ("True", "1")


def _list(text: str) -> list[str]:
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError(f"not a list: {text!r}")
    return [v.strip() for v in text[1:-1].split(",") if v.strip()]


def _ints(text: str, n: int) -> tuple[int, ...]:
    values = [int(v) for v in _list(text)] if text.strip().startswith("[") else [int(text)]
    if len(values) == 1:
        values *= n
    if len(values) != n:
        raise ValueError("wrong number of values")
    return tuple(values)


def _padding(text: str, n: int, k: tuple[int, ...], dilation: tuple[int, ...]) -> tuple[int, ...] | None:
    if text.strip("'\"") == "valid":
        return (0,) * n
    if text.strip("'\"") == "same":  # stride 1 only: output size = input size
        pads = [d * (kk - 1) for kk, d in zip(k, dilation, strict=True)]
        return None if any(p % 2 for p in pads) else tuple(p // 2 for p in pads)
    return _ints(text, n)


# ---- attention ---------------------------------------------------------------------------------
def _attention(name: str, ts: list[_Tensor | None], concrete: tuple[str, ...]) -> Work:
    backward = name.endswith("_backward")
    q, k, v = (ts[1], ts[2], ts[3]) if backward else (ts[0], ts[1], ts[2])
    if q is None or k is None or v is None or not len(q.shape) == len(k.shape) == len(v.shape) == 4:
        return None
    b, h_q, s_q, d_q = q.shape
    b2, h_kv, s_k, d_k = k.shape
    b3, h_v, s_v, d_v = v.shape
    if not (b == b2 == b3 and h_kv == h_v and d_q == d_k and s_k == s_v) or h_kv == 0 or h_q % h_kv:
        return None
    scores = 2 * b * h_q * s_q * s_k * d_q  # q @ kᵀ
    values = 2 * b * h_q * s_q * s_k * d_v  # p @ v
    if not backward:
        return scores + values, _reads(ts) + b * h_q * s_q * d_v * q.itemsize
    # recompute the scores, then grad of p @ v (two matmuls) and of q @ kᵀ (two matmuls)
    flops = scores + 2 * values + 2 * scores
    return flops, _reads(ts) + q.nbytes + k.nbytes + v.nbytes


# ---- elementwise -------------------------------------------------------------------------------
def _elementwise(name: str, ts: list[_Tensor | None], concrete: tuple[str, ...]) -> Work:
    tensors = [t for t in ts if t is not None]
    if not tensors:
        return None
    shape = _broadcast(*(t.shape for t in tensors))
    if name.endswith("_") and tensors[0].shape != shape:
        return None  # an in-place op writes its first argument: it cannot grow
    shaped = [t for t in tensors if t.shape] or tensors
    itemsize = tensors[0].itemsize if name.endswith("_") else max(t.itemsize for t in shaped)
    n = math.prod(shape)
    return n, _reads(ts) + n * itemsize


_FORMULAS: dict[str, Callable[[str, list[_Tensor | None], tuple[str, ...]], Any]] = {
    "matmul": _matmul,
    "convolution": _convolution,
    "attention": _attention,
    "elementwise": _elementwise,
}
