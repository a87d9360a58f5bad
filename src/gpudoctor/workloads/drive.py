"""Run a built-in workload as a plain script, so that `gpudoctor run` can profile it like a user's:

    gpudoctor run -m gpudoctor.workloads.drive sync_every_step [--steps N] [--cpu]

Each step ends with what `gpudoctor.step()` does (workloads without an optimizer have no other step
boundary), reached without importing `gpudoctor` itself: the workloads sit below the runner.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> None:
    from gpudoctor import workloads  # imports torch: only when run

    parser = argparse.ArgumentParser(prog="python -m gpudoctor.workloads.drive", description=__doc__)
    parser.add_argument("workload", help="a built-in workload name (gpudoctor demo --list)")
    parser.add_argument(
        "--steps", type=int, default=100, help="steps to run (gpudoctor run stops it earlier)"
    )
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even if there is a GPU")
    args = parser.parse_args(argv)
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    step = workloads.get(args.workload).build(device, small=device.type != "cuda")
    try:
        for _ in range(args.steps):
            step.run()
            mark_step()
    finally:
        step.close()


def mark_step() -> None:
    """`gpudoctor.step()`: the end of a step for the capture of `gpudoctor run`, whose module is loaded
    only while it runs; a no-op otherwise."""
    capture = sys.modules.get("gpudoctor.runner.capture")
    if capture is not None:
        capture.step()


if __name__ == "__main__":
    main()
