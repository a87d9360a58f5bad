"""Python source frames as text, and whether a frame is the user's own code: shared by the runner
(which reads live stacks) and the memory analysis (which reads recorded ones). Frames are mappings
with `filename`, `line` and `name`, the shape torch's allocator snapshots use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Installed packages, the standard library, torch (also as the profiler shortens it: "torch/nn/…") and
# gpudoctor's own runner are not the user's code.
_LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", "/lib/python3", "/torch/", "/gpudoctor/runner/")


def is_library(filename: str) -> bool:
    return filename.startswith(("<", "torch/")) or any(m in filename for m in _LIBRARY_MARKS)


def is_torch(filename: str) -> bool:
    return filename.startswith(("<", "torch/")) or "/torch/" in filename or "/gpudoctor/runner/" in filename


def frame_text(frame: Mapping[str, Any]) -> str:
    """'me/train.py:42 in step' (the last two components of the path)."""
    parts = str(frame.get("filename", "?")).replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{frame.get('line', 0)} in {frame.get('name', '?')}"


def innermost_user_frame(frames: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first frame (innermost first) of the user's own code."""
    return next((f for f in frames if not is_library(str(f.get("filename", "")))), None)
