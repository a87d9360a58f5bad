"""The permanent change in a framework's own terms: a fix's edit that lands on Hugging Face's
`Trainer(...).train()` or Lightning's `trainer.fit(...)` becomes the framework's option on the call
that configures it; edits elsewhere, and files without such a call, are left alone."""

from __future__ import annotations

from pathlib import Path

from gpudoctor.fixes.catalog import in_users_idiom
from gpudoctor.fixes.diff import unified_diff
from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.frameworks import in_framework_terms

ROOT = Path(__file__).resolve().parent.parent

HF = """\
from transformers import GPT2LMHeadModel, Trainer, TrainingArguments

model = GPT2LMHeadModel.from_pretrained("gpt2")
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=8,
)
trainer = Trainer(model=model, args=args, train_dataset=dataset)
trainer.train()
"""

LIGHTNING = """\
import lightning.pytorch as pl
from torch.utils.data import DataLoader

loader = DataLoader(data, batch_size=64)
trainer = pl.Trainer(max_steps=100, precision="32-true")
trainer.fit(model, loader)
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(text)
    return str(path)


def test_hugging_face_trainer_fixes_become_training_arguments(tmp_path: Path) -> None:
    # GIVEN the edits the patches record when the loop runs inside Trainer: their site is the
    # user's train() line, where there is neither a forward, a DataLoader nor an optimizer
    script = write(tmp_path, HF)
    edits = [
        Edit("wrap_statement", script, 9, wrap='torch.autocast("cuda", dtype=torch.bfloat16)'),
        Edit("set_kwargs", script, 9, call="DataLoader",
             kwargs={"num_workers": "8", "persistent_workers": "True", "prefetch_factor": "4"}),
        Edit("set_kwargs", script, 9, call="AdamW", kwargs={"fused": "True"}, drop=("foreach",)),
        Edit("insert_after_imports", script, code=('torch.set_float32_matmul_precision("high")',)),
    ]  # fmt: skip
    # THEN they are TrainingArguments' own options, and the rest stays as it was
    result = unified_diff(in_framework_terms(edits))
    assert result.unplaced == ()
    assert "+    bf16=True," in result.diff and '+    optim="adamw_torch_fused",' in result.diff
    assert (
        "+    dataloader_num_workers=8," in result.diff
        and "+    dataloader_prefetch_factor=4," in result.diff
    )
    assert "with torch.autocast" not in result.diff
    assert '+torch.set_float32_matmul_precision("high")' in result.diff


def test_autocast_in_a_lightning_modules_training_step_becomes_the_trainers_precision(tmp_path: Path) -> None:
    # GIVEN the Lightning workload as written, and the edit the autocast patch records there: its
    # forward is called from training_step (a line of the user's file the Trainer calls)
    source = (ROOT / "benchmarks" / "fix_workloads" / "lightning_fit.py").read_text()
    script = write(tmp_path, source)
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "self(tokens)" in text)
    edits = [Edit("wrap_statement", script, line, wrap='torch.autocast("cuda", dtype=torch.bfloat16)')]
    # THEN the Trainer's precision is set (its conditional value replaced), training_step untouched
    result = unified_diff(in_framework_terms(edits))
    assert result.unplaced == () and "with torch.autocast" not in result.diff
    assert (
        '-    max_steps=args.steps, accelerator="auto", devices=1, precision="bf16-mixed" if args.expert else "32-true",'
        in result.diff
    )
    assert '+    max_steps=args.steps, accelerator="auto", devices=1, precision="bf16-mixed",' in result.diff


def test_lightning_autocast_becomes_the_trainers_precision(tmp_path: Path) -> None:
    script = write(tmp_path, LIGHTNING)
    edits = [
        Edit("wrap_statement", script, 6, wrap='torch.autocast("cuda", dtype=torch.float16)'),
        Edit("set_kwargs", script, 4, call="DataLoader", kwargs={"num_workers": "8"}),  # the user's own line
    ]
    result = unified_diff(in_framework_terms(edits))
    assert result.unplaced == ()
    assert '-trainer = pl.Trainer(max_steps=100, precision="32-true")' in result.diff
    assert '+trainer = pl.Trainer(max_steps=100, precision="16-mixed")' in result.diff
    assert "+loader = DataLoader(data, batch_size=64, num_workers=8)" in result.diff


ACCELERATE = """\
from accelerate import Accelerator

