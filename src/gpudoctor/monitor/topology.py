"""The link one GPU's collectives cross, read from NVML: its active NVLink links and their version
(`nvmlDeviceGetNvLinkState` / `nvmlDeviceGetNvLinkVersion` per link), else its PCIe link's current
maximum generation and width. A GPU with NVLink links active talks to its peers over them (NCCL prefers
NVLink to PCIe); one without goes over PCIe. `read_link(uuid)` is `(Link, None)` or `(None, why)`."""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

from gpudoctor.device.links import Link, nvlink, pcie

MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS on Hopper


def read_link(
    uuid: str | None = None, index: int = 0, nvml: ModuleType | None = None
) -> tuple[Link | None, str | None]:
    """The link of the GPU with this UUID (else NVML index `index`); NVML is started and shut down
    here. `nvml`: the pynvml module (a fake in tests)."""
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[import-not-found,no-redef]
        except ImportError:
            return None, "nvidia-ml-py is not installed"
    try:
        nvml.nvmlInit()
    except Exception as err:  # NVMLError, or a library that will not load
        return None, f"NVML did not start: {err}"
    try:
        handle = _handle(nvml, uuid, index)
        return link_of(nvml, handle), None
    except Exception as err:
        return None, f"NVML could not read the GPU's links: {err}"
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def link_of(nvml: ModuleType, handle: Any) -> Link | None:
    versions = []
    for i in range(MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, i) == getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                versions.append(int(nvml.nvmlDeviceGetNvLinkVersion(handle, i)))
        except Exception:  # no link of that number, or NVLink not supported: stop asking
            break
    if versions:
        version = max(set(versions), key=versions.count)
        return nvlink(version, len(versions), f"NVML: {len(versions)} NVLink {version} links active")
    # The link's maximum, not its current state: an idle GPU drops its PCIe link to gen 1 to save power.
    gen = int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
    width = int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle))
    return pcie(gen, width, f"NVML: PCIe gen {gen} x{width} (the link's maximum), no NVLink active")


def _handle(nvml: ModuleType, uuid: str | None, index: int) -> Any:
    if uuid:
        key = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        with contextlib.suppress(Exception):
            return nvml.nvmlDeviceGetHandleByUUID(key)
    return nvml.nvmlDeviceGetHandleByIndex(index)
