"""`gpudoctor run` as one rank of several (under torchrun, or any launcher that sets RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT): the ranks share rank 0's run directory, each writing `rank-K/` as it goes,
meet at every phase change in a key-value store (torchrun's own, else one rank 0 hosts; never a
collective of the user's process group) so that their traces cover the same steps, and the last to finish
combines them. SIGTERM ends the script like `sys.exit(143)`, so what was captured is written. Nothing runs
at import; `RankRun.close()` puts the signal handler back. The layout: docs/run.md, "Several ranks"."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from gpudoctor.runner.record import RunRecord
from gpudoctor.runner.rundir import rank_dir, write_rank_info, write_record

TIMEOUT_ENV, COMBINE_ENV, PORT_ENV = (
    "GPUDOCTOR_RANK_TIMEOUT_S",
    "GPUDOCTOR_COMBINE_WAIT_S",
    "GPUDOCTOR_STORE_PORT",
)
POLL_S = 0.005


@dataclass(frozen=True)
class RankEnv:
    """What the launcher told this process about its place in the job."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    run_id: str
    agent_store: bool  # torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> RankEnv | None:
        """None outside a launcher, or with a single rank (then it is an ordinary run)."""
        env = os.environ if env is None else env
        try:
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
            addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
        except (KeyError, ValueError):
            return None
        if world < 2 or not 0 <= rank < world:
            return None
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        run_id = f"{env.get('TORCHELASTIC_RUN_ID', f'{addr}-{port}')}-{restart}"
        return cls(
            rank,
            world,
            int(env.get("LOCAL_RANK", rank)),
            addr,
            port,
            run_id,
            env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        )


@dataclass
class RankInfo:
    """rank.json: this rank, and what it saw of the others."""

    rank: int
    world_size: int
    local_rank: int
    host: str
    pid: int
    store: str | None  # where the store was, or None
    phases: dict[str, int] = field(default_factory=dict)  # phase -> the step number it began at
    waited_s: dict[str, float] = field(default_factory=dict)  # phase -> time this rank waited for the others
    missing: dict[str, list[int]] = field(default_factory=dict)  # phase -> ranks not there in time
    link: dict[str, Any] | None = None  # device.links.Link of this rank's GPU, from NVML
    link_missing: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


class RankRun:
    """One rank's side of a run of several. `on_phase` is the capture's phase hook."""

    def __init__(
        self, env: RankEnv, store: Any, out: Path, argv: list[str], started: str, options: dict[str, Any]
    ):
        self.env = env
        self.store = store
        self.timeout_s = float(os.environ.get(TIMEOUT_ENV, "60"))
        self.out = out
        self.dir = rank_dir(out, env.rank)
        self.argv, self.started, self.options = argv, started, options
        where = f"{env.master_addr}:{env.master_port}" if store is not None else None
        self.info = RankInfo(
            env.rank, env.world_size, env.local_rank, socket.gethostname(), os.getpid(), where
        )
        self._old_term: Any = None
        self.script_ended = False  # after it, SIGTERM only cuts the wait for the other ranks short
        self.stopping = threading.Event()

    # -- start and end ------------------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        proposed_out: Path,
        argv: list[str],
        started: str,
        options: dict[str, Any],
        env: RankEnv | None = None,
    ) -> RankRun | None:
        """This rank's run, its directory agreed with rank 0; None when not one of several ranks."""
        env = env or RankEnv.from_environ()
        if env is None:
            return None
        store, why = connect_store(env, float(os.environ.get(TIMEOUT_ENV, "60")))
        out = _agree_out(store, env, proposed_out)
        run = cls(env, store, out, argv, started, options)
        if why:
            run.info.notes.append(f"no store to agree through ({why}): each rank counted its own steps")
        run.dir.mkdir(parents=True, exist_ok=True)
        run._install_sigterm()
        run.write_info()
        return run

    def close(self) -> None:
        if self._old_term is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None
        self.store = None  # the TCPStore client closes with its last reference

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            return  # the script's launcher or the script itself handles it

        def terminated(signum: int, frame: Any) -> None:
            if not self.script_ended:  # run_script turns it into an exit: what was captured is written
                raise SystemExit(128 + signum)
            self.stopping.set()

        self._old_term = signal.signal(signal.SIGTERM, terminated)

    # -- phases --------------------------------------------------------------------------------------
    def on_phase(self, phase: str, capture: Any) -> None:
        """Called by the capture as it enters `phase` ("light", "traced", "done") at a step boundary."""
        step = int(capture.steps_seen)
        self.info.phases[phase] = step
        if phase == "light":
            self._read_link()
            if self.store is not None and self.env.rank == 0:  # before the meeting: read after it
                with contextlib.suppress(Exception):
                    self.store.set("light/plan", str(capture.light_plan()))
        self.meet(phase, step)
        if phase == "light":
            capture.light_target = self._light_plan(capture)
            capture.agree = self if self.store is not None else None
        self.write_progress(capture)

    def _light_plan(self, capture: Any) -> int:
        """The light phase's length in steps, as rank 0 planned it (every rank ends it at one step)."""
        if self.store is not None:
            with contextlib.suppress(Exception):
                if self.store.check(["light/plan"]):
                    return int(self.store.get("light/plan"))
        return int(capture.options.light_steps)

    def post_settled(self, check: int, settled: bool) -> None:
        """This rank's light-phase steps settled, or not, at `check` (`agreement.LightAgreement`)."""
        if self.store is None:
            return
        try:
            self.store.set(f"light/check{check}/rank{self.env.rank}", "1" if settled else "0")
        except Exception as err:  # a store that went away: the phase ends at the next reading
            self.info.notes.append(f"light: store unreachable ({type(err).__name__}: {err}); not extended")
            self.store = None

    def all_settled(self, check: int) -> bool:
        """Every rank's post for `check` (the ranks step together: they are there, or soon): all
        settled, or some post unreadable within the timeout — either way the light phase ends."""
        if self.store is None:
            return True
        t0 = time.perf_counter()
        try:
            posts = []
            for r in range(self.env.world_size):
                key = f"light/check{check}/rank{r}"
                if not _wait_key(self.store, key, self.timeout_s):
                    self.info.notes.append(f"light: rank {r} did not say whether it settled; ended the phase")
                    return True
                posts.append(self.store.get(key) == b"1")
        except Exception as err:
            self.info.notes.append(f"light: store unreachable ({type(err).__name__}: {err}); not extended")
            self.store = None
            return True
        finally:
            waited = self.info.waited_s.get("light_checks", 0.0) + time.perf_counter() - t0
            self.info.waited_s["light_checks"] = round(waited, 6)
        return all(posts)

    def shared(self, key: str, value: int) -> int:
        """Rank 0's `value` for `key` on every rank (`agreement.LightAgreement`): the steps of a block,
        calibrated by each rank alike but posted by rank 0 alone. This rank's own where it cannot be read."""
        if self.store is None:
            return value
        try:
            if self.env.rank == 0:
                self.store.set(f"shared/{key}", str(value))
                return value
            if _wait_key(self.store, f"shared/{key}", self.timeout_s):
                return int(self.store.get(f"shared/{key}"))
        except Exception as err:
            self.info.notes.append(f"{key}: store unreachable ({type(err).__name__}: {err}); this rank's own")
            return value
        self.info.notes.append(f"{key}: rank 0 did not say within {self.timeout_s:g} s; this rank's own")
        return value

    def meet(self, phase: str, step: int) -> None:
        """Wait until every rank has reached `phase` (or the timeout): the last to arrive lets all go."""
        if self.store is None:
            return
        t0 = time.perf_counter()
        try:
            self.store.set(f"{phase}/rank{self.env.rank}", str(step))
            if self.store.add(f"{phase}/arrived", 1) >= self.env.world_size:
                self.store.set(f"{phase}/go", "1")
            if not _wait_key(self.store, f"{phase}/go", self.timeout_s):
                self.info.missing[phase] = self._absent(phase)
                self.info.notes.append(
                    f"{phase}: ranks {self.info.missing[phase]} not there after {self.timeout_s:g} s; went on"
                )
        except Exception as err:  # a store that went away (the agent stopping): carry on alone
            self.info.notes.append(f"{phase}: store unreachable ({type(err).__name__}: {err}); went on")
            self.store = None
        self.info.waited_s[phase] = round(time.perf_counter() - t0, 6)

    def _absent(self, phase: str) -> list[int]:
        return [r for r in range(self.env.world_size) if not self.store.check([f"{phase}/rank{r}"])]

    def _read_link(self) -> None:
        import torch

        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            self.info.link_missing = "no CUDA device in use"
            return
        from gpudoctor.monitor.topology import read_link

        try:
            uuid: str | None = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        except Exception:
            uuid = None
        link, why = read_link(uuid, self.env.local_rank)
        self.info.link, self.info.link_missing = (link.to_json() if link else None), why

    # -- what is written -----------------------------------------------------------------------------
    def write_info(self) -> None:
        write_rank_info(self.dir, self.info.to_json())

    def write_progress(self, capture: Any, outcome: str = "running") -> None:
        """record.json as it stands: a rank killed later still leaves its light phase and its notes."""
        record = RunRecord(
            argv=tuple(self.argv),
            started_at=self.started,
            options=self.options,
            outcome=outcome,
            exit_code=0,
            **capture.result(),
        )
        write_record(self.dir, record)
        self.write_info()

    def finish(self, combine_wait_s: float | None = None) -> bool:
        """Say this rank is done; True when this rank is to combine the ranks (one rank is). Rank 0 waits
        for the others up to `combine_wait_s`, less once told to stop (SIGTERM: the others are gone)."""
        self.script_ended = True
        self.write_info()
        if self.store is None:
            return self.env.rank == 0
        wait = float(os.environ.get(COMBINE_ENV, "20")) if combine_wait_s is None else combine_wait_s
        try:
            done = self.store.add("ended", 1)
            if done < self.env.world_size:
                if self.env.rank != 0:
                    return False
                _wait_count(self.store, "ended", self.env.world_size, wait, self.stopping)
            return _elect(self.store, self.env.rank)
        except Exception as err:  # the store is gone (the agent is stopping): rank 0 writes what there is
            self.info.notes.append(f"finish: store unreachable ({type(err).__name__}: {err})")
            return self.env.rank == 0


END_GROUP_TIMEOUT_S = 30.0


def end_process_group(timeout_s: float = END_GROUP_TIMEOUT_S) -> str | None:
    """The script's default process group ended, as the script would have ended it had gpudoctor not
    stopped it at a step boundary (torch warns at exit on every rank that `destroy_process_group()` was
    not called and resources may leak). Every rank stops at the same step, after that step's
    collectives were issued: the GPU is drained first. Done on a thread given `timeout_s`, so that a
    communicator waiting on a rank that is gone cannot hold this one; a note when it did not end."""
    import sys

    dist = sys.modules.get("torch.distributed")  # the script never imported it: nothing to end
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    failed: list[str] = []

    def end() -> None:
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            dist.destroy_process_group()
        except Exception as err:  # the script's group is the script's: note it, never fail the run
            failed.append(f"{type(err).__name__}: {err}")

    worker = threading.Thread(target=end, name="gpudoctor-end-group", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return f"the script's process group did not end within {timeout_s:.0f} s of its stop"
    return f"the script's process group could not be ended: {failed[0]}" if failed else None


def connect_store(env: RankEnv, timeout_s: float) -> tuple[Any, str | None]:
    """(a store under gpudoctor/<run id>/, None) or (None, why not)."""
    try:
        from torch.distributed import PrefixStore, TCPStore
    except ImportError as err:
        return None, f"torch.distributed is not available: {err}"
    timeout = timedelta(seconds=timeout_s)
    try:
        if env.agent_store:
            store = TCPStore(env.master_addr, env.master_port, is_master=False, timeout=timeout)
        else:
            port = int(os.environ.get(PORT_ENV, env.master_port + 1))
            store = TCPStore(
                env.master_addr,
                port,
                env.world_size,
                is_master=env.rank == 0,
                timeout=timeout,
                wait_for_workers=False,
            )
    except Exception as err:
        return None, f"{type(err).__name__}: {err}"
    return PrefixStore(f"gpudoctor/{env.run_id}/", store), None


@contextlib.contextmanager
def sigterm_held() -> Iterator[list[int]]:
    """SIGTERM noted, not acted on, inside the block (the main thread only): the rank that combined
    prints its report while torchrun, one rank having failed, stops the others; the default action would
    end it half-way and lose its buffered output (torchrun kills it outright after its own grace time)."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    old = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, old)


def _agree_out(store: Any, env: RankEnv, proposed: Path) -> Path:
    if store is None:
        return proposed
    with contextlib.suppress(Exception):
        if env.rank == 0:
            store.set("out", str(proposed.resolve()))
            return proposed
        if _wait_key(store, "out", float(os.environ.get(TIMEOUT_ENV, "60"))):
            return Path(store.get("out").decode())
    return proposed


def _wait_key(store: Any, key: str, timeout_s: float) -> bool:
    """Poll (store.wait logs a warning on every timeout) until `key` is set."""
    end = time.monotonic() + timeout_s
    delay = POLL_S
    while not store.check([key]):
        if time.monotonic() >= end:
            return False
        time.sleep(delay)
        delay = min(delay * 1.5, 0.02)
    return True


def _wait_count(store: Any, key: str, target: int, timeout_s: float, stop: threading.Event) -> bool:
    end = time.monotonic() + timeout_s
    while store.add(key, 0) < target:
        if time.monotonic() >= end or stop.wait(0.05):
            return False
    return True


def _elect(store: Any, rank: int) -> bool:
    won = store.compare_set("combiner", "", str(rank))
    return bytes(won).decode() == str(rank)


OnPhase = Callable[[str, Any], None]
