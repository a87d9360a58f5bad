"""`gpudoctor fix --nproc N --numa-binding MODE`, or under a torchrun given `--numa-binding`: every group
it starts (the diagnosis, each round, each of the proof's plain processes) is launched by torchrun with
the same binding, so that the ranks it times sit on the cores the user's own launch puts them on."""

from __future__ import annotations

import pytest

from gpudoctor.fixes.ranks import launcher_numa_binding, torchrun


@pytest.mark.parametrize(
    ("argv", "mode"),
    [
        (["/usr/bin/torchrun", "--nproc-per-node", "2", "--numa-binding", "node", "train.py"], "node"),
        (["/usr/bin/torchrun", "--numa_binding=socket", "-m", "gpudoctor", "fix", "train.py"], "socket"),
        (
            ["python3", "-m", "torch.distributed.run", "--numa-binding=exclusive", "-m", "gpudoctor", "fix"],
            "exclusive",
        ),
        (["/usr/bin/torchrun", "--nproc-per-node", "2", "train.py", "--numa-binding", "node"], None),
        (["python3", "-m", "torch.distributed.run", "--standalone", "-m", "gpudoctor", "fix", "t.py"], None),
    ],
)
def test_the_binding_is_read_from_the_launchers_options_not_the_scripts(
    argv: list[str], mode: str | None
) -> None:
    assert launcher_numa_binding(argv) == mode


def test_every_group_is_launched_with_the_binding() -> None:
    assert torchrun(2, "node")[-4:] == ["--nproc-per-node", "2", "--numa-binding", "node"]
    assert "--numa-binding" not in torchrun(2)
