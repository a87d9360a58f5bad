"""Which line of a script keeps what another line allocated: `keeping_line(source, line)`. A leak's
allocations are recorded where they are made (`out = model(x)`); what makes them outlive the step is
usually a later line that stores the result (`outputs.append(out)`). Pure: the script's text in, a line
number out."""

from __future__ import annotations

import ast

# Methods that put a value into a container that outlives the loop's iteration.
STORING_METHODS = frozenset(
    {"append", "extend", "add", "insert", "appendleft", "put", "update", "setdefault"}
)


def keeping_line(source: str, line: int) -> int | None:
    """The first line after `line` in the same function (or module) that stores a name assigned at
    `line` into a container — `xs.append(name)`, `xs += [name]`, `d[k] = name` — or `line` itself when
    it stores what it allocates (`xs.append(model(x))`); None where no such line is found."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    at = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and n.lineno == line]
    if not at:
        return None
    stmt = at[-1]  # the innermost statement on that line
    if _stores(stmt, None):
        return line
    names = _assigned(stmt)
    if not names:
        return None
    scope = _scope_of(tree, stmt)
    later = sorted(
        (n for n in ast.walk(scope) if isinstance(n, ast.stmt) and n.lineno > line),
        key=lambda n: n.lineno,
    )
    return next((n.lineno for n in later if _stores(n, names)), None)


def _assigned(stmt: ast.stmt) -> set[str]:
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = [stmt.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _mentions(node: ast.AST, names: set[str] | None) -> bool:
    """Whether `node` uses one of `names` (any call's result where names is None: a fresh allocation)."""
    if names is None:
        return any(isinstance(n, ast.Call) for n in ast.walk(node))
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _stores(stmt: ast.stmt, names: set[str] | None) -> bool:
    """Whether the statement itself (not a nested block) stores a value using `names` in a container."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        if isinstance(call.func, ast.Attribute) and call.func.attr in STORING_METHODS:
            return any(_mentions(a, names) for a in [*call.args, *(k.value for k in call.keywords)])
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add):
        return isinstance(stmt.value, (ast.List, ast.Tuple)) and _mentions(stmt.value, names)
    if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Subscript) for t in stmt.targets):
        return _mentions(stmt.value, names)
    return False


def _scope_of(tree: ast.Module, stmt: ast.stmt) -> ast.AST:
    """The innermost function (or the module) that holds `stmt`."""
    functions = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(m is stmt for m in ast.walk(n))
    ]
    return max(functions, key=lambda n: n.lineno) if functions else tree
