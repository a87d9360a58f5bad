"""Short display names for demangled C++ kernel names, which run to thousands of characters: drop
the parameter list, namespaces, lambda plumbing, nested template arguments and plumbing arguments
(pointer arrays, index calculators), keeping the functor that names the work; then cut to length."""

from __future__ import annotations

import re

_NAMESPACE = re.compile(r"\(anonymous namespace\)::|\b[A-Za-z_]\w*::(?!\{|operator)")
# `f(args)::{lambda()#1}::operator()() const::{lambda(float)#1}` → `f`: the functor's home is the name.
_LAMBDA_TAIL = re.compile(
    r"(?:::operator\(\))?(?:\([^()]*\))?(?:\s*const)?(?:::(?:\{lambda\([^()]*\)#\d+\}|operator\(\)\(\)(?:\s*const)?))+"
)
_SPACES_BEFORE_CLOSE = re.compile(r"\s+>")
# Generic wrappers whose first specific argument names the work (`BinaryFunctor<…, threshold_kernel_impl>`).
_WRAPPER = re.compile(
    r"\b(BinaryFunctor|AUnaryFunctor|BUnaryFunctor|ReduceOp|func_wrapper_t|gpu_kernel_impl(?:_nocast)?)<"
)
_SCALAR_TYPES = {
    "float",
    "double",
    "int",
    "long",
    "unsigned",
    "bool",
    "char",
    "short",
    "BFloat16",
    "Half",
    "__half",
    "__nv_bfloat16",
    "complex",
    "Float8_e4m3fn",
    "Float8_e5m2",
}
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_UNINFORMATIVE_ARG = re.compile(
    r"^(array|TensorListMetadata|TensorListScalarListMetadata|"
    r"TrivialOffsetCalculator|OffsetCalculator|LoadWithCast|StoreWithCast|LoadWithoutCast|StoreWithoutCast)$"
)


def short_kernel_name(name: str, max_len: int = 64) -> str:
    """A readable name of at most `max_len` characters; names that are not C++ pass through (cut)."""
    s = name.strip()
    s = s.removeprefix("void ")
    s = _drop_parameter_list(s)
    s = _NAMESPACE.sub("", s)
    s = _LAMBDA_TAIL.sub("", s)
    s = _SPACES_BEFORE_CLOSE.sub(">", s)
    s = _unwrap_generic_functors(s)
    s = _drop_uninformative_args(_drop_nested_templates(s))
    return s if len(s) <= max_len else s[: max_len - 1] + "…"


def _drop_parameter_list(s: str) -> str:
    """Remove the trailing balanced `(...)` of a function signature; keep the string if unbalanced."""
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:  # a signature's `(` follows the name directly: `k<T>(…)`, not `Memcpy (…)`
                return s[:i] if i > 0 and not s[i - 1].isspace() else s
    return s


def _unwrap_generic_functors(s: str) -> str:
    """`ReduceOp<float, func_wrapper_t<float, sum_functor<float>>, int>` → `sum_functor`."""
    for _ in range(20):  # each pass replaces one wrapper; names nest only a few deep
        m = _WRAPPER.search(s)
        if m is None:
            return s
        end = _matching_close(s, m.end() - 1)
        if end < 0:
            return s
        inner = s[m.end() : end]
        specific = [
            w for w in _IDENTIFIER.findall(inner) if w not in _SCALAR_TYPES and not _WRAPPER.match(w + "<")
        ]
        s = s[: m.start()] + (specific[0] if specific else m.group(1)) + s[end + 1 :]
    return s


def _matching_close(s: str, open_at: int) -> int:
    level = 0
    for i in range(open_at, len(s)):
        if s[i] == "<":
            level += 1
        elif s[i] == ">":
            level -= 1
            if level == 0:
                return i
    return -1


def _drop_nested_templates(s: str) -> str:
    """`f<A<x>, B<y<z>>>` → `f<A, B>`: keep only the outermost template arguments."""
    out: list[str] = []
    level = 0
    for ch in s:
        if ch == "<":
            level += 1
        elif ch == ">" and level > 0:
            level -= 1
            if level == 1:
                continue
        if level <= 1:
            out.append(ch)
    return "".join(out)


def _drop_uninformative_args(s: str) -> str:
    """`f<4, Functor, array>` → `f<Functor>` (after `_drop_nested_templates`)."""
    open_at = s.find("<")
    if open_at < 0 or not s.endswith(">"):
        return s
    args = [a.strip() for a in s[open_at + 1 : -1].split(",")]
    kept = [a for a in args if not _UNINFORMATIVE_ARG.match(a)]
    return f"{s[:open_at]}<{', '.join(kept) or '…'}>"
