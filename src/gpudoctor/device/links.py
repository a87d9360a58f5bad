"""The link a GPU's collectives run over, and its rate per direction: NVLink (active links × the
per-link rate of their generation) or PCIe (generation × lanes). A `Link` comes from NVML where a run
recorded the GPU's links (`monitor.topology`), else from `reference_link(name)`: a stated table of the
vendors' figures by GPU model. Rates are bytes/s per direction, the unit NCCL's bus bandwidth is in."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

GB = 1e9
# Per link, per direction (NVIDIA's NVLink generations: 1 P100, 2 V100, 3 A100, 4 H100/H200, 5 B200).
NVLINK_PER_LINK = {1: 20 * GB, 2: 25 * GB, 3: 25 * GB, 4: 25 * GB, 5: 50 * GB}
# Per lane, per direction, after line encoding (PCI-SIG: 8b/10b to gen 2, 128b/130b from gen 3).
PCIE_PER_LANE = {1: 0.25 * GB, 2: 0.5 * GB, 3: 0.985 * GB, 4: 1.969 * GB, 5: 3.938 * GB, 6: 7.563 * GB}

# GPU model (a pattern of the name CUDA reports) -> (NVLink generation, links) or (None, PCIe generation):
# the datasheets' figures for the SXM boards, whose GPUs talk over NVLink (NVSwitch from 4 GPUs up), and
# for the PCIe boards, which have no NVLink unless bridged.
_REFERENCE: tuple[tuple[re.Pattern[str], int | None, int], ...] = (
    (re.compile(r"\bB(100|200)\b|GB200", re.I), 5, 18),
    (re.compile(r"H(100|200|800|20)\b(?!.*(PCIe|NVL))", re.I), 4, 18),
    (re.compile(r"A(100|800)\b(?!.*PCIe)", re.I), 3, 12),
    (re.compile(r"V100-SXM", re.I), 2, 6),
    (re.compile(r"H(100|200).*(PCIe|NVL)", re.I), None, 5),
    (re.compile(r"A(100|800).*PCIe|\bL40S?\b|\bL4\b|A10\b|A40\b|RTX", re.I), None, 4),
    (re.compile(r"V100-PCIE|T4\b", re.I), None, 3),
)


@dataclass(frozen=True)
class Link:
    """What one GPU's collectives cross. `bytes_per_s`: per direction, what its bus bandwidth is
    judged against; `source` says where the figure comes from, for the reader."""

    kind: str  # "nvlink" or "pcie"
    bytes_per_s: float
    source: str
    nvlink_version: int | None = None
    nvlink_links: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Link:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def nvlink(version: int, links: int, source: str) -> Link | None:
    rate = NVLINK_PER_LINK.get(version)
    if rate is None or links <= 0:
        return None
    return Link("nvlink", rate * links, source, nvlink_version=version, nvlink_links=links)


def pcie(gen: int, width: int, source: str) -> Link | None:
    rate = PCIE_PER_LANE.get(gen)
    if rate is None or width <= 0:
        return None
    return Link("pcie", rate * width, source, pcie_gen=gen, pcie_width=width)


def reference_link(device_name: str | None) -> Link | None:
    """The vendor's figure for a GPU model's link to its peers; None for a model not in the table."""
    if not device_name:
        return None
    for pattern, version, count in _REFERENCE:
        if not pattern.search(device_name):
            continue
        if version is not None:
            per = NVLINK_PER_LINK[version] / GB
            return nvlink(
                version,
                count,
                f"reference for {device_name}: NVLink {version}, {count} links × {per:g} GB/s per direction",
            )
        return pcie(count, 16, f"reference for {device_name}: PCIe gen {count} x16, no NVLink")
    return None
