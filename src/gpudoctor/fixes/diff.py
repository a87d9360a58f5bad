"""The permanent change: `Edit`s applied to the user's source text (not to the files), and the unified
diff of each file. Keyword edits on a call come first (they change no line count); then the line edits
(delete, insert, wrap under `with`) from the bottom up. An edit that cannot be placed (the source changed,
the statement shares its line, two edits overlap) is returned with the reason, never dropped silently."""

from __future__ import annotations

import ast
import difflib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from gpudoctor.fixes.edits import Edit

INDENT = "    "


@dataclass(frozen=True)
class DiffResult:
    diff: str  # unified diff of every file changed; empty when nothing could be placed
    unplaced: tuple[tuple[Edit, str], ...]  # edits left out, with why


# -- finding calls and statements ----------------------------------------------------------------------
@lru_cache(maxsize=32)
def _parse_text(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _func_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def calls_named(path: str, name: str) -> list[ast.Call]:
    """Every call in the file to something whose last name is `name`."""
    tree = parse_file(path)
    if tree is None:
        return []
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _func_name(n) == name]


def call_on_line(path: str, line: int, name: str | None) -> ast.Call | None:
    tree = parse_file(path)
    return None if tree is None else _call_at(tree, line, name)


def _call_at(tree: ast.AST, line: int, name: str | None) -> ast.Call | None:
    """The innermost call to `name` (any call if None) whose source spans `line`."""
    found = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and n.lineno <= line <= (n.end_lineno or n.lineno)
        and (name is None or _func_name(n) == name)
    ]
    return max(found, key=lambda n: (n.lineno, -(n.end_lineno or n.lineno)), default=None)


def parse_file(path: str) -> ast.Module | None:
    """The file's syntax tree (None where it cannot be read or parsed); parsed once per text."""
    return _parse_text(_read(path) or "")


def statement_on_line(path: str, line: int) -> ast.stmt | None:
    """The innermost simple (not compound) statement of the file that holds `line`."""
    tree = parse_file(path)
    found = _simple_statement_at(tree, line) if tree is not None else None
    return found[0] if found else None


def _statements(tree: ast.AST) -> Iterable[tuple[ast.stmt, list[ast.AST]]]:
    """Every statement with its enclosing scopes (module, functions), outermost first."""

    def walk(node: ast.AST, scopes: list[ast.AST]) -> Iterable[tuple[ast.stmt, list[ast.AST]]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                yield child, scopes
            inner = [*scopes, child] if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else scopes
            yield from walk(child, inner)

    yield from walk(tree, [tree])


def _simple_statement_at(tree: ast.AST, line: int) -> tuple[ast.stmt, list[ast.AST]] | None:
    """The innermost statement that holds `line` and is not compound (no body of its own)."""
    best = None
    for stmt, scopes in _statements(tree):
        if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno) and not hasattr(stmt, "body"):
            best = (stmt, scopes)
    return best


# -- keyword edits -------------------------------------------------------------------------------------
def _offsets(text: str) -> list[int]:
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _pos(text: str, starts: list[int], line: int, col_bytes: int) -> int:
    """Character offset of an AST position (its column counts UTF-8 bytes)."""
    begin = starts[line - 1]
    line_text = text[begin : starts[line]] if line < len(starts) else text[begin:]
    return begin + len(line_text.encode("utf-8")[:col_bytes].decode("utf-8", errors="ignore"))


