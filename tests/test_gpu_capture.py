"""On a real GPU: record a trace with gpudoctor's capture and analyze it end to end.
Marked `gpu`; skipped where torch sees no CUDA device (CI)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpudoctor.analysis.summary import analyze  # noqa: E402
from gpudoctor.runner.profile import StepTraceOptions, profile_steps  # noqa: E402
from gpudoctor.trace import load_trace  # noqa: E402

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
        step, tmp_path / "t.json.gz", StepTraceOptions(active=3, with_stack=True, profile_memory=True)
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


def test_shapes_recorded_on_this_gpu_put_its_matmuls_on_the_roofline(tmp_path: Path) -> None:
    # GIVEN large bf16 matmuls recorded with record_shapes (and with_flops, which torch may ignore)
    a_ = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b_ = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        for _ in range(4):
            torch.mm(a_, b_)

    options = StepTraceOptions(active=2, record_shapes=True, with_flops=True)
    trace = load_trace(profile_steps(step, tmp_path / "mm.json.gz", options))
    # WHEN analyzed against the ceilings gpudoctor knows for this GPU (if any)
    r = analyze(trace).roofline
    # THEN the matmul kernels carry 2·n³ FLOPs each and run at a plausible rate
    assert r is not None and r.points, r
    mm = r.points[0]
    assert mm.family == "matmul" and mm.dtype == "bfloat16" and mm.calls == 8
    assert mm.flops == pytest.approx(8 * 2 * 4096**3, rel=1e-6)
    assert 50e12 < mm.flops_per_s < 2e15
    assert r.coverage > 0.95
