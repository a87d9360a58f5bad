"""`gpudoctor run`'s memory recording on a real CUDA allocator (skipped without a GPU): per-step peaks
as torch.cuda reports them, the detail step's categories summing to its peak, a leak's line, an
out-of-memory error's snapshot and line, and the allocator's history off again afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpudoctor.analysis.memory_run import MemoryAnalysis
from test_run import nothing_left_behind, run  # noqa: F401  (the autouse fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
FAST = [
    "--warmup",
    "2",
    "--light-steps",
    "5",
    "--light-seconds",
    "0",
    "--warmup-seconds",
    "0",
    "--steps",
    "2",
    "--no-nvml",
]

TRAIN = """\
import torch
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()
opt = torch.optim.Adam(model.parameters())
kept = []
for step in range(40):
    x = torch.randn(256, 1024, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    {extra}
"""


def _memory(tmp_path: Path, extra: str = "pass") -> tuple[MemoryAnalysis, list[str], Path]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN.replace("{extra}", extra))
    out = tmp_path / "run"
    result = run("--out", str(out), *FAST, str(script))
    assert result.exit_code in (0, 1), result.output
    doc = json.loads((out / "memory.json").read_text())
    findings = [f["id"] for f in doc.pop("findings")]
    return MemoryAnalysis.from_json(doc), findings, out


def test_step_peaks_are_torchs_and_the_categories_sum_to_the_detail_steps_peak(tmp_path: Path) -> None:
    m, _, out = _memory(tmp_path)
    light = [s for s in m.steps if s.phase == "light"]
    assert len(light) >= 5 and len({s.peak_allocated for s in light}) == 1  # the same work every step
    b = m.breakdown
    assert b is not None and b.source == "allocator history"
    measured = next(s.peak_allocated for s in m.steps if s.step == b.step)
    assert b.peak == measured and b.categories["unattributed"] <= 0.05 * measured
    params = 8 * (1024 * 1024 + 1024) * 4
    assert m.census is not None and m.census.parameters == params and m.census.optimizer_state >= 2 * params
    assert b.categories["parameters"] == pytest.approx(params, rel=0.02)
    assert (out / "memory" / "detail_end.json.gz").is_file()


def test_a_list_that_keeps_a_tensor_every_step_is_a_leak_at_its_line(tmp_path: Path) -> None:
    m, findings, _ = _memory(tmp_path, "kept.append(torch.empty(16 << 20, dtype=torch.uint8, device='cuda'))")
    assert findings[0] == "memory_leak" and m.leak is not None
    assert m.leak.bytes_per_step == pytest.approx(16 << 20, rel=0.05)
    assert m.leak.sites[0].site.endswith("train.py:11 in <module>")


def test_an_out_of_memory_error_is_explained_with_its_line(tmp_path: Path) -> None:
    extra = "torch.empty(1 << 44, dtype=torch.uint8, device='cuda')  # 16 TiB"
    m, findings, out = _memory(tmp_path, extra)
    assert findings[0] == "out_of_memory" and m.oom is not None
    assert m.oom.failing_line is not None and m.oom.failing_line.endswith("train.py:11 in <module>")
    assert m.oom.requested >= 1 << 44 and m.oom.categories["parameters"] > 0
    assert (out / "memory" / "oom.json.gz").is_file()


def test_the_allocators_history_is_off_after_the_run(tmp_path: Path) -> None:
    _memory(tmp_path)
    x = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    blocks = [b for s in torch.cuda.memory._snapshot()["segments"] for b in s["blocks"]]
    mine = [b for b in blocks if b.get("address") == x.untyped_storage().data_ptr()]
    assert mine and not mine[0].get("frames")
