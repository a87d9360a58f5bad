"""The cores each of several GPU queues may use on one host, so that queues timed side by side do not
share cores: each GPU's NUMA-local cores (its PCI device's local_cpulist), split between the GPUs named
that share them in whole physical cores (hyperthread siblings stay together), among the cores this
process may use. One line per GPU: `INDEX CPULIST` (taskset -c's format); nothing where the GPUs or their
cores cannot be read (no nvidia-smi, no sysfs): the queues then run unpinned.

    python3 tools/gpu_cores.py 0 1 2 3
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_PCI = Path("/sys/bus/pci/devices")


def parse_cpulist(text: str) -> list[int]:
    """`0-3,8,10-11` → [0, 1, 2, 3, 8, 10, 11]."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cpus.update(range(int(lo), int(hi) + 1))
        elif part:
            cpus.add(int(part))
    return sorted(cpus)


def cpulist(cpus: list[int]) -> str:
    """[0, 1, 2, 5] → `0-2,5`."""
    out: list[str] = []
    for c in sorted(cpus):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == c - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        elif out and "-" not in out[-1] and int(out[-1]) == c - 1:
            out[-1] = f"{out[-1]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def sysfs_bus(nvidia_bus: str) -> str:
    """nvidia-smi's `00000000:18:00.0` → sysfs's `0000:18:00.0`."""
    domain, rest = nvidia_bus.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def physical_cores(cpus: list[int]) -> list[list[int]]:
    """`cpus` grouped by physical core (thread siblings together), in the order of each core's first cpu."""
    seen: dict[tuple[int, ...], list[int]] = {}
    for c in cpus:
        try:
            siblings = tuple(
                parse_cpulist((SYS_CPU / f"cpu{c}" / "topology" / "thread_siblings_list").read_text())
            )
        except OSError:
            siblings = (c,)
        seen.setdefault(siblings, []).append(c)
    return sorted(seen.values(), key=lambda group: group[0])


def split(cores: list[list[int]], parts: int) -> list[list[int]]:
    """Physical cores split into `parts` contiguous shares, as even as they go."""
    n = len(cores)
    bounds = [round(k * n / parts) for k in range(parts + 1)]
    return [sorted(c for core in cores[bounds[k] : bounds[k + 1]] for c in core) for k in range(parts)]


def assign(local: dict[int, list[int]], allowed: set[int]) -> dict[int, list[int]]:
    """Each GPU's share of its local cores (those allowed), split among the GPUs that share them."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for gpu, cpus in sorted(local.items()):
        groups.setdefault(tuple(c for c in cpus if c in allowed), []).append(gpu)
    out: dict[int, list[int]] = {}
    for cpus, gpus in groups.items():
        if not cpus:
            continue
        for gpu, share in zip(gpus, split(physical_cores(list(cpus)), len(gpus)), strict=True):
            if share:
                out[gpu] = share
    return out


def main(argv: list[str]) -> int:
    wanted = {int(a) for a in argv}
    try:
        rows = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.splitlines()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return 0
    local: dict[int, list[int]] = {}
    for row in rows:
        index, bus = (x.strip() for x in row.split(",", 1))
        if int(index) in wanted:
            try:
                local[int(index)] = parse_cpulist((SYS_PCI / sysfs_bus(bus) / "local_cpulist").read_text())
            except (OSError, ValueError):
                return 0
    for gpu, cpus in sorted(assign(local, set(os.sched_getaffinity(0))).items()):
        print(gpu, cpulist(cpus))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
