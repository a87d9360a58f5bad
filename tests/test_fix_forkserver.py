"""The rounds of `gpudoctor fix` forked from a server that imported the libraries once
(`fixes.forkserver`): each round a process of its own that leaves nothing behind in the next, a time
limit that ends a round and what it started, and fresh interpreters wherever the server is not there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gpudoctor.fixes.forkserver import ForkLauncher, script_libraries, start_launcher
from gpudoctor.fixes.launch import SubprocessLauncher
from gpudoctor.fixes.session import FixOptions

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

LOOP = """
import os, sys, torch
import numpy
print("round pid", os.getpid(), "saw marker", getattr(numpy, "_gpudoctor_marker", None), flush=True)
numpy._gpudoctor_marker = os.getpid()  # a round's change to a library the server imported
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(40):
    model(torch.randn(4, 8)).sum().backward()
    opt.step(); opt.zero_grad()
"""


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(body))
    return path


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[ForkLauncher]:
    script = write(tmp_path, LOOP)
    options = FixOptions(warmup=2, steps=5, record=2, warmup_s=0.0, steps_s=0.0, child_timeout_s=60.0)
    made, how = start_launcher(str(script), [], module=False, options=options, rounds_dir=tmp_path / "rounds")
    assert isinstance(made, ForkLauncher), how
    try:
        yield made
    finally:
        made.close()


def test_the_script_libraries_it_may_import_ahead_are_read_not_run(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        """
        import os, transformers
        from lightning.pytorch import Trainer
        from . import sibling
        import my_models, torchvision.models as tvm
        raise SystemExit("never run")
        """,
    )
    assert script_libraries(str(script)) == ["transformers", "lightning", "torchvision"]
    assert script_libraries(str(tmp_path / "missing.py")) == []


def test_each_round_is_a_process_of_its_own_that_leaves_nothing_to_the_next(
    launcher: ForkLauncher, tmp_path: Path
) -> None:
    first = launcher("baseline-0", (), False)
    second = launcher("01-tf32-b1", ("tf32",), False)
    for result in (first, second):
        assert result.outcome == "stopped" and len(result.step_times_us) == 5 and result.error is None
    logs = [(tmp_path / "rounds" / f"{n}.log").read_text() for n in ("baseline-0", "01-tf32-b1")]
    pids = [int(log.split("round pid ")[1].split()[0]) for log in logs]
    server = launcher._proc.pid if launcher._proc else None
    assert len(set(pids)) == 2 and server not in pids and os.getpid() not in pids
    assert all("saw marker None" in log for log in logs)  # the first round's change did not reach the second
    assert second.patches["tf32"].applied


def test_a_round_past_its_time_limit_is_ended_with_what_it_started(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        """
        import signal, subprocess, sys, time
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("helper", helper.pid, flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # nothing ends it from inside
        time.sleep(600)
        """,
    )
    options = FixOptions(warmup=1, steps=2, warmup_s=0.0, steps_s=0.0, child_timeout_s=4.0)
    made, _ = start_launcher(str(script), [], module=False, options=options, rounds_dir=tmp_path / "rounds")
    assert isinstance(made, ForkLauncher)
    try:
        result = made("baseline-0", (), False)
        assert result.outcome == "timeout" and result.error == "ran past 4 s"
        helper = int((tmp_path / "rounds" / "baseline-0.log").read_text().split("helper ")[1].split()[0])
        deadline = time.monotonic() + 10
        while _alive(helper) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(helper)
        # the server is still there for the next round
        assert made._proc is not None and made._proc.poll() is None
    finally:
        made.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split()[2] == "Z")  # a zombie is gone


def test_when_the_server_goes_away_the_rounds_go_on_in_fresh_interpreters(
    launcher: ForkLauncher,
) -> None:
    assert launcher._proc is not None
    told: list[str] = []
    launcher.on_gone = told.append
    launcher._proc.kill()
    launcher._proc.wait()
    result = launcher("baseline-0", (), False)
    assert result.outcome == "stopped" and len(result.step_times_us) == 5
    assert launcher._proc is None  # and it stays with fresh interpreters
    # AND the session is told once (its report says the rounds did not all start alike)
    assert launcher("baseline-1", (), False).outcome == "stopped"
    assert len(told) == 1 and told[0].startswith("the fork server went away at round baseline-0 (")


def test_no_fork_or_no_server_means_fresh_interpreters_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = write(tmp_path, LOOP)
    args = {"module": False, "options": FixOptions(), "rounds_dir": tmp_path / "rounds"}
    plain, how = start_launcher(str(script), [], fork=False, **args)
    assert type(plain) is SubprocessLauncher and how == "each round in a fresh interpreter"
    monkeypatch.setattr(ForkLauncher, "start", lambda self: "the fork server cannot fork cleanly: CUDA")
    plain, how = start_launcher(str(script), [], **args)
    assert type(plain) is SubprocessLauncher and how.endswith("(the fork server cannot fork cleanly: CUDA)")


def test_the_server_will_not_fork_once_the_cuda_driver_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudoctor.fixes import forkserver
    from gpudoctor.fixes.forkserver import _unsafe

    monkeypatch.setattr(forkserver.threading, "active_count", lambda: 1)  # as in the server: no thread
    # as in the server, which never starts CUDA (this test process may have, on a GPU machine)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)

    maps = "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n7f02-7f03 rw-p 0 0:0 0\n"
    assert _unsafe(maps) is None
    driver = maps + "7f04-7f05 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04\n"
    # listed but not in this process (nothing to ask): not safe
    assert _unsafe(driver) == "the CUDA driver was loaded while the server imported the libraries"
    assert _unsafe(maps + "7f06-7f07 r-xp 0 08:01 3 /opt/lib/libcudart.so.13\n") is None  # the runtime is not


FAKE_DRIVER = """
static int started = 0;
int cuInit(unsigned int flags) { started = 1; return 0; }
int cuDeviceGetCount(int *count) { if (!started) return 3; *count = 1; return 0; }
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_a_loaded_driver_is_safe_until_cuinit(tmp_path: Path) -> None:
    """torch 2.11's CUDA 13 builds load libcuda at import without starting it: forking stays safe, until
    something calls cuInit. Checked on a stand-in driver with the same two entry points, in a process of
    its own (the check asks the copy already loaded)."""
    source = tmp_path / "driver.c"
    source.write_text(FAKE_DRIVER)
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    probe = (
        "import ctypes, sys, threading\n"
        "threading.active_count = lambda: 1\n"
        "from gpudoctor.fixes.forkserver import _unsafe\n"
        f"lib = ctypes.CDLL({str(lib)!r})\n"
        "print(_unsafe())\n"
        "lib.cuInit(0)\n"
        "print(_unsafe())\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "None",
        "the CUDA driver was initialized while the server imported the libraries",
    ]


def test_the_servers_own_settings_do_not_reach_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)  # the user did not set it
    script = write(
        tmp_path, 'import os\nprint("nvml check", os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"))\n' + LOOP
    )
    options = FixOptions(warmup=2, steps=5, record=2, warmup_s=0.0, steps_s=0.0, child_timeout_s=60.0)
    made, how = start_launcher(str(script), [], module=False, options=options, rounds_dir=tmp_path / "rounds")
    assert isinstance(made, ForkLauncher), how
    try:
        assert made("baseline-0", (), False).outcome == "stopped"
    finally:
        made.close()
    assert "nvml check None" in (tmp_path / "rounds" / "baseline-0.log").read_text()


