"""The planted memory cases: the script and arguments of each, and the memory finding gpudoctor should
give first. Shared by tools/record_memory.py (fixtures) and benchmarks/memory_truth.py (acceptance)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (script and its arguments, the first memory finding expected)
CASES: dict[str, tuple[list[str], str]] = {
    "activations": (["train_lm.py"], "activation_checkpointing"),
    "oom": (["train_lm.py", "--batch-size", "1024"], "out_of_memory"),
    "leak": (["leak.py"], "memory_leak"),
    "fragmentation": (["fragmentation.py"], "memory_fragmentation"),
    "gpt2": (["gpt2_train.py"], "activation_checkpointing"),
}
# what `gpudoctor run` is given for every case: a short light phase, three traced steps
RUN_OPTIONS = ["--warmup", "3", "--light-steps", "10", "--light-seconds", "0.5", "--steps", "3", "--no-nvml"]


# --smoke: tiny sizes on the CPU, to check the scripts and the tools that run them (no GPU figures)
SMOKE: dict[str, list[str]] = {
    "activations": [
        "--device",
        "cpu",
        "--batch-size",
        "2",
        "--seq-len",
        "64",
        "--layers",
        "2",
        "--d-model",
        "64",
    ],
    "oom": ["--device", "cpu", "--batch-size", "2", "--seq-len", "64", "--layers", "2", "--d-model", "64"],
    "leak": ["--device", "cpu", "--batch-size", "2", "--seq-len", "64"],
    "fragmentation": ["--device", "cpu", "--batch-size", "2", "--max-len", "128"],
    "gpt2": ["--device", "cpu", "--batch-size", "1", "--seq-len", "64", "--layers", "1"],
}


def command(name: str, smoke: bool = False) -> list[str]:
    """The case's command line, the script as an absolute path."""
    script, *args = CASES[name][0]
    if smoke:
        args = [a for a in args if a != "--batch-size" and not a.isdigit()] + SMOKE[name]
    return [str(HERE / script), *args]
