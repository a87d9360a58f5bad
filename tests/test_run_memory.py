"""`gpudoctor run`'s memory recording end to end on the CPU. CUDA's allocator statistics and snapshots
need a GPU (tests/test_memory_gpu.py, and the recorded fixtures of tests/test_memory_fixtures.py); on
the CPU torch.profiler's own memory categorisation works (profile_memory + record_shapes + with_stack),
and the census of parameters, gradients and optimizer state is exact on any device."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import pytest
import torch

from gpudoctor.analysis.memory_breakdown import split_level
from gpudoctor.analysis.memory_run import MemoryAnalysis
from gpudoctor.analysis.summary import Analysis
from gpudoctor.runner.memory import MemoryOptions, MemoryRecorder
from test_run import FAST, nothing_left_behind, record_of, run  # noqa: F401  (the autouse fixture)

MEMORY_FLAGS = ["--profile-memory", "--record-shapes", "--with-stack"]

# Elementwise blocks on a 2M-element input: ~90 MiB of activations saved for backward, a few
# parameters, Adam: activations dominate the peak and each step takes milliseconds on the CPU.
ACTIVATION_HEAVY = """\
import torch

class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1024))

    def forward(self, x):
        y = x * self.scale
        return y * torch.sigmoid(y) + x

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Gate() for _ in range(4))
        self.head = torch.nn.Linear(1024, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)

model = Net()
opt = torch.optim.Adam(model.parameters())
for step in range(40):
    x = torch.randn(2048, 1024)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _script(tmp_path: Path, body: str = ACTIVATION_HEAVY) -> Path:
    path = tmp_path / "heavy.py"
    path.write_text(body)
    return path


@pytest.fixture(scope="module")
def heavy_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One run of the activation-heavy script with torch.profiler's memory categorisation on."""
    tmp = tmp_path_factory.mktemp("heavy")
    out = tmp / "run"
    result = run("--out", str(out), *FAST, *MEMORY_FLAGS, str(_script(tmp)))
    assert result.exit_code == 0, result.output
    return out, result.output


def test_torchs_categories_on_the_cpu_split_the_peak_and_name_the_modules(
    heavy_run: tuple[Path, str],
) -> None:
    out, _ = heavy_run
    record = record_of(out)
    assert record.memory_run is not None and record.memory_run["schema"] == "gpudoctor.memory-run/1"
    assert record.memory_run["timeline"] == {"file": "memory/timeline.json.gz"}
    assert (out / "memory" / "timeline.json.gz").is_file()
    doc = json.loads((out / "memory.json").read_text())
    memory = MemoryAnalysis.from_json({k: v for k, v in doc.items() if k != "findings"})
    b = memory.breakdown
    assert b is not None and b.source == "profiler memory timeline"
    assert sum(b.categories.values()) == b.peak
    assert b.categories["activations"] > 0.5 * b.peak  # what the script plants
    assert memory.training and memory.census is not None
    params = 4 * 1024 * 4 + (1024 + 1) * 4
    assert memory.census.parameters == params and memory.census.optimizer_state >= 2 * params
    level = split_level(b.modules)
    assert {m.name for m in level} == {f"Net.blocks.{i}" for i in range(4)}
    assert {m.type for m in level} == {"Gate"}
    assert doc["findings"][0]["id"] == "activation_checkpointing"
    assert "4 Gate modules (Net.blocks.0–3)" in " ".join(doc["findings"][0]["evidence"])


def test_the_analysis_and_the_report_carry_the_memory_of_the_run(heavy_run: tuple[Path, str]) -> None:
    out, output = heavy_run
    analysis = Analysis.from_json(json.loads((out / "analysis.json").read_text())["analysis"])
    assert analysis.memory_run is not None and analysis.memory_run.breakdown is not None
    findings = json.loads((out / "analysis.json").read_text())["findings"]
    assert "activation_checkpointing" in [f["id"] for f in findings]
    html = (out / "report.html").read_text()
    assert 'id="memory-run"' in html and "<polygon" in html and "frees up to" in html
    section = html[html.index('id="memory-run"') :]
    svg = section[section.index("<svg") : section.index("</svg>") + 6]
    ElementTree.fromstring(svg)  # well-formed: a browser draws it
    assert "Memory of the run (by category)" in output and "activations" in output


def test_without_the_profilers_memory_flags_the_cpu_run_counts_objects_only(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run(
        "--out", str(out), "--warmup", "1", "--warmup-seconds", "0", "--light-steps", "2", "--light-seconds", "0",
        "--light", str(_script(tmp_path)),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    memory = record_of(out).memory_run
    assert memory is not None and memory["census"]["optimizers"] == ["Adam"]
    assert memory["steps"] == [] and memory["snapshots"] == {} and memory["timeline"] is None
    assert "peak by category: not recorded (on the CPU, run with --profile-memory" in result.output


def test_a_recorder_on_a_machine_with_cuda_waits_for_torchs_initialisation_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Installing must not start CUDA (the script may still set PYTORCH_CUDA_ALLOC_CONF): it queues a
    call for torch's lazy initialisation, and uninstalling takes the call out again."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    before = list(torch.cuda._queued_calls)
    recorder = MemoryRecorder(MemoryOptions()).install()
    assert len(torch.cuda._queued_calls) == len(before) + 1 and not torch.cuda.is_initialized()
    recorder.uninstall()
    assert torch.cuda._queued_calls == before
    recorder.uninstall()  # twice is fine
