"""Stream a Chrome/Kineto trace's `traceEvents` array in chunks of parsed events, in bounded memory:
`read_trace_json(stream, decode)` yields decoded chunks and returns the other top-level keys, with only a
block of the file and one chunk alive at a time. A chunk ends at a candidate `},{` the decoder accepts as
the end of an array; a candidate inside a string fails at the chunk's very end and reading goes on, while
an error earlier is real corruption, reported with its byte offset."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Generator
from typing import Any, BinaryIO, NamedTuple

import msgspec

from gpudoctor.util.errors import NotATraceError, TraceFormatError

BLOCK_BYTES = 512 << 10  # small enough that a chunk's objects stay in cache and their memory is reused
_HEADER_LIMIT = 256 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_SPLIT = re.compile(rb"\}\s*,\s*\{")
_WS = b" \t\r\n"
_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark: some editors and Windows tools write one

_BYTE = re.compile(r"\(byte (\d+)\)")
_AFTER_EVENTS = re.compile(rb'\]\s*(,\s*"|\})')  # the events' `]` and what follows it in the object form
_untyped = msgspec.json.Decoder()
MAX_DEPTH = 64  # Kineto nests 4 deep; msgspec (like json) recurses, and fails at about 1,000
# A JSON string (escapes included) or a bracket: what `shallow` walks over.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
# msgspec raises UnicodeDecodeError (not a DecodeError) for invalid UTF-8 inside a string
_JSON_ERRORS = (msgspec.DecodeError, UnicodeDecodeError)

Events = list[Any]
Decode = Callable[[bytes], Events]


def read_trace_json(
    stream: BinaryIO, decode: Decode | None = None
) -> Generator[Events, None, dict[str, Any]]:
    """Yield the trace's events chunk by chunk, each as `decode` turns the bytes of a JSON array
    into a list; return the top-level object without `traceEvents`.

    Accepts the JSON object form (`{"traceEvents": [...], ...}`) and the bare array form (`[...]`).
    Raises `TraceFormatError` for empty, truncated, corrupt or non-trace JSON. Values nested deeper
    than `MAX_DEPTH` are read as null (see `shallow`).
    """
    decode = decode or decode_untyped
    reader = _BlockReader(stream)
    first = reader.first_byte()
    if first is None:
        raise TraceFormatError("the file is empty")
    if first == ord("["):
        header: dict[str, Any] = {}
        start = reader.buf.index(b"[") + 1
    elif first == ord("{"):
        header_or_none, start = _read_header(reader)
        if header_or_none is None:
            return (yield from _whole_document(reader, decode))
        header = header_or_none
    else:
        raise TraceFormatError("not JSON: the file does not start with '{' or '['")
    trailer = yield from _stream_events(reader, start, decode, bare=first == ord("["))
    header.update(trailer)
    header.pop("traceEvents", None)  # after the update: the trailer's parse puts a null there too
    return header


class EventsAt(NamedTuple):
    """Where a trace's events begin: the top-level keys before them, the byte offset just after the
    array's `[`, and whether the document is the bare array form."""

    header: dict[str, Any]
    start: int
    bare: bool


def events_at(stream: BinaryIO) -> EventsAt | None:
    """Where `read_trace_json` would find the events of `stream`, read from its start; None where it
    would not stream them (not JSON, or no `traceEvents` key it can find: it then reads the whole)."""
    reader = _BlockReader(stream)
    first = reader.first_byte()
    if first == ord("["):
        return EventsAt({}, reader.consumed + 1, bare=True)
    if first != ord("{"):
        return None
    header, start = _read_header(reader)
    if header is None:
        return None
    header.pop("traceEvents", None)
    return EventsAt(header, reader.consumed + start, bare=False)


def decode_untyped(data: bytes | bytearray | memoryview) -> Any:
    """JSON as Python values; values nested deeper than `MAX_DEPTH` become null instead of a
    RecursionError."""
    try:
        return _untyped.decode(data)
    except RecursionError:
        return _untyped.decode(shallow(data))


