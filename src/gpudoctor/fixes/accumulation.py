"""Gradient accumulation under DistributedDataParallel written as its users write it: the micro-batches'
forward and backward under `with contextlib.nullcontext() if <last> else model.no_sync():`, where
`<last>` is the loop's own condition for the optimizer step (`if (i + 1) % k == 0: optimizer.step()`, or
`if not last: continue` before it). `no_sync_edits` finds that condition and the statements to wrap from
the lines the script ran: its model's forward, its backward and its optimizer step."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from gpudoctor.fixes.diff import parse_file
from gpudoctor.fixes.edits import Edit

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_PURE_CALLS = frozenset({"len", "int", "bool", "min", "max", "abs"})  # safe to evaluate twice


@dataclass(frozen=True)
class Accumulation:
    """Where the written change goes: the optimizer step's condition, and the statements (first line,
    last line) that run one micro-batch's forward and backward."""

    condition: str
    first_line: int
    end_line: int


def no_sync_edits(file: str, forward: int, backward: int, step: int, model: str) -> tuple[Edit, ...] | str:
    """The edits that put the micro-batches' forward and backward under `model.no_sync()` on all but the
    last micro-batch of each optimizer step; or why they cannot be written."""
    tree = parse_file(file)
    if tree is None:
        return f"{file} cannot be read or parsed"
    found = find_accumulation(tree, forward, backward, step)
    if isinstance(found, str):
        return found
    wrap = f"contextlib.nullcontext() if {found.condition} else {model}.no_sync()"
    return (
        Edit("insert_after_imports", file, code=("import contextlib",)),
        Edit("wrap_block", file, found.first_line, wrap=wrap, end_line=found.end_line),
    )


def find_accumulation(tree: ast.Module, forward: int, backward: int, step: int) -> Accumulation | str:
    loop = _innermost(tree, _LOOPS, (forward, backward, step))
    if loop is None:
        return "the forward, backward and optimizer step are not in one loop"
    condition = _step_condition(loop, forward, backward, step)
    if isinstance(condition, str):
        return condition
    text, names = condition
    late = _assigned_after(loop, names, forward)
    if late:
        return f"the optimizer step's condition reads {', '.join(sorted(late))}, set after the forward"
    block = _block(tree, forward, backward)
    if block is None:
        return "the forward and the backward are not in one block of statements"
    first, last = block
    if first.lineno <= step <= (last.end_lineno or last.lineno):
        return "the optimizer step runs between the forward and the backward"
    return Accumulation(text, first.lineno, last.end_lineno or last.lineno)


def _spans(node: ast.AST, line: int) -> bool:
    return node.lineno <= line <= (node.end_lineno or node.lineno)  # type: ignore[attr-defined]


def _innermost(tree: ast.AST, kinds: tuple[type, ...], lines: tuple[int, ...]) -> ast.AST | None:
    best = None
    for node in ast.walk(tree):
        inside = isinstance(node, kinds) and all(_spans(node, ln) for ln in lines)
        if inside and (best is None or node.lineno >= best.lineno):  # type: ignore[attr-defined]
            best = node
    return best


def _step_condition(loop: ast.AST, forward: int, backward: int, step: int) -> tuple[str, set[str]] | str:
    """The condition under which an iteration ends in the optimizer step, and the names it reads."""
    body: list[ast.stmt] = loop.body  # type: ignore[attr-defined]
    top = next((s for s in body if _spans(s, step)), None)
    if top is None:
        return "the optimizer step is not in the loop's body"
    # `if <cond>: ... optimizer.step()`: the outermost `if` on the way to the step that holds neither the
    # forward nor the backward
    node: ast.AST | None = top
    while node is not None:
        if isinstance(node, ast.If) and not _spans(node, forward) and not _spans(node, backward):
            in_body = any(_spans(s, step) for s in node.body)
            test = node.test if in_body else ast.UnaryOp(ast.Not(), node.test)
            return _condition(test)
        node = next((c for c in _children(node) if _spans(c, step)), None)
    # `if not last: continue` in the loop's body before the step
    for stmt in body:
        if stmt is top:
            break
        if (
            isinstance(stmt, ast.If)
            and stmt.lineno > backward
            and len(stmt.body) == 1
            and isinstance(stmt.body[0], ast.Continue)
            and not stmt.orelse
        ):
            return _condition(ast.UnaryOp(ast.Not(), stmt.test))
    return "the optimizer step runs on every iteration of its loop: no micro-batches to accumulate"


def _children(node: ast.AST) -> list[ast.stmt]:
    return [s for block in _blocks(node) for s in block]


def _condition(test: ast.expr) -> tuple[str, set[str]] | str:
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = test.operand
        if isinstance(inner, ast.UnaryOp) and isinstance(inner.op, ast.Not):
            test = inner.operand  # not not x: x
            continue
        break
    for call in (n for n in ast.walk(test) if isinstance(n, ast.Call)):
        if not (isinstance(call.func, ast.Name) and call.func.id in _PURE_CALLS):
            return (
                f"the optimizer step's condition calls {ast.unparse(call.func)}(), which may not be repeated"
            )
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    text = ast.unparse(test)
    if isinstance(test, (ast.IfExp, ast.Lambda, ast.NamedExpr)):
        text = f"({text})"
    return text, names


def _assigned_after(loop: ast.AST, names: set[str], forward: int) -> set[str]:
    """The names the loop's body assigns in a statement that ends after the forward's line starts: read
    before the forward, they would not yet hold this iteration's value."""
    late: set[str] = set()
    for node in ast.walk(loop):
        if node is loop or not isinstance(node, ast.stmt):
            continue
        if (node.end_lineno or node.lineno) < forward:
            continue
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
            targets = [node.target]
        for t in targets:
            late |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)} & names
    for node in ast.walk(loop):
        if isinstance(node, ast.NamedExpr) and node.target.id in names and node.lineno >= forward:
            late.add(node.target.id)
    return late


def _block(tree: ast.AST, forward: int, backward: int) -> tuple[ast.stmt, ast.stmt] | None:
    """The first and last statements of the innermost block that holds both lines, from the one holding
    the forward to the one holding the backward."""
    best: tuple[ast.stmt, ast.stmt] | None = None
    depth = -1
    for node in ast.walk(tree):
        for block in _blocks(node):
            first = next((s for s in block if _spans(s, forward)), None)
            last = next((s for s in block if _spans(s, backward)), None)
            if first is None or last is None or last.lineno < first.lineno:
                continue
            level = first.col_offset
            if level > depth:
                best, depth = (first, last), level
    return best


def _blocks(node: ast.AST) -> list[list[ast.stmt]]:
    out = [
        getattr(node, n) for n in ("body", "orelse", "finalbody") if isinstance(getattr(node, n, None), list)
    ]
    out += [h.body for h in getattr(node, "handlers", None) or ()]
    return [b for b in out if b and isinstance(b[0], ast.stmt)]
