"""A trace whose kernel and op names are script injections, for the report escaping tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixtures" / "traces" / "sync_every_step.json.gz"
# What a script that ran would leave behind: a changed title and a marker attribute on <html>.
MARK = "document.title='PWNED';document.documentElement.setAttribute('data-pwned','1')"
KERNEL_NAMES = ("<script>alert(1)</script>", f"<script>{MARK}</script>")
OP_NAMES = ('"><img src=x onerror=alert(1)>', f'"><img src=x onerror="{MARK}">')


def write_crafted_trace(path: Path) -> Path:
    """The sync_every_step fixture with every kernel and every aten op renamed to an injection."""
    with gzip.open(FIXTURE, "rt") as f:
        doc = json.load(f)
    k = o = 0
    for e in doc["traceEvents"]:
        cat = str(e.get("cat", "")).lower()
        if cat == "kernel":
            e["name"] = KERNEL_NAMES[k % 2]
            k += 1
        elif cat == "cpu_op" and str(e.get("name", "")).startswith("aten::"):
            e["name"] = OP_NAMES[o % 2]
            o += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path