def shallow(data: bytes | bytearray | memoryview, max_depth: int = MAX_DEPTH) -> bytes:
    """`data` with every array or object nested deeper than `max_depth` replaced by `null`, found by
    one pass over its strings and brackets (no recursion, so no depth is too deep). Left unbalanced
    at the end (a truncated document), it stays truncated there."""
    out: list[bytes | memoryview] = []
    view = memoryview(data)
    depth, cut, last = 0, -1, 0
    for m in _TOKEN.finditer(view):
        c = view[m.start()]
        if c == 0x22:  # '"': a string, brackets inside it do not count
            continue
        if c in (0x5B, 0x7B):  # '[', '{'
            depth += 1
            if depth == max_depth + 1:
                cut = m.start()
        else:
            if depth == max_depth + 1 and cut >= 0:
                out += (view[last:cut], b"null")
                last, cut = m.end(), -1
            depth = max(depth - 1, 0)
    out.append(view[last : cut if cut >= 0 else len(view)])
    return b"".join(out)


class _BlockReader:
    """A growable byte buffer over a binary stream, read a block at a time."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.buf = bytearray()
        self.consumed = 0  # bytes dropped from the front of buf so far (for error offsets)
        self.eof = False

    def fill(self) -> bool:
        if self.eof:
            return False
        try:
            data = self.stream.read(BLOCK_BYTES)
        except (OSError, EOFError, ValueError) as err:  # gzip: bad CRC, truncated stream, not gzip
            raise TraceFormatError(f"cannot read the file: {err}") from err
        if not data:
            self.eof = True
            return False
        try:
            self.buf += data
        except BufferError:  # decoded events still view the buffer (msgspec.Raw): grow a copy instead
            self.buf = self.buf + data
        return True

    def first_byte(self) -> int | None:
        """The document's first byte. A UTF-8 byte-order mark and the whitespace before the document
        are dropped as they are read: leading whitespace costs one pass over it and no memory."""
        while len(self.buf) < len(_BOM) and self.fill():
            pass
        if self.buf.startswith(_BOM):
            self.drop(len(_BOM))
        while True:
            leading = len(self.buf) - len(self.buf.lstrip(_WS))
            self.drop(leading)
            if self.buf:
                return self.buf[0]
            if not self.fill():
                return None

    def drop(self, upto: int) -> None:
        try:
            del self.buf[:upto]
        except BufferError:  # as in fill: the old buffer lives on while the views that pin it do
            self.buf = self.buf[upto:]
        self.consumed += upto

    def squeeze(self, at: int) -> int:
        """Remove the whitespace that starts at `at` (between tokens: the caller knows it is); how
        many bytes went."""
        end = _WS_RUN.match(self.buf, at).end()  # type: ignore[union-attr]  # matches the empty run
        if end > at:
            try:
                del self.buf[at:end]
            except BufferError:
                self.buf = self.buf[:at] + self.buf[end:]
            self.consumed += end - at
        return end - at


_WS_RUN = re.compile(rb"[ \t\r\n]*")


def _read_header(reader: _BlockReader) -> tuple[dict[str, Any] | None, int]:
    """Find the top-level `"traceEvents": [`; return the keys before it and the offset after `[`.

    Returns (None, 0) when the key is not found as a top-level key of the object: the caller then
    parses the whole document (still correct, only slower and larger in memory).
    """
    searched = 0
    while True:
        m = _EVENTS_KEY.search(reader.buf, max(0, searched - 64))
        if m:
            break
        searched = len(reader.buf)
        if searched > _HEADER_LIMIT or not reader.fill():
            return None, 0
    prefix = bytes(reader.buf[: m.start()]).rstrip()
    if not prefix.endswith((b"{", b",")):
        return None, 0
    try:
        header = decode_untyped(prefix + b'"traceEvents": null}')
    except _JSON_ERRORS:
        return None, 0
    return header, m.end()


def _parse_chunk(buf: bytearray, lo: int, hi: int, decode: Decode) -> tuple[Events | None, bool]:
    """Parse `[buf[lo:hi]]`: (events, ok). ok False means it failed only at its very end.

    In place, without copying: the separator bytes at lo-1 (`[` or `,`) and at hi (whitespace, `,`
    or `]`) are overwritten with the brackets for the decode and restored after it. The view is not
    released here: decoded events may hold views into it (msgspec.Raw), which pin the buffer until
    they are freed; `_BlockReader` then copies rather than resizes it.
    """
    before, after = buf[lo - 1], buf[hi]
    buf[lo - 1], buf[hi] = 0x5B, 0x5D  # '[' and ']'
    wrapped = memoryview(buf)[lo - 1 : hi + 1]
    try:
        return decode(wrapped), True
    except _JSON_ERRORS as err:
        pos = _error_byte(err, wrapped)
        if pos is None or pos >= len(wrapped) - 1:
            return None, False
        raise _Corrupt(pos, _reason(err)) from None
    finally:
        buf[lo - 1], buf[hi] = before, after


def _bad_utf8(err: Exception) -> bool:
    """Invalid UTF-8 inside a string: msgspec before 0.23 raises UnicodeDecodeError, 0.23 a DecodeError
    that names no byte."""
    return isinstance(err, UnicodeDecodeError) or (
        isinstance(err, msgspec.DecodeError) and "UTF-8" in str(err) and _BYTE.search(str(err)) is None
    )


def _error_byte(err: Exception, doc: bytes | memoryview) -> int | None:
    """Where malformed JSON went wrong; None when the input simply ended too soon."""
    if _bad_utf8(err):
        try:
            bytes(doc).decode("utf-8")
        except UnicodeDecodeError as bad:
            return bad.start
        return 0
    if isinstance(err, msgspec.ValidationError):  # well-formed JSON of unexpected types
        try:
            decode_untyped(doc)
        except msgspec.ValidationError:  # a number out of range: msgspec names its path, not its byte
            return 0
        except _JSON_ERRORS as syntax:
            return _error_byte(syntax, doc)
        raise AssertionError("a decoder rejected JSON without handling its types") from err
    m = _BYTE.search(str(err))
    return int(m.group(1)) if m else None


def _reason(err: Exception) -> str:
    if _bad_utf8(err):
        return "invalid UTF-8 in a string"
    return str(err).split(" (byte")[0]


class _Corrupt(Exception):
    def __init__(self, pos: int, msg: str) -> None:
        super().__init__(msg)
        self.pos = pos
        self.msg = msg


def _stream_events(
    reader: _BlockReader, start: int, decode: Decode, bare: bool
) -> Generator[Events, None, dict[str, Any]]:
    """Each time a block is read, parse the events up to the last `},{` in the buffer. Every byte is
    searched once: a block of only whitespace and commas cannot complete a split and is not searched,
    and only a `}` followed by nothing but whitespace and commas (`pending`) is searched again.
    Whitespace between events is dropped as it comes."""
    pos = start  # offset in reader.buf just after the last complete event's ',' (or the '[')
    min_end = 0  # a failed split means the next try must reach further than this
    pending: int | None = None  # a `}` whose split may complete with the next block
    searched = pos  # bytes before this were searched (or were whitespace and commas)
    while reader.fill():
        removed = reader.squeeze(pos)
        begin = max(pos, searched - removed)
        if pending is not None:
            pending -= removed
        buf = reader.buf
        searched = len(buf)
        last = _last_content(buf, begin)
        if last is None:
            continue  # only whitespace and commas: no `{`, so no new split
        split = _last_split(buf, max(pos, min_end, begin if pending is None else pending), len(buf))
        pending = last if buf[last] == 0x7D else None  # '}'
        if split is None:
            continue
        try:
            events, ok = _parse_chunk(buf, pos, split + 1, decode)
        except _Corrupt as err:
            if not bare and _events_ended(buf, pos, err):
                break  # that `},{` was in a key after the events (traceEvents is not the last key)
            raise _corrupt_error(reader, pos, err) from None
        if not ok:
            min_end = split + 1
            continue
        if events:
            yield events
        del events
        # keep the comma: the next chunk's '[' goes in its place
        comma = buf.index(b",", split + 1)
        reader.drop(comma)
        pos, min_end, searched = 1, 0, searched - comma
        if pending is not None:
            pending -= comma
    while reader.fill():
        pass
    return (yield from _finish(reader, pos, decode, bare))


def _last_content(buf: bytearray, lo: int, step: int = 1 << 16) -> int | None:
    """The offset of the last byte at or after `lo` that is not whitespace or a comma; a window at a
    time from the end (a block usually ends inside an event: one byte looked at)."""
    end = len(buf)
    while end > lo:
        start = max(lo, end - step)
        kept = len(bytes(buf[start:end]).rstrip(_WS + b","))
        if kept:
            return start + kept - 1
        end = start
    return None


def _events_ended(buf: bytearray, pos: int, err: _Corrupt) -> bool:
    """Whether a chunk failed because the events array closed inside it and a top-level key follows."""
    if "trailing characters" not in err.msg:
        return False
    close = buf.rfind(b"]", pos, pos + err.pos)  # msgspec points at or just after the first trailing byte
    return close >= 0 and _AFTER_EVENTS.match(buf, close) is not None


def _last_split(buf: bytearray, lo: int, hi: int) -> int | None:
    """Offset of the `}` of the last `},{` between lo and hi, or None."""
    p = hi
    while True:
        p = buf.rfind(b"}", lo, p)
        if p < 0:
            return None
        if _SPLIT.match(buf, p):
            return p


def _finish(
    reader: _BlockReader, pos: int, decode: Decode, bare: bool
) -> Generator[Events, None, dict[str, Any]]:
    """At end of file: parse the last events, the array's `]` and the keys after it."""
    _trim_end(reader.buf, pos)
    buf = reader.buf
    end = len(buf)
    corrupt: _Corrupt | None = None
    for _ in range(10_000):
        close = buf.rfind(b"]", pos, end)
        if close < 0:
            break
        end = close
        tail = bytes(buf[close + 1 :])
        if bare:
            if tail.strip(_WS):
                continue
            trailer: dict[str, Any] = {}
        else:
            try:
                trailer = decode_untyped(b'{"traceEvents": null' + tail)
            except _JSON_ERRORS:
                continue
            if not isinstance(trailer, dict):
                continue
        if not buf[pos:close].strip(_WS):
            return trailer
        try:
            events, ok = _parse_chunk(buf, pos, close, decode)
        except _Corrupt as err:  # or this `]` closed a list in a key after the events: try an earlier one
            corrupt = corrupt or err
            continue
        if ok:
            if events:
                yield events
            return trailer
    if corrupt is not None:
        raise _corrupt_error(reader, pos, corrupt)
    raise TraceFormatError(
        f"truncated or corrupt trace: the traceEvents array does not end properly "
        f"(read {reader.consumed + len(buf):,} bytes)"
    )