def _keyword_changes(
    text: str, call: ast.Call, kwargs: dict[str, str], drop: Sequence[str]
) -> list[tuple[int, int, str]]:
    starts = _offsets(text)
    changes: list[tuple[int, int, str]] = []
    present = {k.arg: k for k in call.keywords if k.arg}
    items: list[ast.AST] = [*call.args, *call.keywords]
    for name, value in kwargs.items():
        kw = present.get(name)
        if kw is not None:
            v = kw.value
            changes.append(
                (
                    _pos(text, starts, v.lineno, v.col_offset),
                    _pos(text, starts, v.end_lineno or v.lineno, v.end_col_offset or 0),
                    value,
                )
            )
    for name in drop:
        kw = present.get(name)
        if kw is None or name in kwargs:
            continue
        i = items.index(kw)
        start = (
            _pos(text, starts, items[i - 1].end_lineno or 0, items[i - 1].end_col_offset or 0)
            if i > 0
            else _pos(text, starts, kw.lineno, kw.col_offset)
        )
        end = _pos(text, starts, kw.value.end_lineno or 0, kw.value.end_col_offset or 0)
        if i == 0 and len(items) > 1:  # first of several: take the comma after it instead
            end = _pos(text, starts, items[1].lineno, items[1].col_offset)
        changes.append((start, end, ""))
    added = [f"{k}={v}" for k, v in kwargs.items() if k not in present]
    if added:
        kept = [
            a for a in items if not (isinstance(a, ast.keyword) and a.arg in drop and a.arg not in kwargs)
        ]
        if kept:
            last = kept[-1]
            end_node = last.value if isinstance(last, ast.keyword) else last
            at = _pos(text, starts, end_node.end_lineno or 0, end_node.end_col_offset or 0)
            lines = [a.lineno for a in kept]
            if lines[-1] > call.lineno and len(set(lines)) == len(lines):  # one argument a line: the same
                first = text[starts[lines[-1] - 1] :].split("\n", 1)[0]
                indent = first[: len(first) - len(first.lstrip())]
                close = _pos(text, starts, call.end_lineno or 0, call.end_col_offset or 0) - 1
                if text[at:close].lstrip().startswith(","):  # after its trailing comma
                    comma = text.index(",", at) + 1
                    changes.append((comma, comma, "".join(f"\n{indent}{a}," for a in added)))
                else:
                    changes.append((at, at, "".join(f",\n{indent}{a}" for a in added)))
            else:
                changes.append((at, at, ", " + ", ".join(added)))
        else:
            close = _pos(text, starts, call.end_lineno or 0, call.end_col_offset or 0) - 1
            changes.append((close, close, ", ".join(added)))
    return changes


def _apply_keyword_edits(text: str, edits: list[Edit], unplaced: list[tuple[Edit, str]]) -> str:
    tree = _parse_text(text)
    changes: list[tuple[int, int, str]] = []
    merged: dict[tuple[int, str], tuple[dict[str, str], list[str], list[Edit]]] = {}
    for e in edits:
        kwargs, drop, members = merged.setdefault((e.line, e.call), ({}, [], []))
        kwargs.update(e.kwargs)
        drop.extend(d for d in e.drop if d not in drop)
        members.append(e)
    for (line, name), (kwargs, drop, members) in merged.items():
        call = _call_at(tree, line, name) if tree is not None else None
        if call is None:
            unplaced.extend((e, f"no call to {name} on line {line}") for e in members)
            continue
        changes.extend(_keyword_changes(text, call, kwargs, drop))
    for start, end, new in sorted(changes, key=lambda c: (c[0], c[1]), reverse=True):
        text = text[:start] + new + text[end:]
    return text


