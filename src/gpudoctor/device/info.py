"""`DeviceInfo`: the static description of one GPU, as Kineto records it in `deviceProperties`
or as torch reports it. Fields a source does not give are None."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    total_memory_bytes: int | None = None
    sm_count: int | None = None
    compute_capability: tuple[int, int] | None = None
    max_threads_per_sm: int | None = None
    max_threads_per_block: int | None = None
    regs_per_sm: int | None = None
    shared_mem_per_sm_bytes: int | None = None
    warp_size: int = 32
    l2_cache_bytes: int | None = None

    @property
    def max_warps_per_sm(self) -> int | None:
        if self.max_threads_per_sm is None:
            return None
        return self.max_threads_per_sm // self.warp_size

    @classmethod
    def from_kineto(cls, props: dict[str, Any]) -> DeviceInfo:
        """From one entry of a Kineto trace's `deviceProperties` (CUDA and ROCm spellings), or of the
        `computeProperties` older traces carry, which name fields as `cudaDeviceProp` does (`major`,
        `multiProcessorCount`)."""

        def num(*keys: str) -> int | None:
            for key in keys:
                value = props.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    return int(value)
            return None

        major, minor = num("computeMajor", "major"), num("computeMinor", "minor")
        return cls(
            index=num("id") or 0,
            name=str(props.get("name", "unknown GPU")),
            total_memory_bytes=num("totalGlobalMem"),
            sm_count=num("numSms", "multiProcessorCount"),
            compute_capability=(major, minor) if major is not None and minor is not None else None,
            max_threads_per_sm=num("maxThreadsPerMultiprocessor", "maxThreadsPerMultiProcessor"),
            max_threads_per_block=num("maxThreadsPerBlock"),
            regs_per_sm=num("regsPerMultiprocessor"),
            shared_mem_per_sm_bytes=num("sharedMemPerMultiprocessor"),
            warp_size=num("warpSize") or 32,
            l2_cache_bytes=num("l2CacheSize"),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceInfo:
        cc = data.get("compute_capability")
        return cls(**{**data, "compute_capability": tuple(cc) if cc else None})
