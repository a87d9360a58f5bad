"""`classify.searcher(pattern)` answers exactly as `pattern.search` does, for every pattern of the
classifier, on every kernel and op name of the recorded traces and on names made to trip it (mixed
case, Unicode case folds, pieces of the patterns themselves); a pattern it cannot lower-case safely is
searched as it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpudoctor.analysis import classify, cpu, step_breakdown
from gpudoctor.trace import load_trace

TRACES = sorted((Path(__file__).parent / "fixtures" / "traces").glob("*.json.gz"))
PATTERNS = [
    v
    for module in (classify, cpu, step_breakdown)
    for v in vars(module).values()
    if isinstance(v, re.Pattern)
]


@pytest.fixture(scope="module")
def names() -> list[str]:
    seen = {n for path in TRACES for n in load_trace(path).names}
    tricky = [
        "ncclDevKernel_AllReduce_Sum_f32", "NCCL", "ALLREDUCE", "aLlGaThEr", "volta_H884GEMM_256x128",
        "S1688GEMM", "xS1688gemm", "tensorop_s1688gemm", "Conv2d", "CONVERT", "convert", "\u212a", "nccl\u212a",
        "reduce\u017fcatter", "REDUCE\u017fCATTER", "İnccl", "DataLoader.__next__", "DATALOADER x __NEXT__",
        "aten::Conv2d", "Optimizer.step#SGD.step", "CUDNN", "dgrad_engine<FLOAT, 128>", "", "\n", "Cijk_Ailk_MI16x16x4_",
    ]  # fmt: skip
    pieces = [p.pattern[i : i + 8] for p in PATTERNS for i in range(0, len(p.pattern), 5)]
    return sorted(seen) + tricky + pieces + [p.upper() for p in pieces] + [p.title() for p in pieces]


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.pattern[:30])
def test_the_searcher_answers_as_the_pattern(pattern: re.Pattern[str], names: list[str]) -> None:
    search = classify.searcher(pattern)
    assert search is classify.searcher(pattern)  # one function per pattern: it keys a memo
    wrong = [n for n in names if search(n) != bool(pattern.search(n))]
    assert wrong == []


def test_patterns_it_cannot_lower_case_are_searched_as_they_are() -> None:
    for source in (r"\x41bc", r"[A-Z]x", r"(?P<Name>ab)", r"(?s)a.b", r"\101"):
        assert classify._lowered_search(re.compile(source, re.I)) is None
    assert classify._lowered_search(re.compile("AllReduce")) is None  # case-sensitive already
    assert classify._lowered_search(classify.COMMUNICATION) is not None
