"""gpudoctor's step breakdown and SM-efficiency / occupancy summary against what TensorBoard's PyTorch
profiler plugin (torch-tb-profiler) showed for the same traces: its own end-to-end test expectations.

The traces and the expectations are the plugin's, from pytorch/kineto before it deleted `tb_plugin/`
(commit 94979607^): two ResNet-50 training runs on a Tesla V100 with PyTorch 1.9, DataLoader num_workers 0
and 4, steps #5-#10 each (`tb_plugin/samples/resnet50_num_workers_{0,4}/worker0.1623143089861` and
`…/worker0.1623212756351`), and `tb_plugin/test/result_check_file.txt` (line 0: the num_workers_0 run's
overview, line 5: the num_workers_4 run's). Get them from a clone of pytorch/kineto:

    C=94979607^
    for f in resnet50_num_workers_0/worker0.1623143089861 resnet50_num_workers_4/worker0.1623212756351; do
        git -C kineto show $C:tb_plugin/samples/$f.pt.trace.json.gz > DIR/$(basename $(dirname $f)).json.gz
    done
    git -C kineto show $C:tb_plugin/test/result_check_file.txt > DIR/result_check_file.txt
    .venv/bin/python benchmarks/tb_plugin_parity.py DIR

PyTorch 1.9 wrote its `ProfilerStep#N` markers with category "Operator"; they are read as the step markers
newer PyTorch writes (`user_annotation`). Results: benchmarks/results/tb_plugin_parity.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

from gpudoctor.analysis.step_breakdown import ROLE_LABELS
from gpudoctor.analysis.summary import analyze
from gpudoctor.trace import load_trace

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "tb_plugin_parity.json"
RUNS = {"resnet50_num_workers_0": 0, "resnet50_num_workers_4": 5}  # run -> line of result_check_file.txt
SHOWN = ("kernel", "memcpy", "memset", "runtime", "dataloader", "cpu_exec", "other")


def expected(line: str) -> dict[str, Any]:
    """The plugin's per-step breakdown (µs) and its GPU summary (%), from one overview line."""
    doc = json.loads(line)
    names = [c["name"] for c in doc["steps"]["columns"] if "name" in c][1:]
    steps = {int(r[0]): dict(zip(names, r[1::2], strict=True)) for r in doc["steps"]["rows"]}
    summary = {d["title"]: d["value"] for d in doc["gpu_metrics"]["data"]}
    return {
        "steps": steps,
        "sm_efficiency_pct": float(summary["Est. SM Efficiency"].rstrip(" %")),
        "occupancy_pct": float(summary["Est. Achieved Occupancy"].rstrip(" %")),
    }


def measured(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    for e in doc["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["cat"] = "user_annotation"
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / path.name
        with gzip.open(copy, "wt") as fh:
            json.dump(doc, fh)
        b = analyze(load_trace(copy)).step_breakdown
    assert b is not None
    return {
        "steps": {s.number: {ROLE_LABELS[r]: s.roles_us[r] for r in SHOWN} for s in b.steps},
        "sm_efficiency_pct": b.mean_sm_efficiency_pct,
        "occupancy_pct": b.mean_of("occupancy_pct"),
    }


def compare(folder: Path) -> dict[str, Any]:
    lines = (folder / "result_check_file.txt").read_text().splitlines()
    out: dict[str, Any] = {}
    for run, line in RUNS.items():
        want, got = expected(lines[line]), measured(folder / f"{run}.json.gz")
        worst = max(
            abs(got["steps"][n][role] - us)
            for n, roles in want["steps"].items()
            for role, us in roles.items()
        )
        out[run] = {
            "steps": sorted(want["steps"]),
            "largest_difference_us": round(worst, 1),
            "per_step": {
                n: {"tb_plugin": want["steps"][n], "gpudoctor": got["steps"][n]} for n in want["steps"]
            },
            "sm_efficiency_pct": {
                "tb_plugin": want["sm_efficiency_pct"],
                "gpudoctor": got["sm_efficiency_pct"],
            },
            "occupancy_pct": {"tb_plugin": want["occupancy_pct"], "gpudoctor": got["occupancy_pct"]},
        }
        print(
            f"{run}: largest per-step difference {worst:.0f} µs; SM efficiency "
            f"{got['sm_efficiency_pct']:.2f}% (plugin {want['sm_efficiency_pct']}%), occupancy "
            f"{got['occupancy_pct']:.2f}% (plugin {want['occupancy_pct']}%)"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="the two traces and result_check_file.txt (see above)")
    args = p.parse_args(argv)
    RESULT.write_text(json.dumps(compare(args.folder), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