@pytest.mark.gpu
def test_forked_rounds_use_the_gpu(tmp_path: Path) -> None:
    """On a GPU machine: the server imported torch and Dynamo without starting CUDA, and each forked
    round starts its own CUDA context and runs its steps there."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    script = write(
        tmp_path,
        LOOP.replace("torch.nn.Linear(8, 8)", "torch.nn.Linear(8, 8).cuda()").replace(
            "torch.randn(4, 8)", "torch.randn(4, 8, device='cuda')"
        ),
    )
    options = FixOptions(warmup=2, steps=5, record=2, warmup_s=0.0, steps_s=0.0, child_timeout_s=120.0)
    made, how = start_launcher(str(script), [], module=False, options=options, rounds_dir=tmp_path / "rounds")
    assert isinstance(made, ForkLauncher), how
    try:
        results = [made(f"round-{k}", (), False) for k in range(2)]
    finally:
        made.close()
    for r in results:
        assert r.outcome == "stopped" and r.clock == "cuda_events" and len(r.step_times_us) == 5, r.log_tail


def test_a_round_ends_as_an_interpreter_does(launcher: ForkLauncher, tmp_path: Path) -> None:
    """The script's atexit functions run (a log it flushes at exit, say), as in a fresh interpreter."""
    done = tmp_path / "at-exit.txt"
    script = write(
        tmp_path,
        f"import atexit, pathlib\natexit.register(pathlib.Path({str(done)!r}).write_text, 'ran')\n" + LOOP,
    )
    launcher.target = str(script)
    assert launcher("baseline-0", (), False).outcome == "stopped"
    assert done.read_text() == "ran"


