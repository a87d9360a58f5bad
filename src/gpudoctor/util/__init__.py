"""Errors, units and small helpers shared by every package. Imports nothing of gpudoctor."""

from gpudoctor.util.errors import (
    GpudoctorError,
    NoGpuError,
    TraceFormatError,
    UsageError,
)

__all__ = ["GpudoctorError", "NoGpuError", "TraceFormatError", "UsageError"]
