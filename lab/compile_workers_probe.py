"""Do Inductor's compile workers slow the first timed steps after a compile served from the cache?
GPT-2's expert configuration (bfloat16, TF32, fused AdamW, model.compile()) timed by plain_timer.py in
fresh processes: one to fill Inductor's cache, then alternately with the workers left running and shut
down at the warm-up's end, each over `--windows` windows of `--window-s` seconds.

    PYTHONPATH=src python3 lab/compile_workers_probe.py --out $OUT/compile_workers_probe.json
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

ROOT = Path(__file__).resolve().parent.parent
TIMER = ROOT / "benchmarks" / "fix_workloads" / "plain_timer.py"
SCRIPT = ROOT / "benchmarks" / "fix_workloads" / "gpt2_train.py"


def timed(keep: bool, a: argparse.Namespace) -> dict:
    out = Path(tempfile.mkdtemp()) / "t.json"
    cmd = [sys.executable, str(TIMER), "--out", str(out), "--warmup", "8", "--window-s", str(a.window_s),
           "--windows", str(a.windows), *(["--keep-compile-workers"] if keep else []), "--", str(SCRIPT),
           "--expert", *(["--small"] if a.smoke else [])]  # fmt: skip
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    )
    subprocess.run(cmd, env=env, capture_output=True, check=False)
    r = json.loads(out.read_text()) if out.exists() else {"windows": [], "step_s": None}
    return {"keep_workers": keep, "window_ms": [1e3 * s / n for s, n in r["windows"]], "step_ms": (r["step_s"] or 0) * 1e3,
            "wall_s": r.get("wall_s"), "device": r.get("device")}  # fmt: skip


def torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--window-s", type=float, default=0.5)
    p.add_argument("--windows", type=int, default=6)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args()
    runs = [dict(timed(False, a), cache="cold")]
    for _ in range(a.pairs):
        for keep in (True, False):
            runs.append(dict(timed(keep, a), cache="warm"))
            a.out.write_text(
                json.dumps({"torch": torch_version(), "cpus": os.cpu_count(), "runs": runs}, indent=1)
            )
    for r in runs:
        print(f"{r['cache']:4} keep={r['keep_workers']!s:5} step {r['step_ms']:7.2f} ms  windows "
              + " ".join(f"{w:.1f}" for w in r["window_ms"]))  # fmt: skip
    for keep in (True, False):
        warm = [
            r["step_ms"] for r in runs if r["cache"] == "warm" and r["keep_workers"] is keep and r["step_ms"]
        ]
        if warm:
            print(
                f"workers {'kept' if keep else 'stopped'}: median step {statistics.median(warm):.2f} ms over {len(warm)}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
