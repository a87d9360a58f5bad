"""A package's public names imported from their modules the first time they are asked for (PEP 562
`__getattr__`), so that importing the package stays cheap for a command that needs none of them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The `__getattr__` for `package`: `exports` maps a public name to the module that defines it; a name
    once imported is kept in `namespace` (the package's globals)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
