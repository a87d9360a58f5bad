"""Where does a gap between gpudoctor's kept fixes and the expert's script come from? Time several
configurations of one `fix_workloads` script with `plain_timer.py` (gpudoctor's fixes applied as its child
applies them, or the script's `--expert` form), rounds alternating the configurations' order, each a fresh
process, and print each one's mean step and its ratio to the first.

    PYTHONPATH=src python3 benchmarks/config_gap.py --workload timm_convnext_fp32 --out gap \\
        --config gd=workers:8,autocast,pin_memory,compile \\
        --config gd+fused=workers:8,autocast,pin_memory,compile,fused_optimizer \\
        --config expert=@expert --config plain=@plain

Each process is fix_vs_expert's (`time_config`: the same timer, its output under OUT/timing/, stopped
with its threads' stacks after `--timeout-s`); the timer's warm-up (`--warmup`, then the batches a
loader's workers hold in flight) is spent before the windows.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import fix_vs_expert  # beside this file: its timer's command line and bounded wait, one for both


def parse_config(text: str) -> tuple[str, list[str], bool]:
    label, _, spec = text.partition("=")
    if not label or not spec:
        raise argparse.ArgumentTypeError(f"--config LABEL=FIXES, LABEL=@expert or LABEL=@plain, not {text!r}")
    if spec in ("@expert", "@plain"):
        return label, [], spec == "@expert"
    if spec.startswith("@"):
        raise argparse.ArgumentTypeError(f"--config: {spec!r} is neither @expert nor @plain")
    return label, [f for f in spec.split(",") if f], False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", required=True, choices=list(fix_vs_expert.WORKLOADS))
    p.add_argument("--config", type=parse_config, action="append", required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--window-s", type=float, default=1.0)
    p.add_argument("--windows", type=int, default=6)
    p.add_argument("--timeout-s", type=float, default=240.0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--small", action="store_true", help="the workload's --small form (a CPU check)")
    a = p.parse_args()
    # fix_vs_expert.time_config's names for these options; its runs under OUT/timing/
    a.timer_warmup, a.timer_timeout_s, a.smoke = a.warmup, a.timeout_s, a.small
    a.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in a.config}
    for k in range(a.rounds):
        order = a.config if k % 2 == 0 else a.config[::-1]
        for label, fixes, expert in order:
            t0 = time.perf_counter()
            stem = re.sub(r"[^A-Za-z0-9_.-]", "_", label)  # a device run brings back plain names only
            r = fix_vs_expert.time_config(a.workload, stem, fixes, expert, a.out, a, k)
            runs[label].append(r)
            step = r.get("step_s")
            print(f"round {k} {label:<16} {'-' if step is None else f'{step * 1e3:.1f} ms'} "
                  f"windows {[w[1] for w in r.get('windows') or []]} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)  # fmt: skip
    table: dict[str, Any] = {}
    first = None
    for label, fixes, expert in a.config:
        secs = sum(w[0] for r in runs[label] for w in r.get("windows") or [])
        steps = sum(w[1] for r in runs[label] for w in r.get("windows") or [])
        mean = secs / steps if steps else None
        first = first if first is not None else mean
        table[label] = {"fixes": fixes, "expert": expert, "step_ms": mean and mean * 1e3,
                        "per_round_ms": [r.get("step_s") and r["step_s"] * 1e3 for r in runs[label]],
                        "ratio_to_first": mean / first if mean and first else None}  # fmt: skip
    import torch

    result = {"workload": a.workload, "rounds": a.rounds, "warmup": a.warmup, "windows": a.windows,
              "window_s": a.window_s, "table": table,
              "environment": {"torch": torch.__version__, "python": sys.version.split()[0],
                              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}}  # fmt: skip
    (a.out / "config_gap.json").write_text(json.dumps(result, indent=1))
    for label, row in table.items():
        ms = row["step_ms"]
        ratio = row["ratio_to_first"]
        print(f"{label:<16} {'-' if ms is None else f'{ms:.1f} ms':>9} "
              f"{'' if ratio is None else f'{ratio:.3f}x'}  rounds {[round(x, 1) if x else None for x in row['per_round_ms']]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
