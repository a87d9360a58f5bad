"""The proof's copy of the user's files (`fixes.shadow`): the script's folder mirrored with links, the
files the diff changes written patched, the script a real file (Python resolves a linked script's folder
onto `sys.path`, which would import the user's unpatched modules), `__pycache__` and the fix folder
under the script's folder left out; run from the copy, the script imports the patched module and reads
its data through the links."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.fixes.shadow import ShadowError, build_shadow

SCRIPT = """\
import os
from model import SIZE
from pkg.layers import DEPTH
here = os.path.dirname(os.path.abspath(__file__))
print(SIZE, DEPTH, open(os.path.join(here, "data", "x.txt")).read().strip(), os.getcwd())
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "data" / "x.txt").write_text("the user's data\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "layers.py").write_text("DEPTH = 2\n")
    (root / "pkg" / "other.py").write_text("")
    (root / "model.py").write_text("SIZE = 8\n")
    (root / "train.py").write_text(SCRIPT)
    (root / "__pycache__").mkdir()
    return root


def test_the_copy_links_the_users_files_and_writes_the_patched_ones(project: Path) -> None:
    patched = {(project / "pkg" / "layers.py").resolve(): "DEPTH = 4\n"}
    into = project / "gpudoctor-fixes" / "train-1" / "proof" / "copy"
    copy = build_shadow(project / "train.py", patched, into)
    root = into.resolve()
    assert copy.root == root and copy.mirrors == project.resolve() and copy.script == root / "train.py"
    assert copy.written == (root / "pkg" / "layers.py",)
    assert (root / "pkg" / "layers.py").read_text() == "DEPTH = 4\n" and not (
        root / "pkg" / "layers.py"
    ).is_symlink()
    assert (root / "pkg").is_dir() and not (root / "pkg").is_symlink()  # on the way to a written file
    assert (root / "pkg" / "other.py").resolve() == (project / "pkg" / "other.py").resolve()
    assert (root / "data").is_symlink() and (root / "model.py").is_symlink()
    assert not (root / "train.py").is_symlink()  # always a real file
    assert not (root / "__pycache__").exists() and not (root / "gpudoctor-fixes").exists()
    assert (project / "pkg" / "layers.py").read_text() == "DEPTH = 2\n"  # the user's file untouched


def test_run_from_the_copy_the_script_imports_the_patched_module_and_reads_the_users_data(
    project: Path, tmp_path: Path
) -> None:
    patched = {(project / "model.py").resolve(): "SIZE = 16\n"}
    copy = build_shadow(project / "train.py", patched, tmp_path / "copy")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    out = subprocess.run(
        [sys.executable, str(copy.script)], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(None, 4) == ["16", "2", "the", "user's", f"data {cwd.resolve()}\n"]


def test_a_copy_made_again_replaces_the_last_without_touching_the_users_files(
    project: Path, tmp_path: Path
) -> None:
    into = tmp_path / "copy"
    build_shadow(project / "train.py", {(project / "model.py").resolve(): "SIZE = 16\n"}, into)
    build_shadow(project / "train.py", {}, into)
    assert (into / "model.py").is_symlink() and (project / "model.py").read_text() == "SIZE = 8\n"
    assert (project / "data" / "x.txt").exists()


def test_files_that_share_no_folder_but_the_root_are_not_copied(project: Path, tmp_path: Path) -> None:
    with pytest.raises(ShadowError, match="share no folder"):
        build_shadow(project / "train.py", {Path("/etc/hostname"): "x\n"}, tmp_path / "copy")
    with pytest.raises(ShadowError, match="holds the script's files"):
        build_shadow(project / "train.py", {}, project)
