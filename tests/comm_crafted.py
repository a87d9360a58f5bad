"""Crafted Kineto traces of one rank with collectives, for the multi-GPU rules that no recording here
covers yet (FSDP, pipeline stages, a link-bound all-reduce, uneven ranks): each step is a list of
kernels laid out on the GPU, each launched from the step's CPU span; a collective kernel comes with
its `record_param_comms` op and the `cuLaunchKernelEx` that carries the op's External id, exactly
as torch 2.11 records them (see tests/fixtures/ddp). Every figure a test checks is computed from the
layout given here, not read back from gpudoctor."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEVICE = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85520809984, "computeMajor": 9,
          "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
          "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132,
          "regsPerMultiprocessor": 65536, "sharedMemPerMultiprocessor": 233472}  # fmt: skip
KERNEL_NAMES = {
    "all_reduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "all_gather": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "send_recv": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
}
CALL_NAMES = {
    "all_reduce": "allreduce",
    "all_gather": "_allgather_base",
    "reduce_scatter": "_reduce_scatter_base",
    "send_recv": "send",
}
COMPUTE = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
)


@dataclass(frozen=True)
class K:
    """A kernel at `start` µs after its step's GPU start, lasting `dur` µs. `comm`: its collective
    (a key of KERNEL_NAMES), with `nelems` bf16 elements in and out; else a compute kernel."""

    start: float
    dur: float
    comm: str | None = None
    nelems: int = 0
    group: int = 2
    grid: tuple[int, int, int] = (132, 1, 1)
    name: str = COMPUTE


@dataclass
class Crafted:
    rank: int = 0
    world: int = 2
    step_us: float = 10_000.0
    steps: list[list[K]] = field(default_factory=list)
    _ids: int = 1000

    def doc(self) -> dict[str, Any]:
        events: list[dict[str, Any]] = []
        t0 = 1_000_000.0
        for n, kernels in enumerate(self.steps, start=1):
            cpu = t0 + (n - 1) * self.step_us
            events.append(_x("user_annotation", f"ProfilerStep#{n}", 1, 1, cpu, self.step_us - 1, {}))
            for i, k in enumerate(kernels):
                self._ids += 1
                ext, corr, launch = self._ids, self._ids + 100_000, cpu + 5 + i * 0.5
                if k.comm is not None:
                    args = {"External id": ext, "Collective name": CALL_NAMES[k.comm], "In msg nelems": k.nelems,
                            "Out msg nelems": k.nelems, "Group size": k.group, "dtype": "BFloat16",
                            "Process Group Name": "0"}  # fmt: skip
                    events.append(_x("cpu_op", "record_param_comms", 1, 1, launch - 0.2, 0.4, args))
                name = KERNEL_NAMES[k.comm] if k.comm else k.name
                events.append(_x("cuda_driver" if k.comm else "cuda_runtime",
                                 "cuLaunchKernelEx" if k.comm else "cudaLaunchKernel", 1, 1, launch, 0.1,
                                 {"External id": ext, "correlation": corr}))  # fmt: skip
                gpu = {"device": 0, "stream": 20 if k.comm else 7, "correlation": corr, "grid": list(k.grid),
                       "block": [128, 1, 1], "blocks per SM": 1.0, "warps per SM": 4.0,
                       "est. achieved occupancy %": 50}  # fmt: skip
                events.append(_x("kernel", name, 0, gpu["stream"], cpu + 10 + k.start, k.dur, gpu))
        return {
            "schemaVersion": 1,
            "deviceProperties": [DEVICE],
            "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": self.world},
            "traceEvents": events,
        }


def _x(
    cat: str, name: str, pid: int, tid: int, ts: float, dur: float, args: dict[str, Any]
) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}