accelerator = Accelerator()
model, opt, loader = accelerator.prepare(model, opt, loader)
for x, y in loader:
    loss = criterion(model(x), y)
    accelerator.backward(loss)
"""


def test_accelerate_autocast_becomes_the_accelerators_mixed_precision(tmp_path: Path) -> None:
    script = write(tmp_path, ACCELERATE)
    edits = [Edit("wrap_statement", script, 6, wrap='torch.autocast("cuda", dtype=torch.bfloat16)')]
    result = unified_diff(in_framework_terms(edits))
    assert '-accelerator = Accelerator()\n+accelerator = Accelerator(mixed_precision="bf16")' in result.diff
    assert "with torch.autocast" not in result.diff


def test_a_plain_loop_and_a_models_own_train_call_are_left_alone(tmp_path: Path) -> None:
    # GIVEN a loop of its own that calls model.train() and has no TrainingArguments
    script = write(tmp_path, "model.train()\nfor x in loader:\n    out = model(x)\n")
    edits = [Edit("wrap_statement", script, 1, wrap='torch.autocast("cuda", dtype=torch.bfloat16)'),
             Edit("wrap_statement", script, 3, wrap='torch.autocast("cuda", dtype=torch.bfloat16)')]  # fmt: skip
    assert in_framework_terms(edits) == edits


def test_every_kept_fix_is_written_as_the_frameworks_own_switch_where_it_has_one(tmp_path: Path) -> None:
    # GIVEN the Hugging Face Trainer, where compile and TF32 have no call site of the user's (the model is
    # called inside the Trainer) and the fixes recorded only snippets
    script = write(tmp_path, HF)
    compiled = in_users_idiom("compile", [], script)
    # THEN each is TrainingArguments' option, never "no call site known"
    diff = unified_diff(
        [*compiled, *in_users_idiom("tf32", [], script), *in_users_idiom("autocast", [], script)]
    )
    assert diff.unplaced == ()
    assert all(f"+    {o}=True," in diff.diff for o in ("torch_compile", "tf32", "bf16"))
    mode = unified_diff(in_users_idiom("compile:reduce-overhead", [], script)).diff
    assert '+    torch_compile_mode="reduce-overhead",' in mode
    # AND the workers and pinned memory of the loader the Trainer makes
    loader = unified_diff(
        [*in_users_idiom("workers:8", [], script), *in_users_idiom("pin_memory", [], script)]
    )
    assert (
        "+    dataloader_num_workers=8," in loader.diff and "+    dataloader_pin_memory=True," in loader.diff
    )


def test_compile_without_a_binding_goes_before_lightnings_fit_and_into_accelerate(tmp_path: Path) -> None:
    lightning = unified_diff(in_users_idiom("compile", [], write(tmp_path, LIGHTNING))).diff
    assert "+model.compile()\n trainer.fit(model, loader)" in lightning
    accelerate = unified_diff(in_users_idiom("compile", [], write(tmp_path, ACCELERATE))).diff
    assert '+accelerator = Accelerator(dynamo_backend="inductor")' in accelerate


def test_where_the_model_is_bound_compile_stays_the_users_own_line(tmp_path: Path) -> None:
    # GIVEN compile's edit after `model = ...` in an accelerate loop: that line is how its users write it
    text = (
        "from accelerate import Accelerator\n\nmodel = Net()\naccelerator = Accelerator()\n"
        + ACCELERATE.split("\n", 3)[3]
    )
    script = write(tmp_path, text)
    edit = Edit("after_assignment", script, 3, name="model", code=("{name}.compile()",))
    assert in_users_idiom("compile", [edit], script) == [edit]
    assert in_users_idiom("workers:4", [], write(tmp_path, "for x in loader:\n    pass\n")) == []
