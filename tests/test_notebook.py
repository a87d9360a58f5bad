"""The Python API where people try things: a real Jupyter kernel (ipykernel, driven by nbclient) runs a CPU
training loop under `with gpudoctor.profile()` and shows the report as HTML; `%load_ext gpudoctor` and
`%%gpudoctor` do the same for a cell; nothing is left installed afterwards. And `import gpudoctor`
stays cheap and changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

SRC = Path(__file__).resolve().parent.parent / "src"

SETUP = """
import torch, gpudoctor
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def train_steps(n):
    for _ in range(n):
        model(torch.randn(32, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
"""
LEFT_BEHIND = """
import sys
from torch.optim import optimizer
from torch.nn.modules import module
from gpudoctor.runner import capture
print(json.dumps({
    "active": capture._ACTIVE is not None,
    "optimizer_hooks": len(optimizer._global_optimizer_pre_hooks) + len(optimizer._global_optimizer_post_hooks),
    "module_hooks": len(module._global_forward_pre_hooks) + len(module._global_forward_hooks),
    "trace": sys.gettrace() is not None,
    "profiler": torch.autograd.profiler._is_profiler_enabled,
}))
"""


def run_notebook(cells: list[str], cwd: Path) -> list[list[dict[str, Any]]]:
    """Each cell's outputs, as the kernel sent them."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    env_path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env_path  # the kernel is a child of this process
    try:
        client = nbclient.NotebookClient(
            nb,
            timeout=300,
            kernel_name="python3",
            allow_errors=True,
            resources={"metadata": {"path": str(cwd)}},
        )
        client.execute()
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    return [cell["outputs"] for cell in nb.cells]


def data_of(outputs: list[dict[str, Any]]) -> dict[str, str]:
    """The rich output of a cell (its result, or what it displayed)."""
    return next(o["data"] for o in outputs if o["output_type"] in ("execute_result", "display_data"))


def stdout_of(outputs: list[dict[str, Any]]) -> str:
    return "".join(
        o.get("text", "") for o in outputs if o["output_type"] == "stream" and o["name"] == "stdout"
    )


def test_a_kernel_profiles_a_training_loop_and_shows_the_report_as_html(tmp_path: Path) -> None:
    # GIVEN a notebook that trains a small model on the CPU
    cells = [
        SETUP,
        f"with gpudoctor.profile(out={str(tmp_path / 'block')!r}) as p:\n    train_steps(150)",
        "p.report",
        "import json\nprint(json.dumps([f.id for f in p.report.findings]), p.run_report.record.steps_seen)",
        "%load_ext gpudoctor",
        f"%%gpudoctor --out {tmp_path / 'cell'} --steps 2\ntrain_steps(150)\nprint('the cell ran')",
        LEFT_BEHIND,
    ]
    outputs = run_notebook(cells, tmp_path)
    # THEN the profiled block's report comes back as HTML inline (a frame holding the whole report) and
    # as text, both of the block's traced steps
    shown = data_of(outputs[2])
    assert "3 traced" in shown["text/plain"], shown["text/plain"]
    assert shown["text/html"].startswith('<iframe class="gpudoctor-report" srcdoc="')
    assert "&lt;!DOCTYPE html&gt;" in shown["text/html"] and "class=&quot;bound&quot;" in shown["text/html"]
    assert "gpudoctor.profile()" in shown["text/plain"] and "3 traced" in shown["text/plain"]
    assert stdout_of(outputs[3]).split()[-1] == "150"
    assert (tmp_path / "block" / "record.json").is_file() and (tmp_path / "block" / "analysis.json").is_file()
    # and the magic runs a cell under the doctor and displays its report
    magic = outputs[5]
    assert "the cell ran" in stdout_of(magic)
    assert data_of(magic)["text/html"].startswith('<iframe class="gpudoctor-report"')
    assert "2 traced" in data_of(magic)["text/plain"]
    assert json.loads((tmp_path / "cell" / "record.json").read_text())["outcome"] == "completed"
    # and nothing the doctor installed is left in the kernel
    assert json.loads(stdout_of(outputs[6])) == {
        "active": False, "optimizer_hooks": 0, "module_hooks": 0, "trace": False, "profiler": False
    }  # fmt: skip


def test_a_bad_option_is_one_line(tmp_path: Path) -> None:
    outputs = run_notebook(
        [
            "%load_ext gpudoctor",
            "%%gpudoctor --stpes 3\n1 + 1",
            "import gpudoctor\ngpudoctor.profile(stpes=3)",
        ],
        tmp_path,
    )
    assert stdout_of(outputs[1]).strip().startswith("gpudoctor: error: unknown option --stpes 3; usage:")
    error = next(o for o in outputs[2] if o["output_type"] == "error")
    assert error["ename"] == "UsageError" and "no option stpes" in error["evalue"]


def test_import_gpudoctor_is_cheap_and_changes_nothing() -> None:
    code = (
        "import sys, signal; before = (dict(signal.getsignal(s) for s in ()), sys.gettrace())\n"
        "import gpudoctor\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'rich', 'IPython'))\n"
        "ours = sorted(m for m in sys.modules if m.startswith('gpudoctor.'))\n"
        "print(heavy, ours, sys.gettrace() is None, signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)}, check=True)  # fmt: skip
    assert out.stdout.split("] ", 1)[0] == "["  # no torch, numpy, rich or IPython
    assert "gpudoctor.doctor" not in out.stdout and "gpudoctor.report" not in out.stdout
    assert out.stdout.strip().endswith("True True")


def test_a_block_too_short_to_trace_says_what_it_needed(tmp_path: Path) -> None:
    import torch

    import gpudoctor
    from gpudoctor.runner import capture

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # GIVEN a block of 5 steps WHEN it is profiled
    with gpudoctor.profile(out=tmp_path / "short") as p:
        for _ in range(5):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    # THEN its report has what was measured and says why nothing was traced; nothing stays installed
    report = p.run_report
    assert report.record is not None and report.record.steps_seen == 5 and report.analysis is None
    assert any(n.startswith("nothing was traced: the block ended after 5 steps") for n in report.notes)
    assert "nothing was traced" in str(p.report)
    assert capture._ACTIVE is None


def test_an_exception_in_the_block_goes_on_and_the_run_is_kept(tmp_path: Path) -> None:
    import gpudoctor

    with pytest.raises(ZeroDivisionError), gpudoctor.profile(out=tmp_path / "failed"):
        1 / 0  # noqa: B018
    record = json.loads((tmp_path / "failed" / "record.json").read_text())
    assert record["outcome"] == "exception" and "ZeroDivisionError" in record["error"]
