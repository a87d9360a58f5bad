"""Predicted vs real: for each case of the planted-bottleneck zoo, the doctor's `est_saving_pct` on the
slow trace beside the saving measured on the GPU (slow → fixed, per sample, without the profiler), with
the reason wherever they differ by more than a factor of two.

    .venv/bin/python benchmarks/zoo_predicted_vs_real.py
Reads tests/fixtures/zoo (recorded by tools/record_zoo.py); writes benchmarks/results/zoo_predicted_vs_real.{json,md}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpudoctor.analysis.summary import analyze  # noqa: E402
from gpudoctor.rules import diagnose  # noqa: E402
from gpudoctor.trace import load_trace  # noqa: E402

ZOO = ROOT / "tests/fixtures/zoo"
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
    "memory_pressure": "0 by design: both variants run the same step; the difference is run-to-run noise",
    "profiler_distortion": "0 by design: both variants run the same step unprofiled; the difference is "
    "run-to-run noise",
}


def row(rule: str, case: dict[str, Any]) -> dict[str, Any]:
    slow = case["slow"]
    d = diagnose(
        analyze(load_trace(ZOO / slow["file"]), unprofiled_step_us=slow["unprofiled_step_us"]["median"])
    )
    finding = d.get(rule)
    predicted = finding.est_saving_pct if finding else 0.0
    real = 100 * case["measured_saving"]
    ratio = predicted / real if real > 0 else None
    diverges = real > 0 and predicted > 0 and not (0.5 <= predicted / real <= 2.0)
    return {
        "rule": rule,
        "top_finding": d.findings[0].id if d.findings else None,
        "predicted_saving_pct": predicted,
        "measured_saving_pct": real,
        "ratio": ratio,
        "diverges_2x": diverges or (real > 5 and predicted == 0) or (predicted > 5 and real <= 0),
        "reason": REASONS.get(rule, ""),
        "slow_step_us": slow["unprofiled_step_us"]["median"],
        "fixed_step_us": case["fixed"]["unprofiled_step_us"]["median"],
        "samples_per_step": case["samples_per_step"],
    }


def main() -> int:
    manifest = json.loads((ZOO / "manifest.json").read_text())
    rows = [row(rule, case) for rule, case in sorted(manifest["cases"].items())]
    env = next(iter(manifest["cases"].values()))["slow"].get("environment") or manifest.get("environment")
    OUT.with_suffix(".json").write_text(json.dumps({"environment": env, "cases": rows}, indent=1))
    lines = [
        "| case | first finding | predicted saving | measured saving | ratio | why they differ |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "—"
        mark = " **(> 2×)**" if r["diverges_2x"] else ""
        lines.append(
            f"| `{r['rule']}` | `{r['top_finding']}` | {r['predicted_saving_pct']:.1f}% | "
            f"{r['measured_saving_pct']:.1f}% | {ratio}{mark} | {r['reason']} |"
        )
    OUT.with_suffix(".md").write_text(
        "# Predicted vs real saving on the zoo\n\nMeasured on "
        f"{(env or {}).get('device_name', 'the GPU')}: unprofiled step time, slow → fixed, per sample.\n\n"
        + "\n".join(lines)
        + "\n"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
