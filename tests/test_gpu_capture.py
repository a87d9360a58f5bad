"""On a real GPU: record a trace with gpudoctor's capture and analyze it end to end.
Marked `gpu`; skipped where torch sees no CUDA device (CI)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpudoctor.analysis.summary import analyze  # noqa: E402
from gpudoctor.trace import load_trace  # noqa: E402
from gpudoctor.trace.capture import ProfileOptions, profile_steps  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_a_recorded_training_step_analyzes(tmp_path: Path) -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(512, 1024, device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # one planted host sync per step

    path = profile_steps(
        step, tmp_path / "t.json.gz", ProfileOptions(active=3, with_stack=True, profile_memory=True)
    )
    a = analyze(load_trace(path))
    assert len(a.steps) == 3
    assert a.trace.gpu_activities > 0 and a.device is not None
    assert a.kernels.tensor_core_share and a.kernels.tensor_core_share > 0.5
    assert a.syncs.per_step and a.syncs.per_step >= 1
    assert any(s.source and "test_gpu_capture.py" in s.source for s in a.syncs.sites)
    assert a.memory is not None and a.memory.peak_allocated > 0
    for s in a.steps:
        assert s.gpu is not None and 0 < s.gpu.busy_fraction <= 1
