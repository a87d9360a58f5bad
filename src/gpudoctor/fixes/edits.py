"""`Edit`: one change to a line of the user's source that makes a fix permanent — set keywords of a call
(`DataLoader(..., num_workers=8)`), delete a statement (`torch.cuda.empty_cache()`), insert lines after the
imports or after the assignment of a name (`model = torch.compile(model)`), put a statement under a `with`
(`torch.autocast`) or several of one block (`model.no_sync()`), insert lines before a statement. Patches record edits where the call site is known;
`fixes.diff` applies them. Plain data, serializable."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OPS = (
    "set_kwargs",  # the call to `call` on `line`: set `kwargs`, remove `drop`
    "delete_statement",  # the statement on `line` (a call to `call`)
    "insert_after_imports",  # `code` after the last top-level import of `file`
    "after_assignment",  # `code` after the last assignment to `name` before `line`, in its scope
    "after_definition",  # `code` after the top-level `def name` starting on `line` (or its decorators)
    "wrap_statement",  # the statement on `line` under `with <wrap>:`
    "wrap_block",  # the statements of one block from the one starting on `line` to `end_line`, under `with`
    "before_statement",  # `code` before the statement on `line`
)


@dataclass(frozen=True)
class Edit:
    op: str
    file: str
    line: int = 0
    call: str = ""
    kwargs: dict[str, str] = field(default_factory=dict)  # keyword -> source text of its value
    drop: tuple[str, ...] = ()
    # lines, unindented; "{name}" stands for `name`; wrap_statement: lines after the block, "{target}" the
    # one name its statement assigns (dropped where it assigns none)
    code: tuple[str, ...] = ()
    name: str = ""
    wrap: str = ""
    end_line: int = 0  # wrap_statement: the last line of the statements joined under one `with`

    def __hash__(self) -> int:
        return hash(
            (
                self.op,
                self.file,
                self.line,
                self.call,
                tuple(sorted(self.kwargs.items())),
                self.drop,
                self.code,
                self.name,
                self.wrap,
                self.end_line,
            )
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "file": self.file,
            "line": self.line,
            "call": self.call,
            "kwargs": dict(self.kwargs),
            "drop": list(self.drop),
            "code": list(self.code),
            "name": self.name,
            "wrap": self.wrap,
            "end_line": self.end_line,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Edit:
        return cls(
            op=str(data["op"]),
            file=str(data["file"]),
            line=int(data.get("line") or 0),
            call=str(data.get("call") or ""),
            kwargs={str(k): str(v) for k, v in (data.get("kwargs") or {}).items()},
            drop=tuple(data.get("drop") or ()),
            code=tuple(data.get("code") or ()),
            name=str(data.get("name") or ""),
            wrap=str(data.get("wrap") or ""),
            end_line=int(data.get("end_line") or 0),
        )
