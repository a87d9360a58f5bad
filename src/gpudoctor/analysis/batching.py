"""Whether the traced work has a batch dimension that could grow: `batch_evidence(trace)` names what in
the trace shows one — a DataLoader (batches), an optimizer step (a training loop over batches), module
calls (a model called on inputs), convolutions or attention (their inputs lead with a batch dimension),
or recorded input shapes of three or more dimensions. A loop of plain tensor ops shows none: there is no
batch to make larger, whatever its kernels' size."""

from __future__ import annotations

import numpy as np

from gpudoctor.analysis import classify
from gpudoctor.analysis.cpu import DATALOADER, OPTIMIZER_STEP
from gpudoctor.trace.iterations import module_rows
from gpudoctor.trace.model import ATTENTION_OPS, CONVOLUTION_OPS, Kind, Trace

_BATCHED_OPS = CONVOLUTION_OPS | ATTENTION_OPS | {"aten::bmm", "aten::baddbmm"}


def batch_evidence(trace: Trace) -> tuple[str, ...]:
    """What shows a batch dimension, in words; empty where nothing does."""
    found = []
    cpu = trace.rows(Kind.USER_ANNOTATION, Kind.CPU_OP)
    if len(classify.rows_matching(trace, cpu, DATALOADER)):
        found.append("a DataLoader")
    if len(classify.rows_matching(trace, cpu, OPTIMIZER_STEP)):
        found.append("an optimizer step")
    if len(module_rows(trace)[0]):
        found.append("nn.Module calls")
    ops = trace.rows(Kind.CPU_OP)
    if len(ops) and trace.name_ids_matching(_batched_op, trace.name[ops])[trace.name[ops]].any():
        found.append("convolutions or attention")
    if _shapes_of_rank_three(trace):
        found.append("inputs of 3 or more dimensions")
    return tuple(found)


def _batched_op(name: str) -> bool:
    return name in _BATCHED_OPS or name.startswith("aten::conv") or "scaled_dot_product" in name


def _shapes_of_rank_three(trace: Trace) -> bool:
    """A recorded argument (record_shapes) of 3 or more dimensions: a batch of matrices or images."""
    used = np.unique(trace.inputs[trace.inputs >= 0])
    for i in used.tolist():
        dims = trace.op_inputs[i].dims
        if dims and isinstance(dims[0], tuple) and len(dims[0]) >= 3:
            return True
    return False
