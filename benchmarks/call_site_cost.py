"""What counting a call by its line costs in every round of `gpudoctor fix` (each `.item()` of the loop on a
GPU tensor, each torch.distributions object built with its arguments validated): `call_site()` with the
library's folders and each file's verdict remembered, beside the same call working them out each time (as
it did before), in one process; and a loop's `.item()` under the fix's Observer beside it bare.

    PYTHONPATH=src python3 benchmarks/call_site_cost.py --out benchmarks/results/call_site_cost.json
"""

from __future__ import annotations

import argparse
import json
import platform
import timeit
from pathlib import Path

import torch

from gpudoctor.fixes.observe import Observer
from gpudoctor.runner import hooks


def per_call_us(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def forgetting() -> object:
    hooks._library_dirs.cache_clear()
    hooks.is_user_file.cache_clear()
    return hooks.call_site()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    a = parser.parse_args()
    t = torch.ones(())
    bare = per_call_us(t.item, 20_000)
    finder = hooks.RootFinder(until=lambda: True)
    observer = Observer(finder, all_devices=True)  # counts .item() on the CPU too
    with hooks.patched([observer]):
        observed = per_call_us(t.item, 20_000)
    result = {
        "call_site_us": per_call_us(hooks.call_site, 20_000),
        "call_site_uncached_us": per_call_us(forgetting, 500),
        "item_bare_us": bare,
        "item_observed_us": observed,
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "machine": platform.machine(), "processor": platform.processor() or None},
    }  # fmt: skip
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
