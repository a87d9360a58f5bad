"""benchmarks/aa_noise.py --script: the noise floor of `gpudoctor fix` measured on a script of one's own
(any path, named by its file's stem), beside the repository's fix workloads."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import aa_noise  # noqa: E402


def test_a_given_script_runs_as_it_is_and_a_workload_name_from_the_fix_workloads(tmp_path: Path) -> None:
    script = tmp_path / "my_train.py"
    script.write_text("pass\n")
    a = argparse.Namespace(script=[script], smoke=True)
    # a script of one's own: its resolved path, nothing added (it has no --small)
    assert aa_noise.script_of("my_train", a) == [str(script.resolve())]
    # a fix workload: the repository's file, shrunk under --smoke
    assert aa_noise.script_of("item_logging", a) == [
        str(REPO / "benchmarks" / "fix_workloads" / "item_logging.py"),
        "--small",
    ]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, str(REPO / "benchmarks" / "aa_noise.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_a_missing_script_or_two_workloads_of_one_name_are_one_line_each(tmp_path: Path) -> None:
    done = run("--out", str(tmp_path / "o"), "--only", "", "--script", str(tmp_path / "nowhere.py"))
    assert done.returncode == 2 and "no such script" in done.stderr and "Traceback" not in done.stderr
    clash = tmp_path / "item_logging.py"
    clash.write_text("pass\n")
    done = run("--out", str(tmp_path / "o"), "--only", "item_logging", "--script", str(clash))
    assert (
        done.returncode == 2 and "two workloads of one name" in done.stderr and "Traceback" not in done.stderr
    )
    done = run("--out", str(tmp_path / "o"), "--only", "")
    assert done.returncode == 2 and "no workload" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "o").exists()  # nothing measured, nothing written
