"""Kineto trace loading into a columnar `Trace`, links between its events, and step detection."""

from gpudoctor.trace.load import load_trace, load_traces
from gpudoctor.trace.model import Kind, MemoryEvents, Trace, TraceMeta

__all__ = ["Kind", "MemoryEvents", "Trace", "TraceMeta", "load_trace", "load_traces"]
