"""The frameworks people train with, on the CPU: `gpudoctor run` finds one step per optimizer step in
Lightning (automatic optimization runs forward and backward as a closure inside optimizer.step; manual
optimization), the Hugging Face Trainer (with gradient accumulation) and an accelerate loop; the
closure's time is not the optimizer's; and traces recorded by Lightning's own PyTorchProfiler or by
torch.profiler driven from a Lightning Callback or a Trainer callback analyze into their steps."""

from __future__ import annotations

import json
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.cli.main import app
from gpudoctor.runner.record import RunRecord
from gpudoctor.trace import load_trace
from run_options import FAST, traced_steps

pytest.importorskip("lightning")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")


@pytest.fixture(autouse=True)
def signals_put_back() -> Iterator[None]:
    """Lightning saves every signal handler when fit starts and puts them back at its end, ours among
    them while discovery ticks: gpudoctor still leaves SIGALRM as it found it."""
    before = signal.getsignal(signal.SIGALRM)
    yield
    assert signal.getsignal(signal.SIGALRM) == before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


LIGHTNING_MODULE = """\
import torch
import lightning as L
from torch.utils.data import DataLoader, TensorDataset

class Net(L.LightningModule):
    def __init__(self, manual=False):
        super().__init__()
        self.automatic_optimization = not manual
        self.model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.model(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

data = TensorDataset(torch.randn(1024, 32), torch.randint(0, 4, (1024,)))
def loader(workers=0):
    return DataLoader(data, batch_size=16, num_workers=workers, persistent_workers=workers > 0)

def trainer(**kw):
    return L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, **kw)
"""


def run(tmp_path: Path, body: str) -> tuple[RunRecord, Analysis]:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(body))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--out", str(out), *FAST, str(path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    record = RunRecord.from_json(json.loads((out / "record.json").read_text()))
    analysis = Analysis.from_json(json.loads((out / "analysis.json").read_text())["analysis"])
    return record, analysis


def test_lightning_fit_steps_once_per_optimizer_step_and_the_closure_is_not_optimizer_time(
    tmp_path: Path,
) -> None:
    record, analysis = run(tmp_path, LIGHTNING_MODULE + "trainer().fit(Net(), loader(workers=2), loader())\n")
    assert record.step is not None and record.step.source == "optimizer"
    assert record.step.description == "one step of the optimizer (AdamW.step)"
    assert record.step.calls_per_step == pytest.approx(1.0)
    assert traced_steps(analysis) == 2
    # Optimizer.step spans the closure's forward and backward; only the update itself is its time. Counted
    # with the closure, every step's optimizer time would pass half of it; one step the loader's two workers
    # preempted in its update can (4.6 of 7.2 ms once under `pytest -n 2`)
    assert min(s.cpu.optimizer_us / s.cpu.duration_us for s in analysis.steps) < 0.5


def test_lightning_manual_optimization(tmp_path: Path) -> None:
    record, analysis = run(tmp_path, LIGHTNING_MODULE + "trainer().fit(Net(manual=True), loader())\n")
    assert record.step is not None and record.step.source == "optimizer" and traced_steps(analysis) == 2


def test_hugging_face_trainer_with_gradient_accumulation(tmp_path: Path) -> None:
    record, analysis = run(
        tmp_path,
        f"""
        import torch
        from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

        config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, num_labels=2)

        class Tokens(torch.utils.data.Dataset):
            def __len__(self):
                return 640

            def __getitem__(self, i):
                return {{"input_ids": torch.randint(0, 100, (16,)), "labels": torch.tensor(i % 2)}}

        args = TrainingArguments(output_dir="{tmp_path / "hf"}", per_device_train_batch_size=8,
                                 gradient_accumulation_steps=2, num_train_epochs=1, report_to=[],
                                 save_strategy="no", logging_strategy="no", use_cpu=True)
        Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Tokens()).train()
        """,
    )
    assert record.step is not None and record.step.source == "optimizer"
    assert record.step.calls_per_step == pytest.approx(2.0)  # two micro-batches per optimizer step
    assert traced_steps(analysis) == 2


