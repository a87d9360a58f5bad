"""The light phases recorded under `torchrun -m gpudoctor run` on 2 × H100 and 2 × H200 (DDP and FSDP2
ResNet-50, tests/fixtures/light_settle.json) judged by `runner.settle`: per rank, the whole phase's mean
step (what was reported), the steps left out as unsettled, the kept mean (what is reported now), whether
the rest settled (every quarter within 5% of its mean), beside the plain steps of the same call. CPU only.

    PYTHONPATH=src python3 lab/light_settle_replay.py [--out lab/results/light_settle_replay.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from gpudoctor.runner import settle
from gpudoctor.runner.record import StepTimes

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "light_settle.json"


def judged(times: list[float], plain_us: float | None) -> dict[str, Any]:
    light = settle.settled(StepTimes("cuda_events", tuple(times)), lambda i: None)
    assert light.settling is not None and light.mean_us is not None
    whole = statistics.fmean(times)
    return {
        "steps": len(times),
        "whole_mean_ms": round(whole / 1e3, 2),
        "dropped": len(light.settling.dropped_us),
        "kept_mean_ms": round(light.mean_us / 1e3, 2),
        "settled": light.settling.settled,
        "quarter_means_ms": [round(q / 1e3, 2) for q in light.settling.quarter_means_us],
        "whole_over_plain": round(whole / plain_us, 3) if plain_us else None,
        "kept_over_plain": round(light.mean_us / plain_us, 3) if plain_us else None,
        "notes": settle.notes(light, agreed=True),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "lab" / "results" / "light_settle_replay.json")
    a = p.parse_args()
    recorded = json.loads(FIXTURE.read_text())
    out: dict[str, Any] = {"what": __doc__.split("\n\n")[0], "tolerance": settle.TOLERANCE, "sources": {}}
    for tag, source in recorded["sources"].items():
        cases = {}
        for case, c in source["cases"].items():
            plain = (c.get("plain") or {}).get("mean_us")
            cases[case] = {"plain_mean_ms": round(plain / 1e3, 2) if plain else None,
                           "ranks": [judged(t, plain) for t in c["light_us"]]}  # fmt: skip
            for rank, r in enumerate(cases[case]["ranks"]):
                print(f"{tag:10s} {case:9s} rank {rank}: whole {r['whole_mean_ms']:5.1f} ms, dropped "
                      f"{r['dropped']:2d}, kept {r['kept_mean_ms']:5.1f} ms, settled {r['settled']!s:5s}"
                      + (f", plain {cases[case]['plain_mean_ms']:.1f} ms" if plain else ""))  # fmt: skip
        out["sources"][tag] = {"origin": source["origin"], "cases": cases}
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
