"""SYNTHETIC allocator snapshots in exactly the format of `torch.cuda.memory._snapshot()` (torch 2.11 /
2.13: `segments` of `blocks` with `frames`, `device_traces` of alloc / free_requested / free_completed /
segment_alloc / segment_free entries with `time_us`), made by a toy caching allocator so that the
memory analysis can be tested on the CPU. They complement, not replace, the snapshots recorded on the
GPU by tools/record_memory.py under tests/fixtures/memory/."""

from __future__ import annotations

import copy
from typing import Any

TORCH = "/usr/lib/python3/dist-packages/torch"
CALL_IMPL = {"filename": f"{TORCH}/nn/modules/module.py", "line": 1750, "name": "_call_impl"}
ADAM = {"filename": f"{TORCH}/optim/adam.py", "line": 400, "name": "_single_tensor_adam"}


def user(line: int, name: str = "train_step", filename: str = "/home/me/train.py") -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


SITE = "/venv/lib/python3.12/site-packages"


def forward(line: int, module_file: str = f"{SITE}/zoo/model.py") -> list[dict[str, Any]]:
    """Frames of an allocation inside the forward of an installed model's module, called from the user's
    train.py:30 (innermost first)."""
    return [
        {"filename": module_file, "line": line, "name": "forward"},
        CALL_IMPL,
        user(30),
    ]


