"""What a user runs to get Holistic Trace Analysis' view of one trace from the command line (HTA has no
command of its own): load it, then the temporal breakdown, the idle-time breakdown, the kernel
breakdown and the kernel launch statistics — the analyses `benchmarks/hta_side.py` times — and print
them, as `gpudoctor analyze` prints its summary. Timed from outside, as a whole process, by
`benchmarks/analyze_vs_hta.py --cli`. Run with the HTA venv's python:

    benchmarks/.venv-hta/bin/python benchmarks/hta_cli.py TRACE
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings


def main(trace: str) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)  # HTA 0.5 on pandas 2.x
    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="hta_cli_") as folder:
        # HTA reads a directory of rank files; a lone file without a rank is rank 0
        os.symlink(
            os.path.abspath(trace),
            os.path.join(folder, "rank0" + (".json.gz" if trace.endswith(".gz") else ".json")),
        )
        analysis = TraceAnalysis(trace_dir=folder)
        temporal = analysis.get_temporal_breakdown(visualize=False)
        idle = analysis.get_idle_time_breakdown(visualize=False)
        kernels = analysis.get_gpu_kernel_breakdown(
            visualize=False, duration_ratio=1.0, num_kernels=10, include_memory_kernels=True
        )
        launches = analysis.get_cuda_kernel_launch_stats(
            runtime_cutoff=50, launch_delay_cutoff=100, visualize=False
        )
    print(temporal.to_string())
    print(idle[0].to_string())
    print(kernels[0].to_string())
    print(kernels[1].head(10).to_string())
    for rank, stats in launches.items():
        print(rank, stats.describe().to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
