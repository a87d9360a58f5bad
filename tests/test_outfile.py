"""The one output writer (`util.outfile`) and the one sanitizer of untrusted text (`util.text`, and the
terminal's `SafeConsole`): what every command relies on so that nothing the user has is lost and no
name from a trace reaches a terminal as an escape sequence."""

from __future__ import annotations

import errno
import gzip
import io
import os
import stat
from pathlib import Path

import pytest

from gpudoctor.report.console import SafeConsole
from gpudoctor.util import outfile
from gpudoctor.util.errors import OutputError
from gpudoctor.util.outfile import check_target, open_output, write_json, write_text
from gpudoctor.util.text import printable, printable_block

# ---- refusing to write over an input ---------------------------------------------------------------


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    (tmp_path / "trace.json").write_text('{"traceEvents": []}')
    (tmp_path / "link.json").symlink_to(tmp_path / "trace.json")
    os.link(tmp_path / "trace.json", tmp_path / "hard.json")
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank0.json.gz").write_bytes(gzip.compress(b"{}"))
    return tmp_path


@pytest.mark.parametrize("target", ["trace.json", "link.json", "hard.json", "./sub/../trace.json"])
def test_a_target_that_is_an_input_by_any_path_is_refused_and_left_intact(inputs: Path, target: str) -> None:
    before = (inputs / "trace.json").read_bytes()
    (inputs / "sub").mkdir()
    with pytest.raises(OutputError, match="it is an input of this command"):
        write_text(inputs / target, "report", inputs=[inputs / "trace.json"])
    assert (inputs / "trace.json").read_bytes() == before


def test_a_rank_file_inside_an_input_directory_is_an_input(inputs: Path) -> None:
    with pytest.raises(OutputError, match="input"):
        write_text(inputs / "ranks" / "rank0.json.gz", "x", inputs=[inputs / "ranks"])
    write_text(inputs / "ranks" / "report.html", "ok", inputs=[inputs / "ranks"])  # a new file there is fine
    assert (inputs / "ranks" / "report.html").read_text() == "ok"


# ---- every OS error is one line naming the path ---------------------------------------------------------


def test_os_errors_are_one_line_naming_the_path_and_the_reason(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    cases = {
        tmp_path: "it is a directory",
        tmp_path / "file" / "r.html": "file is not a directory",
        tmp_path / ("x" * 300): "file name too long",
    }
    if Path("/dev/full").exists():
        cases[Path("/dev/full")] = "no space left on device"
    for target, reason in cases.items():
        with pytest.raises(OutputError) as err:
            write_text(target, "x" * 100_000)
        message = str(err.value)
        assert "\n" not in message and reason in message and str(target)[:40] in message
    with pytest.raises(OutputError, match="empty path"):
        write_text("", "x")


def test_a_read_only_place_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # root may write anywhere: the refusal of a read-only file system is simulated at the OS call
    def read_only(*_: object, **__: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(outfile, "_mkstemp", read_only)
    with pytest.raises(OutputError, match=r"cannot write .*r\.html: read-only file system"):
        write_text(tmp_path / "r.html", "x")


def test_check_target_fails_before_any_work_without_creating_anything(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="directory"):
        check_target(tmp_path)
    check_target(tmp_path / "new" / "deeper" / "out.json")
    assert not (tmp_path / "new").exists()


# ---- atomic: a failure half-way leaves the old file ---------------------------------------------------


def test_a_failure_while_writing_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("the good one")
    with pytest.raises(RuntimeError), open_output(target) as f:
        f.write("half of a new one")
        raise RuntimeError("the renderer failed")
    assert target.read_text() == "the good one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_the_new_file_keeps_the_old_ones_mode_and_a_symlink_stays_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real.md"
    real.write_text("old")
    real.chmod(0o640)
    (tmp_path / "link.md").symlink_to(real)
    write_text(tmp_path / "link.md", "new")
    assert (tmp_path / "link.md").is_symlink() and real.read_text() == "new"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640


def test_gzip_by_name_and_text_no_encoder_accepts_is_escaped(tmp_path: Path) -> None:
    write_json(tmp_path / "doc.json.gz", {"name": "lone \ud800 surrogate, µs"})
    raw = gzip.decompress((tmp_path / "doc.json.gz").read_bytes())
    assert b'"lone \\ud800 surrogate, \\u00b5s"' in raw
    write_text(tmp_path / "t.txt", "a \udcff b")
    assert (tmp_path / "t.txt").read_bytes() == b"a \\udcff b"


# ---- untrusted text ----------------------------------------------------------------------------------

HOSTILE = (
    "aten::mm\x1b]0;pwned\x07"  # set the window title
    "\x1b]52;c;ZXZpbA==\x07"  # write the clipboard (OSC 52)
    "\x1b[2J\x1b[H"  # clear the screen
    "\r\u202eevil\x9b31m\x00"  # overwrite the line, reverse the text, a one-byte CSI, a NUL
)


def test_printable_shows_every_control_character_escaped_and_keeps_the_rest() -> None:
    shown = printable(HOSTILE)
    assert not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F or c == "\u202e" for c in shown)
    assert shown.startswith("aten::mm\\x1b]0;pwned\\x07\\x1b]52;c;")
    assert "\\r\\u202eevil\\x9b31m\\x00" in shown
    assert printable("ResNet µ → ok [bold]") == "ResNet µ → ok [bold]"
    assert printable("two\nlines\t") == "two\\nlines\\t" and printable_block("two\nlines\t") == "two\nlines\t"


def rendered(text: str, *, color: bool) -> str:
    out = io.StringIO()
    console = SafeConsole(
        file=out, force_terminal=color, color_system="truecolor" if color else None, width=200
    )
    console.print(text)
    return out.getvalue()


@pytest.mark.parametrize("color", [False, True])
def test_the_terminal_console_writes_no_escape_sequence_from_text_and_no_markup(color: bool) -> None:
    out = rendered(HOSTILE + " [bold]x[/bold] [link=https://evil]y[/link] [/] :smile:", color=color)
    assert "\x1b]" not in out and "\x07" not in out and "\r" not in out and "\u202e" not in out
    assert "[bold]x[/bold] [link=https://evil]y[/link] [/] :smile:" in out  # markup shown, not obeyed
    assert "\\x1b]52;c;" in out