# -- line edits ----------------------------------------------------------------------------------------
def _line_change(tree: ast.Module, lines: list[str], e: Edit) -> tuple[int, int, list[str]] | str:
    """(first line, last line + 1, replacement lines) in 0-based line numbers, or why it cannot be placed."""
    if e.op == "insert_after_imports":
        body = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
        present = {ast.unparse(s) for s in body}
        code = [c for c in e.code if c not in present]
        if any("torch" in c for c in code) and not _imports_torch(tree):
            code.insert(0, "import torch")
        at = body[-1].end_lineno or 0 if body else _after_docstring(tree)
        return at, at, [c + "\n" for c in code]
    if e.op == "wrap_block":
        return _wrapped_block(tree, lines, e)
    if e.op == "after_definition":
        return _after_definition(tree, e)
    found = _simple_statement_at(tree, e.line)
    if found is None:
        return f"no statement on line {e.line}"
    stmt, scopes = found
    first, last = stmt.lineno - 1, stmt.end_lineno or stmt.lineno
    indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
    alone = len(indent) == stmt.col_offset and all(
        s is stmt or not (s.lineno <= last and (s.end_lineno or s.lineno) >= first + 1)
        for s, _ in _statements(tree)
        if not hasattr(s, "body")
    )
    if e.op in ("delete_statement", "wrap_statement", "before_statement") and not alone:
        return f"line {e.line} holds more than one statement"
    if e.op == "delete_statement":
        return first, last, [f"{indent}pass\n"] if _only_statement(tree, stmt) else []
    if e.op == "wrap_statement":
        last = max(last, e.end_line)  # statements joined under one `with` (`_joined_wraps`)
        body = [INDENT + ln if ln.strip() else ln for ln in lines[first:last]]
        after = [f"{indent}{c}\n" for c in e.code]  # what `_targets_resolved` kept: after the block
        return first, last, [f"{indent}with {e.wrap}:\n", *body, *after]
    if e.op == "before_statement":
        return first, first, [f"{indent}{c}\n" for c in e.code]
    if e.op == "after_assignment":
        target = _last_assignment(scopes[-1], e.name, e.line)
        if target is None:
            return f"no assignment to {e.name} before line {e.line}"
        t_first = target.lineno - 1
        t_indent = lines[t_first][: len(lines[t_first]) - len(lines[t_first].lstrip())]
        at = target.end_lineno or target.lineno
        code = [c.replace("{name}", e.name) for c in e.code]
        if any("torch." in c for c in code) and not _imports_torch(tree):
            code.insert(
                0, "import torch"
            )  # `X.forward = torch.compile(X.forward)` in a file of `from torch ...`
        return at, at, [t_indent + c + "\n" for c in code]
    return f"unknown edit {e.op!r}"


def _after_definition(tree: ast.Module, e: Edit) -> tuple[int, int, list[str]] | str:
    """`e.code` after the top-level `def e.name` whose decorators or `def` start on `e.line`."""
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == e.name:
            first = min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)])
            if first <= e.line <= stmt.lineno:
                at = stmt.end_lineno or stmt.lineno
                code = [c.replace("{name}", e.name) for c in e.code]
                if any("torch." in c for c in code) and not _imports_torch(tree):
                    code.insert(0, "import torch")
                return at, at, [c + "\n" for c in code]
    return f"no top-level function {e.name} defined on line {e.line}"


def _wrapped_block(tree: ast.Module, lines: list[str], e: Edit) -> tuple[int, int, list[str]] | str:
    """The statements of one block from the one starting on `e.line` to the one ending on `e.end_line`,
    compound ones too, under `with e.wrap:`."""
    bodies = _bodies(tree)
    start = next((s for s, _ in _statements(tree) if s.lineno == e.line), None)
    where = bodies.get(id(start)) if start is not None else None
    if start is None or where is None:
        return f"no statement starts on line {e.line}"
    body, i = where
    j = next((k for k in range(i, len(body)) if (body[k].end_lineno or body[k].lineno) == e.end_line), None)
    if j is None:
        return f"no statement of the block from line {e.line} ends on line {e.end_line}"
    first, last = start.lineno - 1, e.end_line
    indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
    if len(indent) != start.col_offset:
        return f"line {e.line} holds more than one statement"
    block = [INDENT + ln if ln.strip() else ln for ln in lines[first:last]]
    return first, last, [f"{indent}with {e.wrap}:\n", *block]


def _imports_torch(tree: ast.Module) -> bool:
    """The file binds `torch` at its top level (`import torch`)."""
    return any(
        isinstance(s, ast.Import) and any(a.name == "torch" and a.asname is None for a in s.names)
        for s in tree.body
    )


