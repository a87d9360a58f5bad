"""The fields of a Kineto event that gpudoctor reads, as msgspec structs: decoding straight into them skips
every other key without building it, and `record_shapes`' arguments stay raw JSON until the loader
interns them. A chunk with values of unexpected types (a damaged or foreign trace) is decoded again as
plain JSON and repaired event by event: a bad `args` dropped, a bad event skipped, both counted."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from gpudoctor.trace.jsonstream import MAX_DEPTH, shallow

_NAN = math.nan
NO_RAW = msgspec.Raw()
# record_shapes args of cpu ops, kept as raw JSON (a Raw is a view of the decoded buffer: copy it out)
RAW_ARGS = {"Input Dims": "input_dims", "Input type": "input_types", "Concrete Inputs": "concrete_inputs"}


class Args(msgspec.Struct, frozen=True, gc=False):
    correlation: int | None = -1
    external_id: int | None = msgspec.field(name="External id", default=-1)
    # PyTorch <= 1.9 wrote the CPU op's id on runtime calls and GPU activity in lower case
    external_id_older: int | None = msgspec.field(name="external id", default=-1)
    device: int | None = -1
    stream: int | None = -1
    bytes: int | None = -1
    grid: list[int] | None = None
    block: list[int] | None = None
    registers: int | None = msgspec.field(name="registers per thread", default=-1)
    shared_memory: int | None = msgspec.field(name="shared memory", default=-1)
    occupancy: float | None = msgspec.field(name="est. achieved occupancy %", default=_NAN)
    blocks_per_sm: float | None = msgspec.field(name="blocks per SM", default=_NAN)
    warps_per_sm: float | None = msgspec.field(name="warps per SM", default=_NAN)
    python_id: int | None = msgspec.field(name="Python id", default=-1)
    python_parent_id: int | None = msgspec.field(name="Python parent id", default=-1)
    flops: float | None = _NAN
    # autograd: a forward op and the backward op of its graph node share a sequence number; the backward
    # op's "Fwd thread id" names the forward's thread (a forward op's is 0)
    sequence: int | None = msgspec.field(name="Sequence number", default=-1)
    fwd_thread: int | None = msgspec.field(name="Fwd thread id", default=-1)
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=NO_RAW)
    input_types: msgspec.Raw = msgspec.field(name="Input type", default=NO_RAW)
    concrete_inputs: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=NO_RAW)
    # record_param_comms (torch.distributed's record of a collective call)
    collective: str | None = msgspec.field(name="Collective name", default=None)
    in_nelems: int | None = msgspec.field(name="In msg nelems", default=-1)
    out_nelems: int | None = msgspec.field(name="Out msg nelems", default=-1)
    group_size: int | None = msgspec.field(name="Group size", default=-1)
    dtype: str | None = None
    group: str | None = msgspec.field(name="Process Group Name", default=None)
    # [memory] instant events
    alloc_bytes: int | None = msgspec.field(name="Bytes", default=0)
    total_allocated: int | None = msgspec.field(name="Total Allocated", default=-1)
    total_reserved: int | None = msgspec.field(name="Total Reserved", default=-1)
    device_type: int | None = msgspec.field(name="Device Type", default=-1)
    device_id: int | None = msgspec.field(name="Device Id", default=-1)
    # metadata events (thread_name, process_name)
    name: str | None = None


class Event(msgspec.Struct, frozen=True, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = 0.0
    args: Args | None = None


NO_ARGS = Args()
_typed = msgspec.json.Decoder(list[Event])
_untyped = msgspec.json.Decoder()


class Repairs:
    """Counts of what `decode_events` had to repair, by reason."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1


def decoder(repairs: Repairs) -> Any:
    """A chunk decoder for `jsonstream.read_trace_json` that records its repairs in `repairs`."""

    def decode(data: bytes) -> list[Event]:
        try:
            return _typed.decode(data)
        except RecursionError:  # msgspec recurses even to skip a value it does not keep
            return flattened(data)
        except msgspec.ValidationError:
            try:
                raw = _untyped.decode(data)  # a syntax error propagates to the stream reader
            except RecursionError:
                return flattened(data)
            return [e for item in raw if (e := _repair(item, repairs)) is not None]

    def flattened(data: bytes) -> list[Event]:
        repairs.add(f"values nested deeper than {MAX_DEPTH} levels (read as null)")
        return decode(shallow(data))

    return decode


def _repair(item: Any, repairs: Repairs) -> Event | None:
    if not isinstance(item, dict):
        repairs.add("not an event object")
        return None
    args = item.get("args")
    if isinstance(args, dict) and not RAW_ARGS.keys().isdisjoint(args):
        item = {**item, "args": {k: _raw(k, v) for k, v in args.items()}}
    try:
        return msgspec.convert(item, Event)
    except msgspec.ValidationError:
        pass
    if isinstance(args, dict):
        clean = {k: _raw(k, v) for k, v in args.items() if _arg_ok(k, v)}
        try:
            event = msgspec.convert({**item, "args": clean}, Event)
            repairs.add("event args of unexpected types (those args dropped)")
            return event
        except msgspec.ValidationError:
            pass
    repairs.add("malformed event (skipped)")
    return None


def _raw(key: str, value: Any) -> Any:
    return msgspec.Raw(msgspec.json.encode(value)) if key in RAW_ARGS else value


def _arg_ok(key: str, value: Any) -> bool:
    try:
        msgspec.convert({key: _raw(key, value)}, Args)
        return True
    except msgspec.ValidationError:
        return False