class ToyAllocator:
    """One segment per allocation unless `split` packs allocations into a shared segment; records
    the history like the caching allocator with `_record_memory_history(enabled="all")`."""

    ROUND = 512

    def __init__(self, base: int = 0x7F0000000000) -> None:
        self.next_address = base
        self.segments: list[dict[str, Any]] = []
        self.trace: list[dict[str, Any]] = []
        self.time_us = 1_000_000
        self.recording = True

    def _tick(self) -> int:
        self.time_us += 10
        return self.time_us

    def _entry(self, action: str, addr: int, size: int, frames: list[dict[str, Any]] | None = None) -> None:
        if self.recording:
            self.trace.append(
                {
                    "action": action,
                    "addr": addr,
                    "size": size,
                    "stream": 0,
                    "time_us": self._tick(),
                    "frames": frames or [],
                }
            )

    def alloc(
        self, size: int, frames: list[dict[str, Any]] | None = None, *, segment_size: int | None = None
    ) -> int:
        rounded = max(self.ROUND, -(-size // self.ROUND) * self.ROUND)
        for seg in self.segments:  # reuse an inactive block of a segment that fits exactly or splits
            for i, b in enumerate(seg["blocks"]):
                if b["state"] == "inactive" and b["size"] >= rounded:
                    rest = b["size"] - rounded
                    new = {
                        "address": b["address"],
                        "size": rounded,
                        "requested_size": size,
                        "state": "active_allocated",
                        "frames": frames or [],
                    }
                    seg["blocks"][i : i + 1] = [new] + (
                        [
                            {
                                "address": b["address"] + rounded,
                                "size": rest,
                                "requested_size": 0,
                                "state": "inactive",
                                "frames": [],
                            }
                        ]
                        if rest
                        else []
                    )
                    self._entry("alloc", new["address"], size, frames)
                    return new["address"]
        total = max(segment_size or rounded, rounded)
        address = self.next_address
        self.next_address += total + (1 << 21)
        self._entry("segment_alloc", address, total)
        blocks = [
            {
                "address": address,
                "size": rounded,
                "requested_size": size,
                "state": "active_allocated",
                "frames": frames or [],
            }
        ]
        if total > rounded:
            blocks.append(
                {
                    "address": address + rounded,
                    "size": total - rounded,
                    "requested_size": 0,
                    "state": "inactive",
                    "frames": [],
                }
            )
        self.segments.append(
            {
                "device": 0,
                "address": address,
                "total_size": total,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "blocks": blocks,
            }
        )
        self._entry("alloc", address, size, frames)
        return address

    def free(self, address: int) -> None:
        for seg in self.segments:
            for b in seg["blocks"]:
                if b["address"] == address and b["state"] == "active_allocated":
                    self._entry("free_requested", address, b["requested_size"], b["frames"])
                    self._entry("free_completed", address, b["requested_size"], b["frames"])
                    b.update(state="inactive", frames=[], requested_size=0)
                    self._merge(seg)
                    return
        raise KeyError(hex(address))

    @staticmethod
    def _merge(seg: dict[str, Any]) -> None:
        merged: list[dict[str, Any]] = []
        for b in seg["blocks"]:
            if merged and merged[-1]["state"] == "inactive" and b["state"] == "inactive":
                merged[-1]["size"] += b["size"]
            else:
                merged.append(b)
        seg["blocks"] = merged

    def empty_cache(self) -> None:
        for seg in list(self.segments):
            if all(b["state"] == "inactive" for b in seg["blocks"]):
                self._entry("segment_free", seg["address"], seg["total_size"])
                self.segments.remove(seg)

    def allocated(self) -> int:
        return sum(b["size"] for s in self.segments for b in s["blocks"] if b["state"] == "active_allocated")

    def snapshot(self, with_trace: bool = True) -> dict[str, Any]:
        segments = copy.deepcopy(self.segments)
        for s in segments:
            s["allocated_size"] = sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
            s["active_size"] = s["allocated_size"]
            s["requested_size"] = sum(
                b["requested_size"] for b in s["blocks"] if b["state"] == "active_allocated"
            )
            s["frames"] = []
        return {
            "segments": segments,
            "device_traces": [copy.deepcopy(self.trace) if with_trace else []],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False},
        }

    def start_history(self) -> None:
        """`_record_memory_history(enabled="all", clear_history=True)`."""
        self.trace = []


MiB = 1 << 20


def training_step() -> dict[str, Any]:
    """A recorded training step: parameters (8 MiB) and Adam state (16 MiB) alive before it; the input
    (1 MiB); four forward activations of 10 MiB in two modules; the loss; backward with no Python frame
    (a 6 MiB temporary, then 8 MiB of gradients that stay); the optimizer's 2 MiB temporary. Returns
    the start and end snapshots, the censuses and the expected figures."""
    a = ToyAllocator()
    a.recording = False
    params = [a.alloc(4 * MiB, [user(10, "<module>")]) for _ in range(2)]
    state = [a.alloc(4 * MiB, [ADAM]) for _ in range(4)]
    census_start = {
        "step": 7,
        "parameters": 8 * MiB,
        "gradients": 0,
        "optimizer_state": 16 * MiB,
        "parameters_storages": [[p, 4 * MiB] for p in params],
        "optimizer_state_storages": [[s, 4 * MiB] for s in state],
    }
    start = a.snapshot(with_trace=False)
    a.recording = True
    a.start_history()
    x = a.alloc(1 * MiB, [user(25)])
    acts = [a.alloc(10 * MiB, forward(40 + i, f"{SITE}/zoo/block{i % 2}.py")) for i in range(4)]
    loss = a.alloc(
        512, [{"filename": f"{TORCH}/nn/functional.py", "line": 3000, "name": "cross_entropy"}, user(31)]
    )
    tmp = a.alloc(6 * MiB, [])  # backward
    grads = [a.alloc(4 * MiB, []) for _ in range(2)]
    peak = a.allocated()
    a.free(tmp)
    for act in acts:
        a.free(act)
    a.free(x)
    opt_tmp = a.alloc(2 * MiB, [ADAM, user(33)])
    a.free(opt_tmp)
    end = a.snapshot()
    census_end = dict(census_start, gradients=8 * MiB, gradients_storages=[[g, 4 * MiB] for g in grads])
    return {
        "start": start,
        "end": end,
        "census_start": census_start,
        "census_end": census_end,
        "peak": peak,
        "loss": loss,
        "expected": {
            "parameters": 8 * MiB,
            "optimizer_state": 16 * MiB,
            "inputs": 1 * MiB,
            "activations": 40 * MiB,
            "temporaries": 6 * MiB + 512,
            "gradients": 8 * MiB,
        },
    }
