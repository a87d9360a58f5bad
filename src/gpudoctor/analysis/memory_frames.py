"""Who allocated a block, from the Python frames torch's allocator recorded with it (innermost first, as
`torch.cuda.memory._snapshot()` gives them): the user's line, the innermost line outside torch, and
what the program was doing (a module's forward, the optimizer, the autograd engine with no Python
frame). Memory categories and their order are defined here. Pure; frames are plain dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpudoctor.util.frames import frame_text, is_library, is_torch

# The categories a byte of GPU memory is put in, in the order the reports stack them.
CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "inputs",
    "temporaries",
    "other",  # alive before the recorded step and none of the above: caches, tensors the script holds
    "unattributed",  # the allocator's rounding, what the history does not cover, what torch cannot tell
)
CATEGORY_LABELS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations",
    "inputs": "inputs",
    "temporaries": "temporaries",
    "other": "held from earlier steps",
    "unattributed": "unattributed",
}
# torch.profiler's memory categories (torch.profiler._memory_profiler.Category) in ours.
PROFILER_CATEGORIES = {
    "PARAMETER": "parameters",
    "GRADIENT": "gradients",
    "OPTIMIZER_STATE": "optimizer_state",
    "ACTIVATION": "activations",
    "INPUT": "inputs",
    "TEMPORARY": "temporaries",
    "AUTOGRAD_DETAIL": "temporaries",
}

Frame = Mapping[str, Any]  # {"filename": str, "line": int, "name": str}

NO_FRAMES = "no Python frame (the autograd engine, or C++)"


def user_site(frames: Sequence[Frame]) -> str:
    """The innermost frame of the user's own code, or of any code outside torch, as text."""
    if not frames:
        return NO_FRAMES
    for frame in frames:
        if not is_library(str(frame.get("filename", ""))):
            return frame_text(frame)
    for frame in frames:
        if not is_torch(str(frame.get("filename", ""))):
            return frame_text(frame)
    return frame_text(frames[-1])


def inner_site(frames: Sequence[Frame]) -> str | None:
    """The innermost frame outside torch (a model's file in site-packages, say), where it is not the
    user's site; None otherwise."""
    for frame in frames:
        if not is_torch(str(frame.get("filename", ""))):
            text = frame_text(frame)
            return None if text == user_site(frames) else text
    return None


def script_line(frames: Sequence[Frame], script: str | None) -> str | None:
    """The innermost frame in the script `gpudoctor run` ran (its loop's line), where there is one."""
    if not script:
        return None
    name = script.replace("\\", "/")
    base = name.rsplit("/", 1)[-1]
    for frame in frames:
        filename = str(frame.get("filename", "")).replace("\\", "/")
        if filename == name or (not filename.startswith("/") and filename.rsplit("/", 1)[-1] == base):
            return frame_text(frame)
    return None


def in_forward(frames: Sequence[Frame]) -> bool:
    """Allocated inside an nn.Module's forward (torch's Module._call_impl is on the stack)."""
    return any(
        str(f.get("filename", "")).endswith("torch/nn/modules/module.py")
        and f.get("name") in ("_call_impl", "_wrapped_call_impl")
        for f in frames
    )


def in_optimizer(frames: Sequence[Frame]) -> bool:
    return any("/torch/optim/" in str(f.get("filename", "")) for f in frames)


def category_of_frames(frames: Sequence[Frame], after_forward: bool = False) -> str:
    """The category of an allocation that no parameter, gradient or optimizer state owns, from what was
    running: no Python frame (the autograd engine's backward) or the optimizer → temporaries; a module's
    forward → activations; the user's own line outside any module, before the step's first forward →
    inputs; else temporaries (the loss and other ops outside modules)."""
    if not frames or in_optimizer(frames):
        return "temporaries"
    if in_forward(frames):
        return "activations"
    if not after_forward and not is_library(str(frames[0].get("filename", ""))):
        return "inputs"
    return "temporaries"
