"""The memory rules on SYNTHETIC memory analyses: when each finds something, what it says, and the
order of the memory findings (an out-of-memory error first, then by severity and memory freed)."""

from __future__ import annotations

from dataclasses import replace

from gpudoctor.analysis.memory_breakdown import MemoryBreakdown, ModuleMemory, SiteBytes
from gpudoctor.analysis.memory_frames import CATEGORIES
from gpudoctor.analysis.memory_run import SCHEMA, Census, Fragmentation, Leak, MemoryAnalysis, OomReport
from gpudoctor.rules.finding import Severity
from gpudoctor.rules.memory_registry import memory_findings
from memory_synthetic import MiB

GiB = 1 << 30


def _breakdown(**categories: int) -> MemoryBreakdown:
    cats = dict.fromkeys(CATEGORIES, 0) | categories
    return MemoryBreakdown("allocator history", 9, sum(cats.values()), cats, (), (), (), {}, ())


def _analysis(**kw: object) -> MemoryAnalysis:
    base = MemoryAnalysis(
        schema=SCHEMA,
        device="cuda:0",
        capacity=80 * GiB,
        budget=79 * GiB,
        training=True,
        steps=(),
        peak_allocated=0,
        peak_reserved=0,
        census=None,
        breakdown=None,
        leak=None,
        fragmentation=None,
        oom=None,
        step_us=100_000.0,
        history="",
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def _ids(m: MemoryAnalysis) -> list[str]:
    return [f.id for f in memory_findings(m)]


BLOCKS = tuple(
    ModuleMemory(f"GPT.h.{i}", "Block", 3 * GiB, inputs=64 * MiB, forward_us=2000.0) for i in range(12)
)


def test_activation_dominated_training_names_the_blocks_the_memory_and_the_recompute_time() -> None:
    b = replace(_breakdown(activations=36 * GiB, parameters=2 * GiB, optimizer_state=4 * GiB), modules=BLOCKS)
    (f,) = memory_findings(_analysis(breakdown=b, peak_allocated=b.peak))
    assert f.id == "activation_checkpointing" and f.severity == Severity.MAJOR
    assert f.est_memory_bytes == 12 * (3 * GiB - 64 * MiB)
    text = " ".join(f.evidence)
    assert "12 Block modules (GPT.h.0–11)" in text and "24 ms more per step" in text and "24%" in text


def test_inference_and_a_small_activation_share_ask_for_no_checkpointing() -> None:
    b = _breakdown(activations=36 * GiB, parameters=2 * GiB)
    assert _ids(_analysis(breakdown=b, training=False)) == []
    assert _ids(_analysis(breakdown=_breakdown(activations=1 * GiB, parameters=2 * GiB))) == []


def test_adam_state_over_a_third_of_the_peak_is_a_finding_counted_from_the_optimizer() -> None:
    census = Census(
        step=8, parameters=4 * GiB, gradients=4 * GiB, optimizer_state=8 * GiB, optimizers=("AdamW",)
    )
    (f,) = memory_findings(_analysis(census=census, peak_allocated=20 * GiB))
    assert f.id == "optimizer_state_memory" and f.est_memory_bytes == 6 * GiB
    assert "2.0× the parameters" in f.evidence[0]
    assert _ids(_analysis(census=census, peak_allocated=60 * GiB)) == []


def test_fragmentation_from_slack_split_blocks_retries_or_steady_cudamalloc() -> None:
    frag = Fragmentation(10, 20 * GiB, 34 * GiB, 9 * GiB, 140, 512 * MiB, 0, 0.0, 0.0, False)
    (f,) = memory_findings(_analysis(fragmentation=frag))
    assert f.id == "memory_fragmentation" and f.est_memory_bytes == 14 * GiB
    assert "expandable_segments:True" in f.fix.snippet
    on = memory_findings(_analysis(fragmentation=replace(frag, expandable_segments=True)))[0]
    assert "expandable_segments" not in on.fix.snippet and "bucket" in on.fix.summary
    tidy = replace(frag, peak_reserved=21 * GiB, inactive_split_bytes=0)
    assert _ids(_analysis(fragmentation=tidy)) == []
    assert _ids(_analysis(fragmentation=replace(tidy, alloc_retries=2))) == ["memory_fragmentation"]
    assert _ids(_analysis(fragmentation=replace(tidy, device_allocs_per_step=3.0))) == [
        "memory_fragmentation"
    ]


def test_a_leak_near_the_limit_is_critical_and_names_its_line() -> None:
    site = SiteBytes("me/leak.py:28 in <module>", 300 * MiB, 40, "activations", "me/lm.py:23 in forward")
    leak = Leak(300 * MiB, 30, 9 * GiB, 1.0, (site,), 250.0)
    (f,) = memory_findings(_analysis(leak=leak, peak_allocated=20 * GiB))
    assert f.id == "memory_leak" and f.severity == Severity.CRITICAL
    assert "me/leak.py:28 in <module> (inside me/lm.py:23 in forward) +300 MiB per step" in " ".join(
        f.evidence
    )
    slow = replace(leak, steps_to_full=1e6)
    assert memory_findings(_analysis(leak=slow))[0].severity == Severity.MAJOR


def test_memory_held_into_the_next_step_leaves_out_inputs_and_leaking_lines() -> None:
    held = (
        SiteBytes("me/train.py:40 in <module>", 2 * GiB, 1, "activations"),
        SiteBytes("me/train.py:31 in <module>", 3 * GiB, 1, "inputs"),
    )
    b = replace(_breakdown(activations=10 * GiB), held=held)
    (f,) = memory_findings(_analysis(breakdown=b, peak_allocated=10 * GiB, training=False))
    assert f.id == "memory_held" and f.est_memory_bytes == 2 * GiB and "train.py:40" in f.evidence[1]
    leaking = Leak(2 * GiB, 10, 20 * GiB, 1.0, (held[0],), None)
    assert "memory_held" not in _ids(
        _analysis(breakdown=b, peak_allocated=10 * GiB, training=False, leak=leaking)
    )


def _oom(**kw: object) -> OomReport:
    base = OomReport(
        step=1,
        requested=8 * GiB,
        device_free=2 * GiB,
        capacity=80 * GiB,
        allocated=70 * GiB,
        reserved=75 * GiB,
        largest_free_block=1 * GiB,
        categories=dict.fromkeys(CATEGORIES, 0) | {"activations": 60 * GiB, "parameters": 10 * GiB},
        sites=(
            SiteBytes(
                "me/lm.py:23 in forward", 60 * GiB, 900, "activations", None, "me/train.py:41 in <module>"
            ),
        ),
        failing_line="me/lm.py:23 in forward",
        message="CUDA out of memory",
        script_line="me/train.py:41 in <module>",
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_out_of_memory_says_what_held_it_where_and_what_batch_fits() -> None:
    b = replace(_breakdown(activations=36 * GiB, parameters=2 * GiB), modules=BLOCKS)
    found = memory_findings(_analysis(oom=_oom(), breakdown=b))
    f = found[0]
    assert f.id == "out_of_memory" and f.severity == Severity.CRITICAL and f.est_memory_bytes == 6 * GiB
    text = " ".join(f.evidence)
    assert "failed at me/lm.py:23 in forward (from me/train.py:41 in <module>)" in text
    assert "activations 60 GiB (86%), parameters 10 GiB (14%)" in text
    # 60 GiB scale with the batch, 6 GiB short, and the backward's gradients (10 GiB) and Adam's state
    # (20 GiB) not yet allocated: (60 - 6 - 30) / 60, stated as an upper bound
    assert "A batch of at most 40% of this one can fit, and that is an upper bound" in text
    assert "partway through the forward" in text and "checkpoint" in f.fix.snippet


def test_out_of_memory_with_the_free_memory_in_pieces_is_fragmentation() -> None:
    f = memory_findings(_analysis(oom=_oom(reserved=80 * GiB, allocated=70 * GiB)))[0]
    assert "with expandable segments the 8 GiB fits" in " ".join(f.evidence)
    assert "expandable_segments:True" in f.fix.snippet


def test_the_oom_comes_first_then_critical_then_by_memory_freed() -> None:
    census = Census(step=8, parameters=4 * GiB, gradients=4 * GiB, optimizer_state=20 * GiB)
    leak = Leak(300 * MiB, 30, 9 * GiB, 1.0, (), 250.0)
    b = replace(
        _breakdown(activations=36 * GiB, parameters=2 * GiB, optimizer_state=20 * GiB), modules=BLOCKS
    )
    m = _analysis(oom=_oom(), leak=leak, census=census, breakdown=b, peak_allocated=b.peak)
    assert _ids(m) == ["out_of_memory", "memory_leak", "activation_checkpointing", "optimizer_state_memory"]


def test_checkpointing_names_the_repeated_blocks_even_below_a_wrapper_that_shares_its_parent() -> None:
    """GPT-2's shape: the blocks keep ~77% (under transformer), the LM head's logits the rest: the
    split is at transformer/lm_head, yet the modules to checkpoint are the twelve blocks."""
    tree = (
        ModuleMemory("GPT2LMHeadModel", "GPT2LMHeadModel", 13 * GiB),
        ModuleMemory("GPT2LMHeadModel.transformer", "GPT2Model", 10 * GiB),
        ModuleMemory("GPT2LMHeadModel.lm_head", "Linear", 2 * GiB),
        *(ModuleMemory(f"GPT2LMHeadModel.transformer.h.{i}", "GPT2Block", 800 * MiB) for i in range(12)),
        *(
            ModuleMemory(f"GPT2LMHeadModel.transformer.h.{i}.mlp.c_fc", "Conv1D", 100 * MiB)
            for i in range(12)
        ),
    )
    b = replace(_breakdown(activations=12 * GiB, parameters=GiB), modules=tree)
    (f,) = memory_findings(_analysis(breakdown=b, peak_allocated=b.peak))
    assert "12 GPT2Block modules (GPT2LMHeadModel.transformer.h.0–11)" in " ".join(f.evidence)
