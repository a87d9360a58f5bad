"""The user documentation reads as documentation: a short README with the install and the commonest uses,
no work-period or commit narration in README.md, CHANGELOG.md or docs/, relative links that resolve, and a
benchmarks/README.md that names every script under benchmarks/ and every results file it points to."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USER_DOCS = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
SESSION = re.compile(r"\bsessions? \d+", re.IGNORECASE)
# a commit id as it is quoted: 7 to 40 hex digits standing alone (numbers are written with separators)
COMMIT = re.compile(r"(?<![\w./#-])[0-9a-f]{7,40}(?![\w-]|\.\d)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short_and_says_how_to_install_and_use_it() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "pip install ." in text and "make demo" in text and "make test" in text
    for command in ("gpudoctor run", "gpudoctor analyze", "gpudoctor fix"):
        assert f"\n{command} " in text or f"\n$ {command} " in text, command
    assert "docs/results.md" in text


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_work_period_or_commit_id_in_the_user_docs(doc: Path) -> None:
    text = doc.read_text()
    assert not SESSION.findall(text), SESSION.findall(text)
    assert not COMMIT.findall(text), COMMIT.findall(text)


def test_the_narration_patterns_catch_what_they_are_for() -> None:
    assert SESSION.findall("timed in session 37, at 9c738e6") == ["session 37"]
    assert COMMIT.findall("at 9c738e6 and 0415458 (2 × H100)") == ["9c738e6", "0415458"]
    assert not COMMIT.findall("--flops 137,438,953,472 docs/fix.md#the-fixes 1.004× cafe")


@pytest.mark.parametrize("doc", [*USER_DOCS, REPO / "benchmarks/README.md", REPO / "lab/README.md"],
                         ids=lambda p: p.relative_to(REPO).as_posix())  # fmt: skip
def test_relative_links_resolve(doc: Path) -> None:
    for target in LINK.findall(doc.read_text()):
        if "://" not in target:
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}"


def test_the_benchmarks_index_names_every_script_and_results_file() -> None:
    index = (REPO / "benchmarks" / "README.md").read_text()
    found = (p.relative_to(REPO / "benchmarks") for p in (REPO / "benchmarks").rglob("*.py"))
    # not what lies in a hidden folder: the venv HTA is installed into (benchmarks/.venv-hta)
    scripts = sorted(p for p in found if not any(part.startswith(".") for part in p.parts))
    assert scripts, "no benchmark scripts found"
    missing = [s.as_posix() for s in scripts if f"`{s.name}`" not in index]
    assert not missing, f"benchmarks/README.md does not name: {missing}"
    folders = [p.name for p in (REPO / "benchmarks").iterdir() if p.is_dir() and any(p.glob("*.py"))]
    assert all(f"`{name}/`" in index for name in folders), folders
    results = REPO / "benchmarks" / "results"
    for name in re.findall(r"`([\w.*-]+\.(?:json|md|png|html))`", index):
        assert list(results.glob(name)) or list((REPO / "benchmarks").glob(f"*/{name}")), name
