"""Reading the small JSON documents gpudoctor writes (an analysis, a run's record, a saved measurement)
back from disk, where a person may have truncated or edited them: the value, or a `UsageError` that
names the file and what is wrong with it — never a traceback, never a hang on a FIFO."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from gpudoctor.util.errors import UsageError
from gpudoctor.util.text import printable

MAX_DOCUMENT_BYTES = 1 << 30  # gpudoctor's own documents are kilobytes to a few megabytes


def read_json(path: str | os.PathLike[str], what: str = "JSON document") -> Any:
    """The JSON value in `path`; `what` names it in errors ("gpudoctor analysis")."""
    name = printable(os.fspath(path))
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise UsageError(f"cannot read {name}: {err.strerror or err}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"cannot read {name}: not a regular file")
        if st.st_size > MAX_DOCUMENT_BYTES:
            raise UsageError(f"{name} is too large to be a {what} ({st.st_size:,} bytes)")
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read()
    except OSError as err:
        raise UsageError(f"cannot read {name}: {err.strerror or err}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    return decode_json(data, name, what)


def decode_json(data: bytes, name: str, what: str = "JSON document") -> Any:
    import msgspec  # here, not at import: the command line starts without it

    try:
        return msgspec.json.decode(data.removeprefix(b"\xef\xbb\xbf"))
    except RecursionError:
        raise UsageError(f"{name} is not a {what}: its JSON is nested too deeply") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as err:
        detail = " ".join(str(err).split())[:120]
        raise UsageError(f"{name}: not JSON, so not a {what} (truncated or edited?): {detail}") from None


def read_json_object(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """Like `read_json`, for a document that must be a JSON object."""
    value = read_json(path, what)
    if not isinstance(value, dict):
        raise UsageError(f"{printable(os.fspath(Path(path)))} is not a {what}: not a JSON object")
    return value
