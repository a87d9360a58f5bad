"""The one way a command writes a file: it refuses a target that resolves to one of the command's inputs
(through symlinks and hard links), writes a temporary file beside the target and renames it over the
target once complete, so a failure half-way leaves the old file as it was, and turns every OS error into
a one-line `OutputError`. A target that is not a regular file (/dev/stdout, a FIFO) is written in place."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from gpudoctor.util.errors import OutputError
from gpudoctor.util.text import printable

PathLike = str | os.PathLike[str]
# Files gpudoctor reads from an input directory: the rank traces, a run's record.json and analysis.json.
INPUT_SUFFIXES = (".json", ".json.gz", ".gz")

_REASONS = {
    errno.EISDIR: "it is a directory",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.ENAMETOOLONG: "file name too long",
    errno.ENOENT: "no such file or directory",
    errno.EEXIST: "a file is in the way",
    errno.EBADF: "the file is closed",
    errno.EPIPE: "the reader went away (broken pipe)",
}


def reason(err: OSError) -> str:
    """A short lower-case reason for an OS error."""
    known = _REASONS.get(err.errno or -1)
    if known:
        return known
    text = err.strerror or str(err) or type(err).__name__
    return text[:1].lower() + text[1:]


def output_error(path: PathLike, err: OSError) -> OutputError:
    return OutputError(f"cannot write {printable(os.fspath(path))}: {reason(err)}")


def _same(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _input_files(inputs: Iterable[PathLike]) -> list[Path]:
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        try:
            if p.is_dir():
                files += [f for f in p.iterdir() if f.name.endswith(INPUT_SUFFIXES)]
            else:
                files.append(p)
        except OSError:
            continue  # an input that cannot be listed cannot be overwritten by us either
    return files


def check_not_input(target: PathLike, inputs: Iterable[PathLike]) -> None:
    """Raise `OutputError` when `target` is one of `inputs` (or a trace/JSON file in an input
    directory), after symlinks and hard links."""
    t = Path(target)
    try:
        resolved = t.resolve()
    except (OSError, RuntimeError):  # a symlink loop: the write itself will say what is wrong
        return
    for f in _input_files(inputs):
        try:
            if _same(resolved, f.resolve()):
                raise OutputError(
                    f"refusing to write {printable(os.fspath(t))}: it is an input of this command "
                    f"({printable(os.fspath(f))}); choose another output path"
                )
        except (OSError, RuntimeError):
            continue


def _prepare(target: Path) -> tuple[Path, bool]:
    """The path to write (symlinks followed, so a link stays a link) and whether to write in place."""
    try:
        st = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):  # a parent that is a file is named below
        st = None
    except OSError as err:
        raise output_error(target, err) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"cannot write {printable(os.fspath(target))}: it is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        return target, True  # a device or FIFO: written in place
    real = Path(os.path.realpath(target))
    _check_parents(target, real)
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise output_error(target, err) from None
    return real, False


def _check_parents(target: PathLike, real: Path) -> None:
    blocker = next((p for p in reversed(real.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise OutputError(
            f"cannot write {printable(os.fspath(target))}: {printable(os.fspath(blocker))} is not a directory"
        )


def check_target(target: PathLike, *, inputs: Iterable[PathLike] = ()) -> None:
    """Fail now, before minutes of work, where writing `target` later would fail for sure: it is an
    input, a directory, below a file, or an empty path. Creates nothing."""
    if not os.fspath(target):
        raise OutputError("cannot write to an empty path")
    check_not_input(target, inputs)
    try:
        st = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as err:  # a name too long, a loop of links
        raise output_error(target, err) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"cannot write {printable(os.fspath(target))}: it is a directory")
    _check_parents(target, Path(os.path.realpath(target)))


@contextlib.contextmanager
def open_output(
    target: PathLike, *, inputs: Iterable[PathLike] = (), text: bool = True, compress: bool | None = None
) -> Iterator[IO[Any]]:
    """A file object for the new content of `target`, renamed into place when the block ends without
    an exception (and removed if it raises). `compress`: gzip it (default: when the name ends in .gz).
    Text is UTF-8; a character no encoder accepts (a lone surrogate) is written as its escape."""
    if not os.fspath(target):
        raise OutputError("cannot write to an empty path")
    path = Path(target)
    check_not_input(path, inputs)
    real, in_place = _prepare(path)
    if compress is None:
        compress = path.name.endswith(".gz")
    tmp: str | None = None
    try:
        if in_place:
            raw: IO[bytes] = open(real, "wb")  # noqa: SIM115 -- closed below
        else:
            fd, tmp = _mkstemp(prefix=".gpudoctor-", suffix=".tmp", dir=real.parent)
            raw = os.fdopen(fd, "wb")
        with raw:
            with _layers(raw, compress=compress, text=text) as f:
                yield f
            raw.flush()
            if not in_place:
                os.fsync(raw.fileno())
        if tmp is not None:
            _set_mode(tmp, real)
            os.replace(tmp, real)
            tmp = None
    except OSError as err:
        raise output_error(path, err) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@contextlib.contextmanager
def _layers(raw: IO[bytes], *, compress: bool, text: bool) -> Iterator[IO[Any]]:
    """gzip and/or a UTF-8 text layer over `raw`, flushed at the end and detached from it (closing
    them does not close `raw`: the caller still syncs it)."""
    inner: IO[bytes] = raw
    with contextlib.ExitStack() as stack:
        if compress:
            inner = stack.enter_context(_gzip().GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0))
        if not text:
            yield inner
            return
        wrapper = io.TextIOWrapper(inner, encoding="utf-8", errors="backslashreplace", newline="\n")  # type: ignore[arg-type]
        try:
            yield wrapper
            wrapper.flush()
        finally:
            wrapper.detach()


def _mkstemp(**options: Any) -> tuple[int, str]:
    import tempfile  # here, not at import: the command line starts faster

    return tempfile.mkstemp(**options)


def _gzip() -> Any:
    import gzip

    return gzip


def _set_mode(tmp: str, real: Path) -> None:
    """mkstemp makes 0600: give the new file the old one's mode, or what the umask allows."""
    try:
        mode = stat.S_IMODE(os.stat(real).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(tmp, mode)


def open_live(target: PathLike, *, inputs: Iterable[PathLike] = (), append: bool = False) -> IO[str]:
    """A UTF-8 text file written as things happen (a log of samples), gzipped when its name ends in
    .gz; with `append`, added to the end of what is there. It is written in place, not renamed at the
    end: a crash must leave what was written. It is checked like any output (never an input, a
    directory, below a file); errors opening it are one line, and the caller turns later write errors
    into one with `output_error`."""
    if not os.fspath(target):
        raise OutputError("cannot write to an empty path")
    path = Path(target)
    check_not_input(path, inputs)
    real, _ = _prepare(path)
    try:
        raw: IO[bytes] = open(real, "ab" if append else "wb")  # noqa: SIM115 -- the caller closes it
    except OSError as err:
        raise output_error(path, err) from None
    inner: IO[bytes] = _gzip().GzipFile(fileobj=raw, mode="wb", mtime=0) if path.name.endswith(".gz") else raw
    text = io.TextIOWrapper(inner, encoding="utf-8", errors="backslashreplace", newline="\n")  # type: ignore[arg-type]
    if inner is not raw:
        text._gpudoctor_raw = raw  # type: ignore[attr-defined]  # GzipFile(fileobj=) leaves it open
    return text


def close_live(f: IO[str]) -> None:
    """Close what `open_live` opened (the gzip layer does not close the file under it)."""
    raw = getattr(f, "_gpudoctor_raw", None)
    try:
        f.close()
    finally:
        if raw is not None:
            raw.close()


def write_text(target: PathLike, text: str, *, inputs: Iterable[PathLike] = ()) -> Path:
    """Write `text` (UTF-8) to `target` through `open_output`; returns the path."""
    with open_output(target, inputs=inputs, text=True, compress=False) as f:
        f.write(text)
    return Path(target)


def write_bytes(target: PathLike, data: bytes, *, inputs: Iterable[PathLike] = ()) -> Path:
    with open_output(target, inputs=inputs, text=False, compress=False) as f:
        f.write(data)
    return Path(target)


def write_json(
    target: PathLike,
    doc: Any,
    *,
    inputs: Iterable[PathLike] = (),
    indent: int | None = 1,
    default: Callable[[Any], Any] | None = None,
    allow_nan: bool = False,
) -> Path:
    """`doc` as JSON (no NaN: JSON has none), gzipped when the name ends in .gz; without `indent`, in
    its most compact form. `default`: how values JSON has no type for are written (`str`, say);
    `allow_nan`: NaN and infinities written as Python's JSON writes them (a document in torch's format)."""
    import json

    separators = (",", ":") if indent is None else None
    text = json.dumps(doc, indent=indent, allow_nan=allow_nan, default=default, separators=separators)
    with open_output(target, inputs=inputs, text=True) as f:
        f.write(text)
        f.write("\n")
    return Path(target)
