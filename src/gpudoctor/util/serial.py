"""Plain-JSON conversion of result dataclasses: dataclasses → dicts, tuples → lists, numpy scalars →
Python numbers, NaN/inf → None (JSON has no NaN); and `Serialized`, the one `to_json`/`from_json` pair
every result dataclass shares: its document's `schema` checked on the way in (a one-line `UsageError`
naming what was expected), the dataclass rebuilt from its type hints."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from enum import Enum
from typing import Any, ClassVar, TypeVar

from gpudoctor.util.errors import UsageError

T = TypeVar("T", bound="Serialized")


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: to_jsonable(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not f.name.startswith("_")
        }
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, float):  # numpy's float64 too
        f = float(obj)
        return f if math.isfinite(f) else None
    if type(obj).__module__ == "numpy":  # numpy is imported by whoever made one: not here, at import
        return _numpy_jsonable(obj)
    return obj


def _numpy_jsonable(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.ndarray):
        return [to_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def from_jsonable(cls: type, data: Any) -> Any:
    """Rebuild a (nested) frozen dataclass from `to_jsonable` output, guided by its type hints."""
    return _build(cls, data)


def _build(tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return value
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        for option in options:
            try:
                return _build(option, value)
            except (TypeError, ValueError, KeyError):
                continue
        raise ValueError(f"{value!r} fits none of {tp}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise TypeError(f"expected an object for {tp.__name__}")
        hints = typing.get_type_hints(tp)
        kwargs = {
            f.name: _build(hints[f.name], value[f.name])
            for f in dataclasses.fields(tp)
            if f.init and not f.name.startswith("_") and f.name in value
        }
        return tp(**kwargs)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in value)
        return tuple(_build(a, v) for a, v in zip(args, value, strict=True))
    if origin is list:
        (arg,) = typing.get_args(tp)
        return [_build(arg, v) for v in value]
    if origin is dict:
        _, val_t = typing.get_args(tp)
        return {k: _build(val_t, v) for k, v in value.items()}
    if tp is float:
        if value is None:
            return math.nan
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"expected a number, got {value!r}")
        return float(value)
    if tp in (int, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise TypeError(f"expected {tp.__name__}, got {value!r}")
        return value
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(value)
    return value


def check_schema(data: Any, schema: str, what: str) -> None:
    """A `UsageError` unless `data` is a JSON object whose `schema` is `schema`; `what` names the
    document in the message ("a gpudoctor run record")."""
    got = data.get("schema") if isinstance(data, dict) else type(data).__name__
    if got != schema:
        raise UsageError(f"not {what} of schema {schema} (got {got!r})")


class Serialized:
    """`to_json`/`from_json` for a frozen dataclass. A subclass whose documents carry a schema names it
    (`json_schema`, and `json_what` for the error message) and has a `schema` field holding it."""

    json_schema: ClassVar[str | None] = None
    json_what: ClassVar[str] = "a gpudoctor document"

    def to_json(self) -> dict[str, Any]:
        return to_jsonable(self)

    @classmethod
    def from_json(cls: type[T], data: dict[str, Any]) -> T:
        if cls.json_schema is not None:
            check_schema(data, cls.json_schema, cls.json_what)
        return from_jsonable(cls, data)
