"""Does Inductor's `fallback_random` (random ops as eager draws them, how `gpudoctor fix` runs a compiled
function whose numerics must compare) change the speed the user gets without it? `actor_critic`'s
`act()` compiled as its `fix.diff` writes it, validation off, timed in fresh processes alternating with
and without the flag: the mean update over `--timed` updates after `--warm` (one CUDA synchronization and
clock read at each end; defaults: 300 and 1000 with `--small`, 20 and 60 at full size).

    PYTHONPATH=src python3 lab/fallback_random_cost.py --out lab/results/fallback_random_cost.json [--small]

GPU where there is one (the default sizes), else the CPU with `--small`."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "benchmarks" / "fix_workloads" / "actor_critic.py"

CHILD = """
import sys, time, torch
import torch._inductor.config as cfg
cfg.fallback_random = sys.argv[1] == "1"
src = open(sys.argv[2]).read()
src = src.replace("from torch.distributions import Normal\\n",
                  "from torch.distributions import Normal\\ntorch.distributions.Distribution.set_default_validate_args(False)\\n")
src = src.replace("\\nobs = env.observe()\\nfor update in range(args.updates):",
                  "\\nact = torch.compile(act)\\nobs = env.observe()\\nimport time as _t\\n_t0 = None\\n"
                  "for update in range(args.updates):\\n    if update == _warm:\\n        _sync(); _t0 = _t.perf_counter()\\n")
src = src.replace('        print(f"update', '        pass  #')
sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
warm, timed = int(sys.argv[3]), int(sys.argv[4])
sys.argv = ["actor_critic.py", "--updates", str(warm + timed), *sys.argv[5:]]
g = {"__name__": "__main__", "_sync": sync, "_warm": warm}
exec(compile(src, "actor_critic.py", "exec"), g)
sync()
print((time.perf_counter() - g["_t0"]) / timed * 1e3)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--small", action="store_true")
    p.add_argument("--warm", type=int, help="updates before the timed ones (default 300 --small, else 20)")
    p.add_argument("--timed", type=int, help="updates timed (default 1000 --small, else 60)")
    a = p.parse_args()
    extra = ["--small"] if a.small else []
    warm = a.warm if a.warm is not None else (300 if a.small else 20)
    timed = a.timed if a.timed is not None else (1000 if a.small else 60)
    runs: dict[str, list[float]] = {"native": [], "fallback_random": []}
    for k in range(a.rounds):
        for flag, label in (("0", "native"), ("1", "fallback_random"))[:: 1 if k % 2 == 0 else -1]:
            out = subprocess.run([sys.executable, "-c", CHILD, flag, str(WORKLOAD), str(warm), str(timed), *extra],
                                 capture_output=True, text=True, check=True)  # fmt: skip
            runs[label].append(float(out.stdout.split()[-1]))
            print(f"round {k} {label:16s} {runs[label][-1]:.3f} ms an update", flush=True)
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    doc = {"what": "actor_critic's act() compiled, validation off: ms per update with and without fallback_random",
           "device": device, "torch": torch.__version__, "args": extra, "warm": warm, "timed": timed,
           "ms_per_update": runs,
           "mean_ms": {k: statistics.fmean(v) for k, v in runs.items()},
           "fallback_over_native": statistics.fmean(runs["fallback_random"]) / statistics.fmean(runs["native"])}  # fmt: skip
    Path(a.out).write_text(json.dumps(doc, indent=1))
    print(f"fallback_random / native: {doc['fallback_over_native']:.3f}")


if __name__ == "__main__":
    main()
