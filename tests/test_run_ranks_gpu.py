"""On two GPUs: `gpudoctor run --nproc 2` starts torchrun through the runner's child protocol
(`runner.child.run_attached`) on a DDP ResNet-50 written as users write it (benchmarks/multi_gpu_train.py,
NVLink multicast off), and every rank writes its record and trace on the same steps, rank 0 the combined
analysis. Marked `gpu`; skipped where torch sees fewer than two CUDA devices (CI, one-GPU machines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
]
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def test_nproc_runs_a_ddp_script_on_two_gpus_and_combines_its_ranks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # the source first, what the environment had after it (wheels installed beside it: msgspec)
    path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, **NO_MULTICAST, "PYTHONPATH": path, "STEPS": "400", "WARMUP_S": "1"}
    cmd = [sys.executable, "-m", "gpudoctor", "run", "--nproc", "2", "--out", str(out), "--warmup", "5",
           "--light-steps", "20", "--steps", "3", str(REPO / "benchmarks" / "multi_gpu_train.py")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=420)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        record = json.loads((out / f"rank-{rank}" / "record.json").read_text())
        assert record["light"]["times_us"] and record["trace_files"]
    doc = json.loads((out / "analysis.json").read_text())
    assert doc["run"]["ranks_traced"] == [0, 1]
    assert "destroy_process_group" not in done.stderr  # the process group ended cleanly