HUNG_EXIT = """
import threading
threading.Thread(target=threading.Event().wait, name="never-ends").start()  # not a daemon: exit waits
"""


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "fresh"])
def test_a_round_whose_way_out_hangs_is_ended_soon_after_its_result(tmp_path: Path, fork: bool) -> None:
    """Once a round has written its result, its exit gets EXIT_GRACE_S: a thread of the script's that
    never ends (on an H100, pinned-memory loaders held rounds 40–76 s past their result) does not hold
    the session, and the round's log says where its threads were."""
    from gpudoctor.runner.child import EXIT_GRACE_S

    script = write(tmp_path, HUNG_EXIT + LOOP)
    options = FixOptions(warmup=2, steps=5, record=2, warmup_s=0.0, steps_s=0.0, child_timeout_s=120.0)
    made, how = start_launcher(
        str(script), [], module=False, options=options, rounds_dir=tmp_path / "rounds", fork=fork
    )
    try:
        assert isinstance(made, ForkLauncher) == fork, how
        t0 = time.monotonic()
        result = made("baseline-0", (), False)
        took = time.monotonic() - t0
    finally:
        if isinstance(made, ForkLauncher):
            made.close()
    assert result.outcome == "stopped" and result.failure is None
    assert took < EXIT_GRACE_S + 30, took  # not the 120 s time limit
    log = (tmp_path / "rounds" / "baseline-0.log").read_text()
    assert "had not ended 5 s after writing its result" in log
    assert "never-ends" in log or "in wait" in log  # faulthandler's stack of the hung thread


def test_the_server_will_not_fork_beside_a_thread_a_library_started(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from gpudoctor.fixes import forkserver
    from gpudoctor.fixes.forkserver import _unsafe

    # as in the server, which never starts CUDA (this test process may have, on a GPU machine)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert _unsafe("") == "a library started a thread at import"
    finally:
        stop.set()
        thread.join()
    monkeypatch.setattr(forkserver.threading, "active_count", lambda: 1)  # (this test process has others)
    assert _unsafe("") is None


def test_a_library_that_sets_the_nvml_check_itself_keeps_it_in_the_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1 when imported: a round of a Lightning script has it,
    as a fresh interpreter would, although Lightning was imported by the server."""
    pytest.importorskip("lightning")
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    script = write(
        tmp_path,
        'import os, lightning\nprint("nvml check", os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"))\n' + LOOP,
    )
    options = FixOptions(warmup=2, steps=5, record=2, warmup_s=0.0, steps_s=0.0, child_timeout_s=120.0)
    made, how = start_launcher(str(script), [], module=False, options=options, rounds_dir=tmp_path / "rounds")
    assert isinstance(made, ForkLauncher) and "lightning" in made.loaded, how
    try:
        assert made("baseline-0", (), False).outcome == "stopped"
    finally:
        made.close()
    assert "nvml check 1" in (tmp_path / "rounds" / "baseline-0.log").read_text()


def test_a_round_that_cannot_use_cuda_for_being_forked_runs_again_fresh(tmp_path: Path) -> None:
    """Where the driver was loaded in the server and a forked round still cannot start CUDA, the fork
    is to blame, not the script: that round and the rest run in fresh interpreters, and the session
    is told why. Stood in for by a script that fails so only when its parent is the fork server."""
    fails_forked = (
        "import os\n"
        'if b"gpudoctor.fixes.forkserver" in open(f"/proc/{os.getppid()}/cmdline", "rb").read():\n'
        '    raise RuntimeError("CUDA error: initialization error")\n'
    )
    script = write(tmp_path, fails_forked + LOOP)
    options = FixOptions(warmup=2, steps=5, record=2, warmup_s=0.0, steps_s=0.0, child_timeout_s=60.0)
    made, how = start_launcher(str(script), [], module=False, options=options, rounds_dir=tmp_path / "rounds")
    assert isinstance(made, ForkLauncher), how
    told: list[str] = []
    made.on_gone = told.append
    try:
        first = made("baseline-0", (), False)
        second = made("01-tf32-b1", ("tf32",), False)
    finally:
        made.close()
    assert first.failure is None and second.failure is None and len(first.step_times_us) == 5
    assert made._proc is None and len(told) == 1
    assert told[0].startswith(
        "a round forked from the server could not use the GPU (CUDA error: initialization error)"
    )
