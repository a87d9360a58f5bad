"""Every finding's fix is correct PyTorch for the installed torch: the snippet parses, every `torch.…`
name it uses exists, and every keyword it passes to a torch callable is one that callable accepts."""

from __future__ import annotations

import ast
import importlib
import inspect
from typing import Any

import pytest

from gpudoctor.rules import RULES
from gpudoctor.rules.across import RANK_RULES
from gpudoctor.rules.finding import Fix

torch = pytest.importorskip("torch")


def _fixes(module: Any) -> list[Fix]:
    """Every Fix a rule's module defines (FIX, FIX_*, or a dict of them by cause)."""
    found: list[Fix] = []
    for value in vars(module).values():
        values = value.values() if isinstance(value, dict) else [value]
        found += [v for v in values if isinstance(v, Fix) and v not in found]
    return found


SNIPPETS = {
    f"{rule.__name__}:{i}": fix.snippet
    for rule in (*RULES, *RANK_RULES)
    for i, fix in enumerate(_fixes(importlib.import_module(rule.__module__)))
}


def _aliases(tree: ast.AST) -> dict[str, Any]:
    names: dict[str, Any] = {"torch": torch}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    names[a.asname or a.name.split(".")[0]] = importlib.import_module(
                        a.name if a.asname else "torch"
                    )
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch"):
            module = importlib.import_module(node.module)
            for a in node.names:
                names[a.asname or a.name] = getattr(module, a.name)
    return names


def _resolve(node: ast.expr, names: dict[str, Any]) -> Any:
    """The object a `torch.a.b` chain names; None if the chain is not rooted in torch."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, names)
        if base is None:
            return None
        assert hasattr(base, node.attr), f"{ast.unparse(node)} does not exist in torch {torch.__version__}"
        return getattr(base, node.attr)
    return None


@pytest.mark.parametrize("rule", sorted(SNIPPETS))
def test_fix_snippet_is_valid_pytorch(rule: str) -> None:
    snippet = SNIPPETS[rule]
    tree = ast.parse(snippet)
    names = _aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            _resolve(node, names)
        if isinstance(node, ast.Call):
            target = _resolve(node.func, names)
            if target is None or not callable(target):
                continue
            try:
                params = inspect.signature(target).parameters
            except (TypeError, ValueError):  # a builtin without a signature
                continue
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                continue
            for kw in node.keywords:
                assert kw.arg is None or kw.arg in params, f"{ast.unparse(node.func)}() takes no {kw.arg}="


def test_every_rule_has_a_fix_with_code() -> None:
    assert len(RULES) == 21 and len(RANK_RULES) == 3
    assert {key.split(":")[0] for key in SNIPPETS} == {r.__name__ for r in (*RULES, *RANK_RULES)}
    assert all(len(s.splitlines()) >= 2 for s in SNIPPETS.values())


def test_the_checker_catches_a_wrong_keyword() -> None:
    with pytest.raises(AssertionError, match="takes no fuse"):
        SNIPPETS["_bad"] = "torch.optim.AdamW([], fuse=True)"
        try:
            test_fix_snippet_is_valid_pytorch("_bad")
        finally:
            del SNIPPETS["_bad"]