def test_an_accelerate_loop(tmp_path: Path) -> None:
    record, _ = run(
        tmp_path,
        """
        import torch
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        optimizer = torch.optim.AdamW(model.parameters())
        data = torch.utils.data.TensorDataset(torch.randn(2048, 32), torch.randint(0, 4, (2048,)))
        loader = torch.utils.data.DataLoader(data, batch_size=16)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        """,
    )
    assert record.step is not None and record.step.source == "optimizer"


def _profile_with_lightning(tmp_path: Path, how: str) -> Path:
    """Record a trace of a Lightning fit the way its users do, and return it."""
    body = LIGHTNING_MODULE + textwrap.dedent(
        f"""
        import torch.profiler as tp
        from lightning.pytorch.profilers import PyTorchProfiler
        out = "{tmp_path}"
        if "{how}" == "lightning":
            prof = PyTorchProfiler(dirpath=out, filename="prof", export_to_chrome=True,
                                   schedule=tp.schedule(wait=1, warmup=1, active=4, repeat=1))
            trainer(profiler=prof).fit(Net(), loader())
        else:
            class Profile(L.Callback):
                def on_train_start(self, trainer, module):
                    self.prof = tp.profile(schedule=tp.schedule(wait=1, warmup=1, active=4, repeat=1),
                                           on_trace_ready=lambda p: p.export_chrome_trace(out + "/cb.json"))
                    self.prof.start()
                def on_train_batch_end(self, trainer, module, outputs, batch, i):
                    self.prof.step()
                def on_train_end(self, trainer, module):
                    self.prof.stop()
            trainer(callbacks=[Profile()]).fit(Net(), loader())
        """
    )
    script = tmp_path / "record.py"
    script.write_text(body)
    import runpy

    runpy.run_path(str(script), run_name="__main__")
    return next(p for p in tmp_path.glob("*.json") if p.name != "record.json")


@pytest.mark.parametrize("how", ["lightning", "callback"])
def test_traces_recorded_by_lightning_or_a_callback_analyze_into_steps(tmp_path: Path, how: str) -> None:
    analysis = analyze(load_trace(_profile_with_lightning(tmp_path, how)))
    assert len(analysis.steps) >= 3
    for step in analysis.steps:
        assert step.cpu.optimizer_us < 0.5 * step.cpu.duration_us  # the closure is not the optimizer's


def test_a_trace_recorded_from_a_trainer_callback_analyzes_into_steps(tmp_path: Path) -> None:
    import runpy

    script = tmp_path / "record.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import torch
            import torch.profiler as tp
            from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback,
                                      TrainingArguments)

            class Tokens(torch.utils.data.Dataset):
                def __len__(self):
                    return 256

                def __getitem__(self, i):
                    return {{"input_ids": torch.randint(0, 100, (16,)), "labels": torch.tensor(i % 2)}}

            class Profile(TrainerCallback):
                def on_train_begin(self, args, state, control, **kw):
                    self.prof = tp.profile(schedule=tp.schedule(wait=1, warmup=1, active=4, repeat=1),
                        on_trace_ready=lambda p: p.export_chrome_trace("{tmp_path / "hf.json"}"))
                    self.prof.start()
                def on_step_end(self, args, state, control, **kw):
                    self.prof.step()
                def on_train_end(self, args, state, control, **kw):
                    self.prof.stop()

            config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, num_labels=2)
            args = TrainingArguments(output_dir="{tmp_path / "hf"}", per_device_train_batch_size=8,
                                     num_train_epochs=1, report_to=[], save_strategy="no",
                                     logging_strategy="no", use_cpu=True)
            Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Tokens(),
                    callbacks=[Profile()]).train()
            """
        )
    )
    runpy.run_path(str(script), run_name="__main__")
    analysis = analyze(load_trace(tmp_path / "hf.json"))
    # every step found (a first one far slower than the rest, the Trainer's set-up, is a warm-up; on a
    # loaded 2-core machine the second can be too: 713 ms against 10 ms, beside the other tests' worker)
    assert len(analysis.warmup_steps) + len(analysis.steps) == 4 and len(analysis.steps) >= 2