def _calls_module(stmt: ast.stmt | None, name: str) -> bool:
    """`stmt` is a call of `name` itself, its result assigned or not, methods on it allowed
    (`out = netD(x).view(-1)`), not a call that takes it (`loss = criterion(netD(x), y)`)."""
    value = stmt.value if isinstance(stmt, (ast.Assign, ast.Expr)) else None
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        value = value.func.value
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == name


def _targets_resolved(tree: ast.Module, edits: list[Edit]) -> list[Edit]:
    """Each `wrap_statement` edit's lines after its block with "{target}" replaced by the one name its
    statement assigns (`out = model(x)`); where it assigns no single name, those lines are dropped. An
    edit that names its `call` is dropped where its statement is not a call of that module itself."""
    out = []
    for e in edits:
        if e.op != "wrap_statement" or not (e.call or e.code):
            out.append(e)
            continue
        found = _simple_statement_at(tree, e.line)
        stmt = found[0] if found else None
        if e.call and not _calls_module(stmt, e.call):
            continue
        if e.code:
            name = (
                stmt.targets[0].id
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                else None
            )  # fmt: skip
            e = replace(e, code=tuple(c.replace("{target}", name) for c in e.code) if name else ())
        out.append(e)
    return out


def _joined_wraps(tree: ast.Module, lines: list[str], edits: list[Edit]) -> list[Edit]:
    """`edits` with the statements that several `wrap_statement` edits put under the same `with` joined
    into one block where they follow one another in the same body (an encoder's call and then a head's:
    one `with torch.autocast(...)` around both, as one writes it by hand); `end_line` marks the last."""
    wraps = [e for e in edits if e.op == "wrap_statement"]
    if len(wraps) < 2:
        return edits
    bodies = _bodies(tree)
    out, joined = [e for e in edits if e.op != "wrap_statement"], set()
    for e in wraps:
        if id(e) in joined:
            continue
        found = _simple_statement_at(tree, e.line)
        where = bodies.get(id(found[0])) if found else None
        if where is None:
            out.append(e)
            continue
        body, i = where
        last, code = i, e.code
        while last + 1 < len(body):
            nxt = body[last + 1]
            partner = next(
                (w for w in wraps if id(w) not in joined and w is not e and w.wrap == e.wrap
                 and nxt.lineno <= w.line <= (nxt.end_lineno or nxt.lineno) and not hasattr(nxt, "body")),
                None,
            )  # fmt: skip
            if partner is None:
                break
            joined.add(id(partner))
            code += partner.code
            last += 1
        end = body[last].end_lineno or body[last].lineno
        out.append(
            e if last == i else replace(e, line=body[i].lineno, end_line=end, code=tuple(dict.fromkeys(code)))
        )
    return out


def _bodies(tree: ast.AST) -> dict[int, tuple[list[ast.stmt], int]]:
    """Each statement's body (the list it is in) and its index there, by the statement's id."""
    out: dict[int, tuple[list[ast.stmt], int]] = {}
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list):
                for i, stmt in enumerate(block):
                    if isinstance(stmt, ast.stmt):
                        out[id(stmt)] = (block, i)
    return out


def _only_statement(tree: ast.AST, stmt: ast.stmt) -> bool:
    """`stmt` is all of a block: deleting it would leave the block empty."""
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block == [stmt]:
                return True
    return False


def _after_docstring(tree: ast.Module) -> int:
    first = tree.body[0] if tree.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first.end_lineno or 0
    return 0


def _binds(target: ast.AST | None, name: str) -> bool:
    """An assignment's target binds `name`: the name itself, or an element of what it unpacks into
    (`netG, netD = Generator(), Discriminator()`, `*rest`)."""
    if isinstance(target, ast.Name):
        return target.id == name
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_binds(e, name) for e in target.elts)
    return isinstance(target, ast.Starred) and _binds(target.value, name)


