"""tools/bg.sh, which carries long GPU work across device calls: what its `wait` packs for the trip back.
The traces of recorded fixtures (a folder `fx/`, small, the reason for a 2-GPU run) come back; other
profiler traces and files over 8 MiB stay behind (a session lost the quiet 4 × H100 host's straggler
traces when every `trace.json.gz` was left out)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "bg.sh"


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_wait_packs_the_fixtures_traces_and_leaves_the_others(tmp_path: Path) -> None:
    job = tmp_path / "bg" / "a"
    files = {
        "out/mg/fx/straggler/rank-0/trace.json.gz": 1000,
        "out/mg/fx/straggler/rank-0/record.json": 1000,
        "out/mg/multi_gpu.json": 1000,
        "out/fve/fix/gpt2/run/trace.json.gz": 1000,
        "out/fve/fix/gpt2/run/rank0.pt.trace.json.gz": 1000,
        "out/fve/huge.bin": 9 << 20,
        "tree/src/x.py": 10,
    }
    for name, size in files.items():
        (job / name).parent.mkdir(parents=True, exist_ok=True)
        (job / name).write_bytes(b"x" * size)
    for name, text in {"started": "0\n", "rc": "0\n", "log": "done\n"}.items():
        (job / name).write_text(text)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "BG_ROOT": str(tmp_path / "bg"), "OUT": str(out)}
    done = subprocess.run(["bash", str(TOOL), "wait", "a", "1"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with tarfile.open(out / "a.tgz") as tar:
        packed = {m.name.removeprefix("./") for m in tar.getmembers() if m.isfile()}
    assert packed == {
        "out/mg/fx/straggler/rank-0/trace.json.gz",
        "out/mg/fx/straggler/rank-0/record.json",
        "out/mg/multi_gpu.json",
        "started",
        "rc",
        "log",
    }