def _trim_end(buf: bytearray, lo: int, step: int = 1 << 20) -> None:
    """Cut the whitespace at the end of the document (after its last token, so outside any string),
    a block at a time from the end: no copy of a long run of it."""
    end = len(buf)
    while end > lo:
        start = max(lo, end - step)
        kept = len(bytes(buf[start:end]).rstrip(_WS))
        if kept:
            end = start + kept
            break
        end = start
    if end < len(buf):
        with contextlib.suppress(BufferError):  # decoded events may pin it: then it stays
            del buf[end:]


def _corrupt_error(reader: _BlockReader, pos: int, err: _Corrupt) -> TraceFormatError:
    offset = reader.consumed + pos + max(err.pos - 1, 0)
    return TraceFormatError(f"corrupt JSON near byte {offset:,}: {err.msg}")


def _whole_document(reader: _BlockReader, decode: Decode) -> Generator[Events, None, dict[str, Any]]:
    """Slow path: parse the whole document at once (used when streaming cannot find its way)."""
    while reader.fill():
        pass
    try:
        doc = decode_untyped(reader.buf)
    except _JSON_ERRORS as err:
        pos = _error_byte(err, bytes(reader.buf))
        if pos is None:
            raise TraceFormatError("truncated JSON: the file ends in the middle of the document") from None
        raise TraceFormatError(f"corrupt JSON near byte {pos:,}: {_reason(err)}") from None
    reader.buf = bytearray()
    if not isinstance(doc, dict) or "traceEvents" not in doc:
        raise NotATraceError("JSON is not a trace: it has no 'traceEvents' array")
    events = doc.pop("traceEvents")
    if not isinstance(events, list):
        raise NotATraceError("JSON is not a trace: 'traceEvents' is not an array")
    if events:
        yield decode(msgspec.json.encode(events))
    return doc
