"""The user's side of `gpudoctor fix`'s recommendation, for benchmarks/fix_vs_expert.py: `fix.diff` applied
by the `patch` command to a copy of the workload (its folder's scripts and every file the diff names), so
that the patched script can be timed plainly, as its user would run it; and the proof's figure (fix.json's
`proof`, where the fix made one) set against that independent timing — their agreement (goal ±10%) and
each one's share of the expert's gain."""

from __future__ import annotations

import math
import shutil
import statistics
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

AGREEMENT = 0.10  # the proof's speedup within this share of the patched copy's plain timing


@dataclass(frozen=True)
class PatchedCopy:
    """Where the patched script is (None where there is none to time) and how the patch went."""

    script: str | None
    applied: bool
    why: str | None  # why there is no patched script: no diff, an empty one, a hunk that failed …
    files: tuple[str, ...]  # the files the diff names, relative to the copy's root
    patch_output: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"files": list(self.files)}


def diff_files(diff: str) -> list[str]:
    """The files a unified diff changes, from its `+++ b/…` lines (git-style prefix dropped)."""
    names = []
    for line in diff.splitlines():
        if line.startswith("+++ "):
            name = line[4:].split("\t")[0].strip()
            names.append(name[2:] if name.startswith("b/") else name)
    return list(dict.fromkeys(n for n in names if n != "/dev/null"))


def _safe(name: str) -> PurePosixPath | None:
    """The diff's file name as a path inside the copy; None for one that would leave it."""
    path = PurePosixPath(name.lstrip("/"))
    return None if not path.parts or ".." in path.parts else path


def make_patched_copy(script: Path, diff_path: Path, copy_root: Path, root: Path) -> PatchedCopy:
    """Copy `script`'s folder's scripts and each file `diff_path` names (relative to `root`, the folder
    `gpudoctor fix` ran in, or absolute) into `copy_root`, laid out as under `root`, then apply the
    diff there with `patch -p1`. The script's copy is what to time."""
    if not diff_path.is_file():
        return PatchedCopy(None, False, f"no {diff_path.name} in the fix directory", (), "")
    diff = diff_path.read_text()
    if not diff.strip():
        return PatchedCopy(None, False, f"{diff_path.name} is empty: nothing to apply", (), "")
    names = diff_files(diff)
    unsafe = [n for n in names if _safe(n) is None]
    if unsafe:
        return PatchedCopy(
            None, False, f"the diff names paths outside its folder: {unsafe}", tuple(names), ""
        )
    if copy_root.exists():
        shutil.rmtree(copy_root)
    relative_script = script.resolve().relative_to(root)
    for source in script.parent.glob("*.py"):
        _copy(source, copy_root / relative_script.parent / source.name)
    for name in names:
        rel = _safe(name)
        assert rel is not None
        source = next((p for p in (root / rel, Path("/") / rel) if p.is_file()), None)
        if source is None:
            return PatchedCopy(None, False, f"the diff names {name}, found neither under {root} nor at /{rel}",
                               tuple(names), "")  # fmt: skip
        _copy(source, copy_root / rel)
    return _apply(diff_path, copy_root, copy_root / relative_script, tuple(names))


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def _apply(diff_path: Path, copy_root: Path, script: Path, names: tuple[str, ...]) -> PatchedCopy:
    cmd = ["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-d", str(copy_root),
           "-i", str(diff_path.resolve())]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        return PatchedCopy(None, False, "the patch command is not installed", names, "")
    output = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        why = f"patch -p1 exited {done.returncode}: {output[-400:]}"
        return PatchedCopy(None, False, why, names, output)
    return PatchedCopy(str(script), True, None, names, output)


def proof_figures(proof: dict[str, Any] | None) -> dict[str, Any] | None:
    """The proof's speedup (the script's plain processes against the patched copy's), its interval and
    verdict, from fix.json's `proof`; None where the fix made none."""
    if not isinstance(proof, dict):
        return None
    speedup = proof.get("speedup")
    if speedup is None and proof.get("script_us") and proof.get("patched_us"):
        speedup = proof["script_us"] / proof["patched_us"]
    return {
        "speedup": speedup,
        "speedup_ci": [proof["speedup_low"], proof["speedup_high"]]
        if proof.get("speedup_low") is not None and proof.get("speedup_high") is not None
        else None,
        "verdict": proof.get("verdict"),
        "recommended": proof.get("recommended"),
        "pairs": len(proof.get("pairs") or []),
        "script_ms": proof["script_us"] / 1e3 if proof.get("script_us") else None,
        "patched_ms": proof["patched_us"] / 1e3 if proof.get("patched_us") else None,
    }


