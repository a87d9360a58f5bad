"""The proof's diff applier (`fixes.patchtext`): the diff `gpudoctor fix` writes applies to the files it
was made from, hunk by hunk exactly where its headers say; context that does not match, a hunk that
would apply only at another line (what `patch` calls an offset or fuzz), a malformed hunk, a new or
deleted file are refused with one line naming the file and the hunk — never a half-patched file."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from gpudoctor.fixes.patchtext import PatchError, apply, parse, patched_files

TRAIN = """\
import torch
from torch.utils.data import DataLoader

from model import Net

loader = DataLoader(data, batch_size=8, shuffle=True)
net = Net()
for x, y in loader:
    loss = net(x).sum()
    loss.backward()
"""
PATCHED = TRAIN.replace("shuffle=True)", "shuffle=True, num_workers=2)").replace(
    "net = Net()\n", "net = Net()\nnet = torch.compile(net)\n"
)


def diff_of(old: str, new: str, name: str = "train.py", n: int = 3) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{name}", f"b/{name}", n=n
    )
    return "".join(lines)


def test_the_diff_applies_to_the_text_it_was_made_from() -> None:
    (patch,) = parse(diff_of(TRAIN, PATCHED))
    assert patch.old_name == "train.py" and len(patch.hunks) == 1
    assert apply(TRAIN, patch) == PATCHED


def test_hunks_far_apart_apply_each_at_its_own_line() -> None:
    long = TRAIN + "".join(f"print({i})\n" for i in range(30)) + "print('end')\n"
    new = long.replace("shuffle=True)", "shuffle=True, num_workers=2)").replace("'end'", "'done'")
    (patch,) = parse(diff_of(long, new, n=1))
    assert len(patch.hunks) == 2
    assert apply(long, patch) == new


def test_context_that_does_not_match_is_refused_naming_the_line() -> None:
    (patch,) = parse(diff_of(TRAIN, PATCHED))
    edited = TRAIN.replace("net = Net()", "net = Net(depth=4)")
    with pytest.raises(
        PatchError, match=r"train.py: hunk 1 \(@@ -\d+,\d+\) does not match line 7: the file reads"
    ):
        apply(edited, patch)


def test_a_hunk_that_would_apply_only_lines_away_is_refused_not_moved() -> None:
    # GNU patch applies this at an offset of two lines; the proof runs only what was measured
    (patch,) = parse(diff_of(TRAIN, PATCHED))
    moved = "# a comment\n# another\n" + TRAIN
    with pytest.raises(PatchError, match="does not match line"):
        apply(moved, patch)


def test_whitespace_is_not_forgiven() -> None:
    (patch,) = parse(diff_of(TRAIN, PATCHED))
    with pytest.raises(PatchError, match="does not match"):
        apply(TRAIN.replace("    loss.backward()", "\tloss.backward()"), patch)


def test_a_hunk_past_the_files_end_is_refused() -> None:
    (patch,) = parse(diff_of(TRAIN, PATCHED))
    with pytest.raises(PatchError, match="runs past the file's end"):
        apply("import torch\n", patch)


def test_a_hunk_whose_body_disagrees_with_its_header_is_refused() -> None:
    text = diff_of(TRAIN, PATCHED).replace("@@ -3,8 +3,9 @@", "@@ -3,10 +3,9 @@")
    with pytest.raises(PatchError, match="says 10 old and 9 new lines, its body holds 8 and 9"):
        parse(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no file in the diff"),
        ("--- a/x.py\n", "without its '\\+\\+\\+' line"),
        ("--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x\n", "creates or deletes a file"),
        ("--- a/x.py\n+++ b/x.py\n", "a file header with no hunk"),
        ("@@ -1 +1 @@\n-a\n+b\n", "outside a file's header"),
    ],
)
def test_malformed_diffs_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(PatchError, match=message):
        parse(text)


def test_line_endings_and_a_missing_last_newline_are_kept() -> None:
    crlf = TRAIN.replace("\n", "\r\n")
    (patch,) = parse(diff_of(TRAIN, PATCHED))  # fixes.diff reads text with its newlines translated
    assert apply(crlf, patch) == PATCHED.replace("\n", "\r\n")
    last = "a = 1\nb = 2"
    (patch,) = parse(diff_of("a = 1\nb = 2\n", "a = 1\nb = 3\n"))
    assert apply(last, patch) == "a = 1\nb = 3"


def test_patched_files_reads_the_files_the_diff_names_from_the_folder_given(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "model.py").write_text("x = 1\n")
    diff = diff_of(TRAIN, PATCHED) + diff_of("x = 1\n", "x = 2\n", "lib/model.py")
    out = patched_files(diff, tmp_path)
    assert out == {
        (tmp_path / "train.py").resolve(): PATCHED,
        (tmp_path / "lib/model.py").resolve(): "x = 2\n",
    }
    assert (tmp_path / "train.py").read_text() == TRAIN  # read, never written
    with pytest.raises(PatchError, match=r"other\.py: no such file here"):
        patched_files(diff_of("x\n", "y\n", "other.py"), tmp_path)


def test_the_diff_gpudoctor_writes_applies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudoctor.fixes.diff import unified_diff
    from gpudoctor.fixes.edits import Edit

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(TRAIN)
    edit = Edit("set_kwargs", str(tmp_path / "train.py"), 6, call="DataLoader", kwargs={"num_workers": "2"})
    diff = unified_diff([edit]).diff
    assert diff.startswith("--- a/train.py\n+++ b/train.py\n")
    (new,) = patched_files(diff, tmp_path).values()
    assert "DataLoader(data, batch_size=8, shuffle=True, num_workers=2)" in new
