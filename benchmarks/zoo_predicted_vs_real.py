"""Predicted vs real: for each case of the planted-bottleneck zoo, the doctor's `est_saving_pct` on the
slow trace beside the saving measured on the GPU (slow → fixed, per sample, without the profiler), with
the reason wherever they differ by more than a factor of two. Each case is also diagnosed without step
markers: the slow trace with its ProfilerStep#N annotations stripped (steps inferred), and, where
`tools/record_zoo.py --no-step-markers` recorded it, the trace of a window run without prof.step().

    .venv/bin/python benchmarks/zoo_predicted_vs_real.py
Reads tests/fixtures/zoo and tests/fixtures/zoo_unmarked (recorded by tools/record_zoo.py); CPU only;
writes benchmarks/results/zoo_predicted_vs_real.{json,md}.
"""

from __future__ import annotations

import gzip
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpudoctor.analysis.summary import analyze  # noqa: E402
from gpudoctor.rules import diagnose  # noqa: E402
from gpudoctor.trace import load_trace  # noqa: E402

ZOO = ROOT / "tests/fixtures/zoo"
UNMARKED = ROOT / "tests/fixtures/zoo_unmarked"
OUT = ROOT / "benchmarks/results/zoo_predicted_vs_real"

# Where a prediction and the measurement part (none by more than 2x on the recorded zoo), why — written
# after reading the recorded traces. An estimate is meant as an upper bound; where the measured saving is
# larger, the fix removed work the rule does not count.
REASONS: dict[str, str] = {
    "attention_materialized": "under: SDPA also removes the fp32 casts and masked_fill passes over the S×S "
    "scores (aten::to / aten::masked_fill), which the rule leaves to unfused_elementwise",
    "host_sync": "under: without syncs the host also overlaps its batch gathering (index, pin) with the GPU; "
    "the bound keeps the profiled host work, which the profiler inflates",
    "unfused_elementwise": "under: the chain fuses into one kernel for 5-6 passes (fusion saves 5/6, the rule "
    "assumes 60% of elementwise and 30% of normalization time)",
    "optimizer_unfused": "under: the fused step also frees the host to run ahead into the next forward",
    "allocator_thrash": "over: the bound counts the allocator calls twice for the device sync of cudaFree; "
    "part of that idle overlaps host work that remains",
    "conv_layout": "over: channels_last batch norm was assumed 60% faster on all NCHW normalization time; "
    "the pooling and the first convolution keep some of theirs",
    "small_batch": "under: the bound is a batch that just fills the GPU (1/fill, 2.5x here); the fixed variant "
    "runs a 64x batch, which also spreads the rest of the launch wait and every per-step cost over more samples",
    "tf32_not_bf16": "over: the bfloat16 GEMMs ran 2.3x faster than TF32's (the rule assumes the peaks' 1.86x), "
    "but autocast's casts of weights and activations into bfloat16 and back around the float32 layer norms "
    "(direct_copy and bfloat16 elementwise kernels, 0.86 ms of the 4.2 ms step) are new work the rule leaves out",
    "memory_pressure": "0 by design: both variants run the same step; the difference is run-to-run noise",
    "profiler_distortion": "0 by design: both variants run the same step unprofiled; the difference is "
    "run-to-run noise",
}


def diagnosed(path: Path, rule: str, unprofiled_us: float, measured: float) -> dict[str, Any]:
    """The first finding, the rule's predicted saving (and its ratio to the `measured` one, a fraction)
    and how the steps were found, on one trace."""
    a = analyze(load_trace(path), unprofiled_step_us=unprofiled_us)
    d = diagnose(a)
    finding = d.get(rule)
    predicted = finding.est_saving_pct if finding else 0.0
    return {
        "top_finding": d.findings[0].id if d.findings else None,
        "predicted_saving_pct": predicted,
        "ratio": predicted / (100 * measured) if measured > 0 else None,
        "steps": len(a.steps),
        "steps_source": a.steps_source.description if a.steps_source else None,
    }