def share(speedup: float | None, expert: float | None, no_gain: float) -> float | None:
    """(speedup − 1) / (the expert's speedup − 1); None where the expert gains nothing (within
    `no_gain` of 1)."""
    if speedup is None or expert is None or expert <= 1 + no_gain:
        return None
    return (speedup - 1) / (expert - 1)


def proof_check(proof: dict[str, Any] | None, timing: dict[str, Any], no_gain: float) -> dict[str, Any]:
    """The proof's figure against the patched copy timed plainly by the benchmark (both: the script as
    written over the patched script): their ratio less one (`proof_vs_patched`), whether it is within
    ±AGREEMENT, and the share of the expert's gain by each."""
    figures = proof_figures(proof)
    patched, expert = timing.get("patched_speedup"), timing.get("expert_speedup")
    proven = figures["speedup"] if figures else None
    check: dict[str, Any] = {
        "proof": figures,
        "patched_speedup": patched,
        "share_of_expert_by_patched": share(patched, expert, no_gain),
        "share_of_expert_by_proof": share(proven, expert, no_gain),
        "proof_vs_patched": proven / patched - 1 if proven and patched else None,
        "agreement_goal": AGREEMENT,
    }
    check["proof_agrees"] = (
        abs(check["proof_vs_patched"]) <= AGREEMENT if check["proof_vs_patched"] is not None else None
    )
    check["timers"] = timers_compared(proof, timing.get("runs"))
    return check


def timers_compared(proof: dict[str, Any] | None, runs: dict[str, Any] | None) -> dict[str, Any] | None:
    """The benchmark's speedup of the patched copy (its plain and patched processes, `runs`) against the
    proof's (its process pairs): their ratio and its 95% interval (Welch's t on the log speedups, the
    proof's from its pairs' log ratios, the benchmark's from its two sides' log means, with
    Welch–Satterthwaite's degrees of freedom). An interval that holds 1 means the two figures are apart
    by no more than their processes' own spread allows. Beside it, each side's step under the benchmark
    over the proof's (`script_step`, `patched_step`): which side moved. None under two processes on a
    side or two pairs."""
    from gpudoctor.timing.paired import t_quantile

    pairs = [(p["script_us"], p["patched_us"]) for p in (proof or {}).get("pairs") or []
             if p.get("script_us") and p.get("patched_us")]  # fmt: skip
    bench = {side: [1e6 * sum(s for s, _ in w) / sum(n for _, n in w)
                    for w in (runs or {}).get(side) or [] if w and sum(n for _, n in w)]
             for side in ("plain", "patched")}  # fmt: skip
    if len(pairs) < 2 or min(len(v) for v in bench.values()) < 2:
        return None
    ratios = [math.log(a / b) for a, b in pairs]
    logs = {side: [math.log(v) for v in values] for side, values in bench.items()}
    parts = [(statistics.variance(ratios) / len(ratios), len(ratios))] + [
        (statistics.variance(v) / len(v), len(v)) for v in logs.values()
    ]
    center = statistics.fmean(logs["plain"]) - statistics.fmean(logs["patched"]) - statistics.fmean(ratios)
    var = sum(v for v, _ in parts)
    half = 0.0
    if var > 0:
        df = var**2 / sum(v**2 / (n - 1) for v, n in parts)
        half = t_quantile(0.975, df) * math.sqrt(var)

    def step(side: str, index: int) -> float:
        ours = statistics.fmean(math.log(pair[index]) for pair in pairs)
        return math.exp(statistics.fmean(logs[side]) - ours)

    ci = [math.exp(center - half), math.exp(center + half)]
    return {"proof_pairs": len(pairs), "benchmark_processes": {k: len(v) for k, v in bench.items()},
            "benchmark_over_proof_speedup": math.exp(center), "ci": ci, "differ": not ci[0] <= 1 <= ci[1],
            "script_step": step("plain", 0), "patched_step": step("patched", 1)}  # fmt: skip