def _last_assignment(scope: ast.AST, name: str, before: int) -> ast.stmt | None:
    """The last assignment to `name` in `scope` before line `before`, preferring one that always runs on
    the way there: not in a branch or block that `before` lies outside (`if args.expert: model = ...`)."""
    found: list[tuple[ast.stmt, bool]] = []

    def walk(body: list[ast.stmt], on_path: bool) -> None:
        for stmt in body:
            if stmt.lineno >= before:
                break
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and any(_binds(t, name) for t in targets):
                found.append((stmt, on_path))
            blocks = [getattr(stmt, b, None) for b in ("body", "orelse", "finalbody")]
            blocks += [h.body for h in getattr(stmt, "handlers", None) or ()]
            blocks += [c.body for c in getattr(stmt, "cases", None) or ()]
            for block in blocks:
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    spans = block[0].lineno <= before <= (block[-1].end_lineno or block[-1].lineno)
                    walk(block, on_path and spans)

    walk(getattr(scope, "body", []), True)
    pick = [s for s, on_path in found if on_path] or [s for s, _ in found]
    return max(pick, key=lambda s: s.lineno) if pick else None


def _apply_line_edits(text: str, edits: list[Edit], unplaced: list[tuple[Edit, str]]) -> str:
    tree = _parse_text(text)
    if tree is None:
        unplaced.extend((e, "the file does not parse") for e in edits)
        return text
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    planned: list[tuple[int, int, list[str], Edit]] = []
    for e in _joined_wraps(tree, lines, _targets_resolved(tree, edits)):
        change = _line_change(tree, lines, e)
        if isinstance(change, str):
            unplaced.append((e, change))
            continue
        start, end, new = change
        if any(start < p_end and p_start < end for p_start, p_end, _, _ in planned):
            unplaced.append((e, "it overlaps another change to the same lines"))
            continue
        if any((p_start, p_end, p_new) == (start, end, new) for p_start, p_end, p_new, _ in planned):
            continue  # the same change twice (two fixes insert the same line)
        planned.append((start, end, new, e))
    # bottom up; at one position a replacement goes before the insertions, insertions in reverse order
    order = sorted(
        range(len(planned)), key=lambda i: (planned[i][0], planned[i][1] > planned[i][0], i), reverse=True
    )
    for i in order:
        start, end, new, _ = planned[i]
        lines[start:end] = new
    return "".join(lines)


def apply_edits(text: str, edits: Sequence[Edit]) -> tuple[str, list[tuple[Edit, str]]]:
    """The text with every edit placed, and those that could not be, with why."""
    unplaced: list[tuple[Edit, str]] = []
    keyword = [e for e in edits if e.op == "set_kwargs"]
    other = [e for e in edits if e.op != "set_kwargs"]
    text = _apply_keyword_edits(text, keyword, unplaced)
    if _parse_text(text) is None and keyword:
        unplaced.extend((e, "the keyword change would not parse") for e in keyword)
        return text, unplaced
    return _apply_line_edits(text, other, unplaced), unplaced


def unified_diff(edits: Sequence[Edit]) -> DiffResult:
    """The unified diff of every file the edits touch, against the files as they are now."""
    parts: list[str] = []
    unplaced: list[tuple[Edit, str]] = []
    for path in dict.fromkeys(e.file for e in edits):
        original = _read(path)
        mine = [e for e in edits if e.file == path]
        if original is None:
            unplaced.extend((e, f"{path} cannot be read") for e in mine)
            continue
        new, left = apply_edits(original, mine)
        unplaced.extend(left)
        name = _display(path)
        parts.extend(
            difflib.unified_diff(
                original.splitlines(keepends=True),
                new.splitlines(keepends=True),
                f"a/{name.lstrip('/')}",
                f"b/{name.lstrip('/')}",
            )
        )
    return DiffResult("".join(p if p.endswith("\n") else p + "\n" for p in parts), tuple(unplaced))


def _display(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel
