"""Rounds of `gpudoctor fix` forked from a server process instead of started as fresh interpreters.

A fresh `python -m gpudoctor.fixes.child` spends seconds importing torch, Dynamo (which an optimizer's
constructor pulls in) and the script's libraries before the script's first line — for every round, and
a fix session runs dozens. The server (`python -m gpudoctor.fixes.forkserver`) imports them once and
forks one child per round: each round is still a process of its own, with its own CUDA context,
allocator, compiled code and patches, because the server never touches CUDA (it checks, and refuses
to fork once anything it imported has started CUDA). Only libraries known to import without side
effects are imported ahead (`PRELOADABLE`), never the user's own modules.

Protocol, one JSON object per line: the server says `{"ready": ...}` once; then for each request
`{"argv": [...], "log": path}` (the child's arguments, the file for its output) it answers
`{"pid": n}` when the child is forked and `{"pid": n, "status": code}` when it has ended.

`ForkLauncher` drives the server with the interface of `SubprocessLauncher` (a time limit per round,
which kills the round's whole process group, and Ctrl-C); `start_launcher` falls back to fresh
interpreters wherever the server cannot start.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import gc
import importlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from gpudoctor.fixes.launch import SubprocessLauncher, log_tail, read_round
from gpudoctor.fixes.round import RoundResult
from gpudoctor.fixes.session import FixOptions
from gpudoctor.runner.child import child_env
from gpudoctor.runner.procgroup import end_group
from gpudoctor.runner.rundir import forkserver_log, open_log, round_files
from gpudoctor.util.outfile import close_live

# imported by the server before any fork (what every round imports anyway)
ALWAYS = ("torch", "torch._dynamo", "numpy", "gpudoctor.fixes.child")
# the script's libraries the server may import ahead: well-known, and silent at import (no CUDA, no
# threads, no files written); anything else the script imports, it imports itself in each round
PRELOADABLE = frozenset(
    {
        "accelerate",
        "datasets",
        "diffusers",
        "einops",
        "lightning",
        "numpy",
        "pandas",
        "peft",
        "pytorch_lightning",
        "safetensors",
        "scipy",
        "sklearn",
        "timm",
        "tokenizers",
        "torchaudio",
        "torchmetrics",
        "torchvision",
        "transformers",
    }
)
START_TIMEOUT_S = 120.0
# what CUDA says when a process forked after the driver started tries to use it
FORK_CUDA_ERROR = re.compile(
    r"Cannot re-initialize CUDA in forked subprocess|CUDA error: initialization error"
    r"|cudaErrorInitializationError|CUDA_ERROR_NOT_INITIALIZED|CUDA driver initialization failed"
)
# torch.cuda.is_available() by NVML in the server, so that a library asking it at import does not
# initialize the CUDA driver there (which would make every fork unusable on the GPU)
NVML_CHECK, NVML_CHECK_SET = "PYTORCH_NVML_BASED_CUDA_CHECK", "GPUDOCTOR_FORKSERVER_SET_NVML_CHECK"
SETS_NVML_CHECK = (
    "lightning.fabric",
    "lightning_fabric",
)  # libraries that set it themselves at import: then it stays


def script_libraries(path: str) -> list[str]:
    """The top-level packages of `PRELOADABLE` that the script imports (read, not run)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    found: list[str] = []
    for node in ast.walk(tree):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module]
            if isinstance(node, ast.ImportFrom) and node.module and not node.level
            else []
        )
        for name in names:
            top = name.split(".")[0]
            if top in PRELOADABLE and top not in found:
                found.append(top)
    return found


# -- the server ---------------------------------------------------------------------------------------
def serve(preload: list[str], stdin: IO[str], stdout: IO[str]) -> int:
    """`stdout` carries the protocol alone: whatever else prints goes to the server's stderr."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the rounds and for gpudoctor fix
    loaded, failed = [], {}
    for name in [*ALWAYS, *preload]:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as err:  # a library that does not import here: the rounds import it themselves
            failed[name] = f"{type(err).__name__}: {err}"
    why = _unsafe()
    gc.collect()
    gc.freeze()  # the imported objects stay out of the children's collections: fewer pages copied
    _send(stdout, {"ready": why is None, "why": why, "loaded": loaded, "failed": failed})
    if why is not None:
        return 1
    for line in stdin:
        request = json.loads(line)
        why = _unsafe()
        if why is not None:
            _send(stdout, {"pid": None, "status": None, "why": why})
            return 1
        pid = os.fork()
        if pid == 0:
            _child(request["argv"], request["log"], stdout.fileno())  # never returns
        _send(stdout, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send(stdout, {"pid": pid, "status": os.waitstatus_to_exitcode(status)})
    return 0


def _unsafe(maps: str | None = None) -> str | None:
    """Why forking would not give a clean process, or None. The CUDA driver cannot be used in a child
    forked after it was initialized: torch's own start shows in `torch.cuda.is_initialized()`, a bare
    runtime call (a library asking `cudaGetDeviceCount`) in the loaded driver answering a call that needs
    `cuInit`. Loaded alone it is harmless (torch 2.11's CUDA 13 builds load it at import)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was started while the server imported the libraries"
    if threading.active_count() > 1:  # a lock one of them holds would stay held in every child
        return "a library started a thread at import"
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            maps = ""
    drivers = {
        line.split()[-1]
        for line in maps.splitlines()
        if "/" in line and Path(line.split()[-1]).name.startswith("libcuda.so")
    }
    for path in sorted(drivers):
        state = driver_state(path)
        if state != "not initialized":
            return f"the CUDA driver was {state} while the server imported the libraries"
    return None


CUDA_ERROR_NOT_INITIALIZED = 3


def driver_state(path: str) -> str:
    """What the CUDA driver loaded from `path` has seen: "not initialized" before `cuInit` (every other
    call answers CUDA_ERROR_NOT_INITIALIZED then, and starts nothing), "initialized" after it, "loaded"
    when that cannot be told (then it is not safe to fork)."""
    import ctypes

    try:  # the copy already in the process, never a new load
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        count = ctypes.c_int(0)
        status = lib.cuDeviceGetCount(ctypes.byref(count))
    except (OSError, AttributeError):
        return "loaded"
    if status == CUDA_ERROR_NOT_INITIALIZED:
        return "not initialized"
    return "initialized" if status == 0 else "loaded"


def _child(argv: list[str], log: str, protocol: int) -> None:
    code = 1
    try:
        os.close(protocol)  # the server's answers are not the round's to write (its stdin: below)
        if os.environ.pop(NVML_CHECK_SET, None) == "1" and not any(m in sys.modules for m in SETS_NVML_CHECK):
            os.environ.pop(NVML_CHECK, None)  # the server's setting, not the script's
        os.setpgid(0, 0)  # a group of its own: a time limit ends the round and whatever it started
        signal.signal(signal.SIGINT, signal.default_int_handler)
        out = open_log(Path(log))  # the round's output: the one writer's, as a fresh interpreter's is
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        close_live(out)
        null = os.open(os.devnull, os.O_RDONLY)
        if null != 0:
            os.dup2(null, 0)
            os.close(null)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 — fd 0 belongs to the process
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        from gpudoctor.fixes import child

        sys.argv = [child.__file__, *argv]
        code = child.main(argv)
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        # what an interpreter does on its way out (the script's non-daemon threads, its atexit
        # functions: a log flushed, a DataLoader's workers ended), then out without the server's
        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined]
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _send(stdout: IO[str], message: dict[str, Any]) -> None:
    stdout.write(json.dumps(message) + "\n")
    stdout.flush()


# -- the launcher -------------------------------------------------------------------------------------
class ServerGone(Exception):
    pass


