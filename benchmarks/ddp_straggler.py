"""Predicted vs measured on a real two-GPU DDP run with a planted straggler (rank 1 spins on the host
for --straggler-ms per step): record with and without the straggler (`tools/record_ddp.py`, alternating,
`--repeats` times each), diagnose each rank of the straggler runs with their unprofiled step times, and
compare every rank's first finding's bound with the step time measured once the straggler is gone.

    PYTHONPATH=src python benchmarks/ddp_straggler.py --out benchmarks/results   (needs 2 GPUs)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpudoctor.analysis.summary import analyze
from gpudoctor.rules import diagnose
from gpudoctor.trace import load_trace

REPO = Path(__file__).resolve().parents[1]
RANKS = ("rank0", "rank1")


def record(straggler_ms: float, out: Path) -> dict[str, Any]:
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    cmd = [sys.executable, str(REPO / "tools" / "record_ddp.py"), "--straggler-ms", str(straggler_ms),
           "--out", str(out), "--timing-steps", "40"]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, capture_output=True, text=True, timeout=300)
    return json.loads((out / "manifest.json").read_text())


def step_ms(manifest: dict[str, Any]) -> float:
    """The run's step time: the ranks step together, so the slower rank's median."""
    return max(manifest["ranks"][r]["unprofiled_step_us"]["median"] for r in RANKS) / 1e3


def diagnosis_of(run_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for r in RANKS:
        trace = load_trace(run_dir / f"{r}.json.gz")
        d = diagnose(analyze(trace, unprofiled_step_us=manifest["ranks"][r]["unprofiled_step_us"]["median"]))
        out[r] = [
            {"id": f.id, "est_saving_pct": f.est_saving_pct, "evidence": list(f.evidence)} for f in d.findings
        ]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--straggler-ms", type=float, default=8.0)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    runs: dict[str, list[float]] = {"straggler": [], "balanced": []}
    diagnoses = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):  # alternating, so drift hits both alike
            for kind, ms in (("straggler", args.straggler_ms), ("balanced", 0.0)):
                run_dir = Path(tmp) / f"{kind}{i}"
                manifest = record(ms, run_dir)
                runs[kind].append(step_ms(manifest))
                if kind == "straggler":
                    diagnoses.append(diagnosis_of(run_dir, manifest))
                    env = manifest["environment"]
    slow, fast = statistics.median(runs["straggler"]), statistics.median(runs["balanced"])
    measured_pct = 100 * (slow - fast) / slow
    rows = []
    for r in RANKS:
        firsts = [d[r][0] for d in diagnoses if d[r]]
        predicted = statistics.median(f["est_saving_pct"] for f in firsts) if firsts else None
        rows.append({"rank": r, "first_findings": sorted({f["id"] for f in firsts}), "predicted_pct": predicted,
                     "measured_pct": measured_pct,
                     "ratio": predicted / measured_pct if predicted and measured_pct > 0 else None})  # fmt: skip
    result = {"schema": "gpudoctor.bench.ddp_straggler/1", "environment": env, "straggler_ms": args.straggler_ms,
              "step_ms": runs, "measured_saving_pct": measured_pct, "ranks": rows, "diagnoses": diagnoses}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ddp_straggler.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{env['device_count']}× {env['device_name']}: step {slow:.2f} ms with the straggler, {fast:.2f} ms "
          f"without → {measured_pct:.1f}% saved")  # fmt: skip
    for row in rows:
        print(f"  {row['rank']}: first finding {', '.join(row['first_findings'])}, predicted up to "
              f"{row['predicted_pct']:.1f}% (ratio {row['ratio']:.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
