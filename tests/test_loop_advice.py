"""Advice fitted to the loop (rules.loop_advice): on the recorded inference traces the host-side
findings show inference code — CUDA graphs, a larger batch, half precision, results kept on the GPU —
never a training loop's DataLoader workers and `loss.item()`; `generate` gets a static cache and
compile; training loops keep the training snippet; the model is named where the run names it."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest

from gpudoctor.analysis.summary import Analysis, analyze
from gpudoctor.rules import diagnose
from gpudoctor.rules.facts import facts_of
from gpudoctor.rules.loop_advice import GENERATE, INFERENCE, TRAINING, host_python_fix, loop_of
from gpudoctor.trace import load_trace
from gpudoctor.trace.iterations import StepSource

FIXTURES = Path(__file__).parent / "fixtures"
TRACES = json.loads((FIXTURES / "traces" / "manifest.json").read_text())["fixtures"]
TRAINING_WORDS = ("loss.item()", "num_workers", "optimizer", "train_step")


@functools.cache
def _analysis(path: str) -> Analysis:
    return analyze(load_trace(FIXTURES / path))


@pytest.mark.parametrize(
    ("path", "kind", "loader"),
    [
        ("traces/inference.json.gz", INFERENCE, False),  # ResNet-50 inference_mode, batches from host memory
        ("zoo/launch_overhead__slow.json.gz", INFERENCE, False),  # an MLP's eager inference loop
        ("traces/conv_bf16_train.json.gz", TRAINING, False),
        ("traces/dataloader_bound.json.gz", TRAINING, True),
        ("traces/transformer_train.json.gz", TRAINING, False),
    ],
)
def test_the_loop_is_read_from_what_ran(path: str, kind: str, loader: bool) -> None:
    a = _analysis(path)
    f = facts_of(a)
    assert f is not None
    loop = loop_of(a, f)
    assert (loop.kind, loop.loader) == (kind, loader)


def test_the_inference_fixtures_sync_finding_shows_inference_code() -> None:
    a = _analysis("traces/inference.json.gz")
    f = diagnose(
        a,
    ).get("host_sync")
    assert f is not None
    assert "inference_mode" in f.fix.snippet and not any(w in f.fix.snippet for w in TRAINING_WORDS)


@pytest.mark.parametrize("path", ["traces/inference.json.gz", "zoo/launch_overhead__slow.json.gz"])
def test_host_python_on_an_inference_loop_without_a_loader_shows_graphs_batch_and_half_precision(
    path: str,
) -> None:
    a = _analysis(path)
    f = facts_of(a)
    assert f is not None
    fix = host_python_fix(loop_of(a, f))
    for wanted in ('mode="reduce-overhead"', "bfloat16", "inference_mode", "larger batch"):
        assert wanted in fix.snippet + fix.summary, wanted
    assert not any(w in fix.snippet for w in TRAINING_WORDS) and "DataLoader" not in fix.snippet


def test_a_training_loop_keeps_the_training_snippet_with_its_loader() -> None:
    a = _analysis("traces/dataloader_bound.json.gz")
    f = facts_of(a)
    assert f is not None
    fix = host_python_fix(loop_of(a, f))
    assert "num_workers" in fix.snippet and "loss.item()" in fix.snippet


def _as_run_found(a: Analysis, description: str, calls_per_step: float | None) -> Analysis:
    source = StepSource("gpudoctor_steps", description, calls_per_step=calls_per_step)
    return dataclasses.replace(a, steps_source=source)


def test_generate_gets_a_static_cache_and_compile_with_the_model_named() -> None:
    a = _as_run_found(
        _analysis("traces/inference.json.gz"),
        "gpudoctor.step annotations (gpudoctor run: one step = one call of GPT2LMHeadModel.generate "
        "(32 calls of GPT2LMHeadModel.forward))",
        32.0,
    )
    f = facts_of(a)
    assert f is not None
    loop = loop_of(a, f)
    assert (loop.kind, loop.model) == (GENERATE, "GPT2LMHeadModel")
    fix = host_python_fix(loop)
    assert 'cache_implementation = "static"' in fix.snippet and "torch.compile" in fix.snippet
    assert "GPT2LMHeadModel" in fix.snippet and "loss" not in fix.snippet


def test_an_inference_loop_the_run_found_names_its_model() -> None:
    a = _as_run_found(
        _analysis("traces/inference.json.gz"),
        "gpudoctor.step annotations (gpudoctor run: one step = one call of BertModel.forward)",
        None,
    )
    f = facts_of(a)
    assert f is not None
    loop = loop_of(a, f)
    assert (loop.kind, loop.model) == (INFERENCE, "BertModel")
    assert "your BertModel" in host_python_fix(loop).snippet
