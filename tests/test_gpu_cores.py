"""tools/gpu_cores.py: the cores each fix_vs_expert queue gets on a several-GPU host — each GPU's NUMA-local
cores split between the GPUs that share them, in whole physical cores, on a sysfs laid out as a
two-socket host's (32 cores per socket, hyperthread siblings 64 apart)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "gpu_cores.py"


@pytest.fixture
def gpu_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_cores", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for cpu in range(128):  # cpu c and c + 64 are one physical core's two threads
        core = cpu % 64
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(f"{core},{core + 64}\n")
    monkeypatch.setattr(module, "SYS_CPU", tmp_path)
    return module


def test_gpus_of_one_socket_share_its_cores_in_whole_physical_cores(gpu_cores: ModuleType) -> None:
    # GIVEN four GPUs, two on each socket (socket 0: cpus 0-31 and their siblings 64-95)
    socket0 = gpu_cores.parse_cpulist("0-31,64-95")
    socket1 = gpu_cores.parse_cpulist("32-63,96-127")
    shares = gpu_cores.assign({0: socket0, 1: socket0, 2: socket1, 3: socket1}, set(range(128)))
    # THEN each GPU gets 16 physical cores of its own socket, both threads of each, none shared
    assert gpu_cores.cpulist(shares[0]) == "0-15,64-79"
    assert gpu_cores.cpulist(shares[1]) == "16-31,80-95"
    assert gpu_cores.cpulist(shares[3]) == "48-63,112-127"
    assert all(not set(shares[a]) & set(shares[b]) for a in shares for b in shares if a < b)


def test_only_the_gpus_named_share_and_only_allowed_cores_are_given(gpu_cores: ModuleType) -> None:
    # GIVEN two GPUs named of one socket, this process allowed only its first 8 cores' threads
    socket0 = gpu_cores.parse_cpulist("0-31,64-95")
    allowed = set(range(8)) | set(range(64, 72))
    shares = gpu_cores.assign({2: socket0, 3: socket0}, allowed)
    # THEN the 8 allowed physical cores are split 4 and 4
    assert gpu_cores.cpulist(shares[2]) == "0-3,64-67"
    assert gpu_cores.cpulist(shares[3]) == "4-7,68-71"


def test_a_gpu_whose_local_cores_are_not_allowed_is_left_unpinned(gpu_cores: ModuleType) -> None:
    shares = gpu_cores.assign({0: [0, 1], 1: [32, 33]}, {0, 1})
    assert shares == {0: [0, 1]}


def test_nvidia_smi_bus_ids_become_sysfs_names(gpu_cores: ModuleType) -> None:
    assert gpu_cores.sysfs_bus("00000000:18:00.0") == "0000:18:00.0"
    assert gpu_cores.cpulist([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