class ForkLauncher(SubprocessLauncher):
    """`SubprocessLauncher`'s rounds, forked from a server (see the module's text)."""

    def __init__(self, *args: Any, preload: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.preload = preload
        self.loaded: list[str] = []
        self._proc: subprocess.Popen[str] | None = None
        # told once why the server went away mid-session (the rounds after it start fresh interpreters)
        self.on_gone: Callable[[str], None] | None = None
        self._forked_ok = False  # a forked round has run its steps

    def start(self) -> str | None:
        """Start the server; None when it is ready, else why not (then nothing is left running)."""
        cmd = [sys.executable, "-m", "gpudoctor.fixes.forkserver", "--preload", ",".join(self.preload)]
        try:
            env = child_env()
            if NVML_CHECK not in env:
                env[NVML_CHECK], env[NVML_CHECK_SET] = "1", "1"
            log = open_log(forkserver_log(self.rounds_dir))
            try:
                self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=log, text=True, env=env)  # fmt: skip
            finally:
                close_live(log)
            hello = self._receive(START_TIMEOUT_S)
        except (OSError, ServerGone, ValueError) as err:
            self.close()
            return f"the fork server did not start: {err}"
        if not hello.get("ready"):
            self.close()
            return f"the fork server cannot fork cleanly: {hello.get('why')}"
        self.loaded = list(hello.get("loaded") or [])
        return None

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin:
                proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()

    def __call__(
        self,
        label: str,
        fixes: tuple[str, ...],
        exact_random: bool,
        switch: tuple[str, ...] = (),
        extend: int = 0,
    ) -> RoundResult:
        if self._proc is None:  # the server went away: the rest in fresh interpreters
            return super().__call__(label, fixes, exact_random, switch, extend)
        out, log = round_files(self.rounds_dir, label)
        out.unlink(missing_ok=True)
        argv = self.command(out, fixes, exact_random, switch, extend)[
            3:
        ]  # without `python -m gpudoctor.fixes.child`
        pid: int | None = None
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps({"argv": argv, "log": str(log)}) + "\n")
            self._proc.stdin.flush()
            pid = self._receive(START_TIMEOUT_S).get("pid")
            if pid is None:
                raise ServerGone("it refused to fork")
            try:
                code = self._receive(self.options.child_timeout_s)["status"]
            except TimeoutError:
                _kill_group(pid)
                self._receive(30.0)
                return self._timed_out(fixes, log_tail(log), exact_random)
        except KeyboardInterrupt:
            if pid is not None:
                _kill_group(pid)
            raise
        except (OSError, ServerGone, ValueError, KeyError) as err:
            why = f"the fork server went away at round {label} ({type(err).__name__}: {err})"
            return self._fresh(why, label, fixes, exact_random, switch, extend)
        result = read_round(out, log, code, fixes, exact_random)
        left = end_group(pid)  # what the round started and left running must not run beside the next
        if left:
            result = replace(result, leftover_processes=left)
        broke = self._fork_broke(result)
        if broke is not None:  # the fork, not the script
            why = f"a round forked from the server could not use the GPU ({broke}) at round {label}"
            return self._fresh(why, label, fixes, exact_random, switch, extend)
        self._forked_ok = self._forked_ok or result.failure is None
        return result

    def _fresh(
        self,
        why: str,
        label: str,
        fixes: tuple[str, ...],
        exact_random: bool,
        switch: tuple[str, ...] = (),
        extend: int = 0,
    ) -> RoundResult:
        """The server is done with: this round and the rest in fresh interpreters, the session told why."""
        self.close()
        if self.on_gone is not None:
            self.on_gone(f"{why}: that round and the rest ran in fresh interpreters")
        return super().__call__(label, fixes, exact_random, switch, extend)

    def _fork_broke(self, result: RoundResult) -> str | None:
        """Why `result` failed for being forked, or None: CUDA saying it cannot start in a forked
        process, or the first forked round crashing outright (every later one would too)."""
        if result.failure is None:
            return None
        text = f"{result.error or ''}\n{result.log_tail}"
        found = FORK_CUDA_ERROR.search(text)
        if found:
            return found.group(0)
        if result.outcome == "crashed" and not self._forked_ok:
            return f"the first forked round crashed: {result.failure}"
        return None

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        stream = self._proc.stdout
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([stream], [], [], min(left, 1.0))
            if ready:
                line = stream.readline()
                if not line:
                    raise ServerGone(f"exit status {self._proc.poll()}")
                return json.loads(line)
            if self._proc.poll() is not None:
                raise ServerGone(f"exit status {self._proc.returncode}")


def _kill_group(pid: int) -> None:
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        with contextlib.suppress(OSError):
            kill()
            return


def start_launcher(
    target: str,
    args: list[str],
    *,
    module: bool,
    options: FixOptions,
    rounds_dir: Path,
    extra: tuple[str, ...] = (),
    fork: bool = True,
) -> tuple[SubprocessLauncher, str]:
    """The launcher for a fix session, and a line saying how its rounds start."""
    plain = SubprocessLauncher(
        target, args, module=module, options=options, rounds_dir=rounds_dir, extra=extra
    )
    if not fork or not hasattr(os, "fork"):
        return plain, "each round in a fresh interpreter"
    preload = [] if module else script_libraries(target)
    launcher = ForkLauncher(
        target, args, module=module, options=options, rounds_dir=rounds_dir, extra=extra, preload=preload
    )
    why = launcher.start()
    if why is not None:
        return plain, f"each round in a fresh interpreter ({why})"
    imported = ", ".join(n for n in launcher.loaded if not n.startswith("gpudoctor"))
    return launcher, f"each round a process forked from a server that imported {imported}"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gpudoctor.fixes.forkserver", description=__doc__)
    parser.add_argument("--preload", default="", help="comma-separated libraries to import ahead")
    a = parser.parse_args(argv)
    preload = [n for n in a.preload.split(",") if n and n.split(".")[0] in PRELOADABLE]
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a library that prints at import must not break the protocol
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    return serve(preload, sys.stdin, protocol)


if __name__ == "__main__":
    sys.exit(main())
