"""How fast each CPU of this machine runs the same pure-Python loop, in fresh processes pinned with
taskset, several times: whether a process's host speed depends on where it lands (step times of
host-bound loops varied 5.8 to 10.1 ms from one process to the next on the GPU machine).

    python3 lab/host_speed_probe.py --repeats 3 [--script S --args ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

LOOP = (
    "import time\nt=time.perf_counter()\ns=0\nfor i in range(3_000_000): s+=i*i\nprint(time.perf_counter()-t)"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    table: dict[int, list[float]] = {c: [] for c in cpus}
    for _ in range(opts.repeats):
        for c in cpus:
            done = subprocess.run(
                ["taskset", "-c", str(c), sys.executable, "-c", LOOP], capture_output=True, text=True
            )
            table[c].append(float(done.stdout.strip()) * 1e3)
    free = []
    for _ in range(opts.repeats * 2):
        done = subprocess.run([sys.executable, "-c", LOOP], capture_output=True, text=True)
        free.append(float(done.stdout.strip()) * 1e3)
    for c, ms in table.items():
        print(f"cpu {c:2}: " + " ".join(f"{m:6.1f}" for m in ms) + " ms")
    print("unpinned: " + " ".join(f"{m:6.1f}" for m in free) + " ms")
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump({"pinned_ms": table, "unpinned_ms": free, "time": time.time()}, f, indent=1)


if __name__ == "__main__":
    main()