def stripped(path: Path, into: Path) -> Path:
    """The trace without its ProfilerStep#N annotations."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    events = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    out = into / path.name.removesuffix(".gz")
    out.write_text(json.dumps({**doc, "traceEvents": events}))
    return out


def row(rule: str, case: dict[str, Any], unmarked: dict[str, Any], scratch: Path) -> dict[str, Any]:
    slow = case["slow"]
    unprofiled = slow["unprofiled_step_us"]["median"]
    marked = diagnosed(ZOO / slow["file"], rule, unprofiled, case["measured_saving"])
    predicted = marked["predicted_saving_pct"]
    real = 100 * case["measured_saving"]
    ratio = predicted / real if real > 0 else None
    diverges = real > 0 and predicted > 0 and not (0.5 <= predicted / real <= 2.0)
    recorded = unmarked.get(rule)
    return {
        "rule": rule,
        "top_finding": marked["top_finding"],
        "predicted_saving_pct": predicted,
        "measured_saving_pct": real,
        "ratio": ratio,
        "diverges_2x": diverges or (real > 5 and predicted == 0) or (predicted > 5 and real <= 0),
        "reason": REASONS.get(rule, ""),
        "slow_step_us": slow["unprofiled_step_us"]["median"],
        "fixed_step_us": case["fixed"]["unprofiled_step_us"]["median"],
        "device": case.get("device"),
        "samples_per_step": case["samples_per_step"],
        "markers_stripped": diagnosed(
            stripped(ZOO / slow["file"], scratch), rule, unprofiled, case["measured_saving"]
        ),
        "recorded_without_markers": None
        if recorded is None or "slow" not in recorded
        else diagnosed(
            UNMARKED / recorded["slow"]["file"],
            rule,
            recorded["slow"]["unprofiled_step_us"]["median"],
            recorded["measured_saving"],
        ),
    }


def _others(rows: list[dict[str, Any]], env: dict[str, Any] | None) -> str:
    """The cases recorded on another GPU than the manifest's, named."""
    main = (env or {}).get("device_name")
    other = sorted({r["device"] for r in rows if r.get("device") and r["device"] != main})
    named = [f"{', '.join(r['rule'] for r in rows if r.get('device') == d)} on {d}" for d in other]
    return "; ".join(named) or "every case"


def _unmarked(d: dict[str, Any] | None) -> str:
    if d is None:
        return "not recorded"
    ratio = f", ratio {d['ratio']:.2f}" if d["ratio"] is not None else ""
    return f"`{d['top_finding']}`, {d['predicted_saving_pct']:.1f}%{ratio} ({d['steps']} steps inferred)"


def main() -> int:
    manifest = json.loads((ZOO / "manifest.json").read_text())
    unmarked_path = UNMARKED / "manifest.json"
    unmarked = json.loads(unmarked_path.read_text())["cases"] if unmarked_path.exists() else {}
    with tempfile.TemporaryDirectory() as scratch:
        rows = [row(rule, case, unmarked, Path(scratch)) for rule, case in sorted(manifest["cases"].items())]
    env = next(iter(manifest["cases"].values()))["slow"].get("environment") or manifest.get("environment")
    OUT.with_suffix(".json").write_text(json.dumps({"environment": env, "cases": rows}, indent=1))
    lines = [
        "| case | first finding | predicted saving | measured saving | ratio | without markers: first, predicted | "
        "recorded without markers: first, predicted | why they differ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "—"
        mark = " **(> 2×)**" if r["diverges_2x"] else ""
        lines.append(
            f"| `{r['rule']}` | `{r['top_finding']}` | {r['predicted_saving_pct']:.1f}% | "
            f"{r['measured_saving_pct']:.1f}% | {ratio}{mark} | {_unmarked(r['markers_stripped'])} | "
            f"{_unmarked(r['recorded_without_markers'])} | {r['reason']} |"
        )
    OUT.with_suffix(".md").write_text(
        "# Predicted vs real saving on the zoo\n\nMeasured on "
        f"{(env or {}).get('device_name', 'the GPU')} ({_others(rows, env)}): unprofiled step time, slow → fixed, "
        "per sample. "
        "Without markers: the same slow trace with its ProfilerStep#N annotations stripped, steps inferred.\n\n"
        + "\n".join(lines)
        + "\n"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
