"""The one error hierarchy. A `GpudoctorError` is a user error: the CLI prints its message on one line
and exits with its `exit_code`; anything else is a bug and keeps its traceback."""

from __future__ import annotations


class GpudoctorError(Exception):
    """An error the user can act on; `str(err)` is one line that says what and where."""

    exit_code = 2


class UsageError(GpudoctorError):
    """A bad option or a combination of options that cannot work."""


class TraceFormatError(GpudoctorError):
    """A file that is not a readable trace: corrupt, truncated, empty, or not a Kineto/Chrome trace."""


class NotATraceError(TraceFormatError):
    """Well-formed JSON of another kind (no `traceEvents` array): a run's record.json, say."""


class NoGpuError(GpudoctorError):
    """The operation needs a CUDA GPU and there is none (or torch cannot see it)."""


class MemoryFormatError(GpudoctorError):
    """A file that is not what gpudoctor's memory recording wrote: a torch allocator snapshot, a memory
    timeline or a batch sweep, damaged or of another kind."""


class OutputError(GpudoctorError):
    """A file the command was to write cannot be written (or would overwrite one of its inputs)."""
