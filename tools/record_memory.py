"""Record the memory fixtures on a GPU: each planted case of benchmarks/memory_cases run under
`gpudoctor run` in a fresh process; what its memory recording wrote (the record's `memory_run`, the
allocator snapshots under memory/) copied into <out>/<case>/, and <out>/manifest.json with the device,
the versions, each case's command, first memory finding and file sizes. Run from the repo root:

    PYTHONPATH=src python3 tools/record_memory.py [--out DIR] [--only leak,oom,...] [--max-frames N]
    (--smoke: tiny sizes on the CPU into --out, to check the plumbing)

(default out: tests/fixtures/memory; about 2-3 minutes on an H100 for the five cases). `gpudoctor run`
needs msgspec importable, as every GPU tool here does.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks" / "memory_cases"))
sys.path.insert(0, str(REPO / "src"))
from cases import CASES, RUN_OPTIONS, command  # noqa: E402

from gpudoctor.runner.rundir import read_snapshot  # noqa: E402

DEFAULT_OUT = REPO / "tests" / "fixtures" / "memory"


def run_case(name: str, work: Path, smoke: bool = False) -> tuple[dict[str, Any], float]:
    """`gpudoctor run` on the case in a fresh process; its record and the seconds it took."""
    out = work / name
    cmd = [sys.executable, "-m", "gpudoctor", "run", "--out", str(out), *RUN_OPTIONS, *command(name, smoke)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - t0
    record_file = out / "record.json"
    if not record_file.is_file():
        raise RuntimeError(
            f"{name}: no record.json (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return json.loads(record_file.read_text()), seconds


def keep_frames(value: Any, limit: int) -> Any:
    """The snapshot with each frames list cut to its `limit` innermost frames."""
    if isinstance(value, dict):
        return {
            k: (v[:limit] if k == "frames" and isinstance(v, list) else keep_frames(v, limit))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [keep_frames(v, limit) for v in value]
    return value


def copy_case(
    name: str, record: dict[str, Any], run_dir: Path, dest: Path, max_frames: int | None
) -> dict[str, int]:
    """The case's fixture files; their sizes in bytes."""
    memory = dict(record.get("memory_run") or {})
    if record.get("error"):
        memory["error"] = record["error"]
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "memory").mkdir(parents=True)
    (dest / "memory_run.json").write_text(json.dumps(memory, indent=1))
    files = [meta["file"] for meta in (memory.get("snapshots") or {}).values()]
    files += [memory["timeline"]["file"]] if memory.get("timeline") else []
    for rel in files:
        doc = read_snapshot(run_dir, rel)
        if max_frames is not None:
            doc = keep_frames(doc, max_frames)
        with gzip.GzipFile(dest / rel, "wb", compresslevel=9, mtime=0) as f:
            f.write(json.dumps(doc, separators=(",", ":")).encode())
    return {str(p.relative_to(dest)): p.stat().st_size for p in sorted(dest.rglob("*")) if p.is_file()}


def environment() -> dict[str, Any]:
    import torch

    return {
        "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", default=",".join(CASES), help="cases, comma-separated")
    parser.add_argument("--max-frames", type=int, default=None, help="keep only the innermost N frames")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes on the CPU: checks the plumbing only"
    )
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"cases": {}}
    manifest.update(environment())
    with tempfile.TemporaryDirectory(prefix="gpudoctor-memory-") as tmp:
        for name in names:
            record, seconds = run_case(name, Path(tmp), args.smoke)
            findings = json.loads((Path(tmp) / name / "memory.json").read_text()).get("findings", [])
            sizes = copy_case(name, record, Path(tmp) / name, args.out / name, args.max_frames)
            manifest.setdefault("recorded_per_case", {})[name] = manifest["recorded"]
            manifest["cases"][name] = {
                "command": CASES[name][0],
                "expected_first": CASES[name][1],
                "first_finding": findings[0]["id"] if findings else None,
                "outcome": record.get("outcome"),
                "seconds": round(seconds, 1),
                "files": sizes,
            }
            print(
                f"{name}: {seconds:.0f} s, first finding {manifest['cases'][name]['first_finding']}, "
                f"{sum(sizes.values()) / 1e6:.2f} MB"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
