"""Where a step of the user's loop ends, found without changing the script. Sources, strongest first:
`gpudoctor.step()`, an optimizer step (torch's global post-hook), then what discovery
(`discovery.decide`) makes of the run's first moments — a call of the root module, a `generate`-style
iteration, a DataLoader batch, a plain loop's iteration — and timed windows when nothing repeats; a
stronger source seen later takes over (`on_definition`). `install()` / `uninstall()` put in and take out
every hook, the signal tick and the compile callbacks discovery needs."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from gpudoctor.runner.compile_time import CompileTime
from gpudoctor.runner.discovery import Observations, RootCall, StepDefinition, decide
from gpudoctor.runner.hooks import eager_only
from gpudoctor.runner.loops import LoopKey, LoopWatcher, UserCode
from gpudoctor.runner.modules import CallHook, RootWatcher

CLOSURE_LABEL = "gpudoctor.closure"
COMPILE_HOOK_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"
TICK_S = 0.5  # discovery's clock, in the main thread
DECIDE_EVERY_S = 0.002  # the least time between two decisions made at loop iterations
STALE_SOURCES = ("module", "dataloader")  # sources a loop of the script can replace when they stop
STALE_ITERATIONS, STALE_S = 20, 1.0

EXPLICIT = StepDefinition("explicit", "gpudoctor.step() in the script")


class StepDetector:
    def __init__(
        self,
        on_step: Callable[[], None],
        on_definition: Callable[[StepDefinition, bool], None] = lambda d, restart: None,
        script_files: tuple[str, ...] = (),
        discover: bool = True,
    ) -> None:
        self.on_step = on_step
        self.on_definition = on_definition  # (definition, restart): restart when it replaces another
        self.definition: StepDefinition | None = None
        self.label_closures = False  # set by the capture while tracing
        self.calls = 0  # root module calls so far, once the root is known
        # The script's iteration that the first step after the definition is (1 where the source counts
        # from the script's first iteration): discovery may watch a few root-module calls before it
        # decides, so that the step numbers still count the script's own iterations.
        self.first_step = 1
        self.root_module: Any = None  # the module the script calls per step, once known
        self.notes: list[str] = []
        self._discover = discover
        self._user_code = UserCode(script_files)
        self._obs = Observations(time.perf_counter())
        self._decided_at = 0.0  # when a loop's iteration last had discovery decide
        self._post_hook: Any = None
        self._pre_hook: Any = None
        self._lead_optimizer: int | None = None
        self._batches = 0
        self._loader_next: Any = None  # DataLoader iterators' own __next__, while ours stands in
        self._roots: RootWatcher | None = None
        self._root_modules: dict[int, Any] = {}  # id -> module, while discovering
        self._loops: LoopWatcher | None = None
        self._call_hook: CallHook | None = None
        self._alarm: Any = None  # the SIGALRM handler we replaced, while ours is in
        self._alarm_found: Any = None  # the handler there was when ours first went in
        self._in_alarm = False
        self._warning_filter: Any = None
        self._idle_iterations: dict[LoopKey, int] = {}  # loop iterations since the last step
        self._last_step = time.perf_counter()
        self._compiling = CompileTime()  # while discovering: compilation is not "nothing repeats"
        self._optimizer_init: tuple[Any, Any] | None = None  # Optimizer.__init__: torch's, and ours

    # -- installation --------------------------------------------------------------------------------
    def install(self) -> StepDetector:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        from torch.utils.data import dataloader

        # eager only: a compiled optimizer step (`torch.compile` around `optimizer.step()`, PyTorch's recipe)
        # traces them, and they recompiled it at nearly every step; its steps come from the other sources
        self._post_hook = register_optimizer_step_post_hook(eager_only(self._on_optimizer_step))
        self._pre_hook = register_optimizer_step_pre_hook(eager_only(self._label_closure))
        original = dataloader._BaseDataLoaderIter.__next__
        detector = self

        def __next__(iterator: Any) -> Any:
            batch = original(iterator)
            detector._on_batch()
            return batch

        dataloader._BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign]
        self._loader_next = original
        if self._discover:
            # torch.compile warns that global hooks fire once more for its wrapper: ours expect that
            warnings.filterwarnings("ignore", message=COMPILE_HOOK_WARNING)
            self._warning_filter = warnings.filters[0]
            self._roots = RootWatcher(self._on_root, self._user_code).start()
            self._count_optimizers()
            self._compiling.install()
            self._loops = LoopWatcher(self._on_iteration, self._user_code).start()
            if self._loops.unavailable:
                self.notes.append(f"loops not watched: {self._loops.unavailable}")
            self._start_alarm(TICK_S)
        return self

    def _count_optimizers(self) -> None:
        """While discovering, count the optimizers the script builds (`Observations.optimizers`)."""
        import torch

        init, obs = torch.optim.Optimizer.__init__, self._obs

        def counted(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            init(optimizer, *args, **kwargs)
            obs.optimizers += 1

        torch.optim.Optimizer.__init__ = counted  # type: ignore[method-assign]
        self._optimizer_init = (init, counted)

    def _uncount_optimizers(self) -> None:
        if self._optimizer_init is None:
            return
        import torch

        init, counted = self._optimizer_init
        if torch.optim.Optimizer.__init__ is counted:  # not wrapped again since (a fix's observer)
            torch.optim.Optimizer.__init__ = init  # type: ignore[method-assign]
        self._optimizer_init = None

    def uninstall(self) -> None:
        """Safe to call twice, also after a failure."""
        for hook in (self._post_hook, self._pre_hook):
            if hook is not None:
                hook.remove()
        self._post_hook = self._pre_hook = None
        if self._loader_next is not None:
            from torch.utils.data import dataloader

            dataloader._BaseDataLoaderIter.__next__ = self._loader_next  # type: ignore[method-assign]
            self._loader_next = None
        self._stop_discovery(keep_loop=False)
        self._stop_alarm()
        if self._alarm_found is not None and signal.getsignal(signal.SIGALRM) == self._on_alarm:
            # put back by someone who saved the handlers while ours was in (Lightning's signal connector)
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGALRM, self._alarm_found)
        if self._warning_filter is not None:
            with contextlib.suppress(ValueError):
                warnings.filters.remove(self._warning_filter)
            warnings._filters_mutated()  # type: ignore[attr-defined]
            self._warning_filter = None
        if self._call_hook is not None:
            self._call_hook.remove()
            self._call_hook = None

    # -- the sources ---------------------------------------------------------------------------------
    def explicit_step(self) -> None:
        if self.definition is not EXPLICIT:
            self._commit(EXPLICIT)
        self._step()

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.definition is EXPLICIT:
            return
        if self._lead_optimizer is None:
            self._lead_optimizer = id(optimizer)
            name = type(optimizer).__name__
            self._commit(StepDefinition("optimizer", f"one step of the optimizer ({name}.step)"))
        if id(optimizer) == self._lead_optimizer:
            self._step()

    def _label_closure(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        """While tracing, the closure given to optimizer.step (Lightning, LBFGS) runs in a profiler range
        of its own, so its forward and backward are not counted as the optimizer's."""
        if not self.label_closures:
            return None
        if kwargs.get("closure") is not None:
            return args, {**kwargs, "closure": _labelled(kwargs["closure"])}
        if args and callable(args[0]):
            return (_labelled(args[0]), *args[1:]), kwargs
        return None

    def _on_batch(self) -> None:
        if self.definition is None:
            self._obs.batches.append(time.perf_counter())
            self._decide()
        elif self.definition.source == "dataloader":
            self._batches += 1
            if self._batches > 1:  # the fetch of each batch after the first ends the step before
                self._step()

    def _on_root(self, call: RootCall, module: Any) -> None:
        if self.definition is None:
            self._obs.roots.append(call)
            self._root_modules.setdefault(call.module_id, module)
            self._decide()

    def _on_iteration(self, loop: LoopKey, when: float) -> None:
        if self.definition is None:
            self._obs.add_iteration(loop, when)
            # a loop iterating every microsecond is decided on at most every DECIDE_EVERY_S (the clock's
            # ticks decide too): deciding at each of its iterations would slow it tenfold
            if when - self._decided_at >= DECIDE_EVERY_S:
                self._decided_at = when
                self._decide()
        elif self.definition.loop is loop:
            self._step()
        elif self.definition.source in STALE_SOURCES:
            # The model's calls (or the batches) stopped while a loop of the script runs on: a CUDA graph
            # captured from the model and replayed, say. That loop is the step.
            self._idle_iterations[loop] = self._idle_iterations.get(loop, 0) + 1
            if self._idle_iterations[loop] >= STALE_ITERATIONS and when - self._last_step >= STALE_S:
                self._commit(
                    StepDefinition("loop", f"one iteration of the loop at {loop.describe()}", loop=loop)
                )

    def _step(self) -> None:
        self._last_step = time.perf_counter()
        if self._idle_iterations:
            self._idle_iterations.clear()
        self.on_step()

    def _on_call(self) -> None:
        self.calls += 1
        if self.definition is not None and self.definition.source == "module":
            self._step()

    # -- deciding ------------------------------------------------------------------------------------
    def _decide(self) -> None:
        if self.definition is not None:
            return
        found = decide(self._obs, time.perf_counter(), self._compiling.seconds())
        if found is not None:
            self._commit(found)

    def _commit(self, definition: StepDefinition) -> None:
        replaced = self.definition is not None
        if self.definition is not None and self.definition.source == "window":
            self._stop_alarm()
        self.definition = definition
        if self.root_module is None:
            self.root_module = self._most_called_root()
        self.first_step = 1
        if definition.source == "module" and self.root_module is not None:
            # committed in the pre-hook of the root's c-th call: the step that ends at the next call is
            # the script's iteration c
            self.first_step = max(1, sum(r.module_id == id(self.root_module) for r in self._obs.roots))
        self._stop_discovery(keep_loop=definition.loop is not None or definition.source in STALE_SOURCES)
        if self._call_hook is None and self.root_module is not None:
            self._call_hook = CallHook(self.root_module, self._on_call)
        if definition.source == "window" and definition.window_s:
            self._start_alarm(definition.window_s)
        self.on_definition(definition, replaced)

    def _most_called_root(self) -> Any:
        if not self._obs.roots:
            return None
        counts: dict[int, int] = {}
        for r in self._obs.roots:
            counts[r.module_id] = counts.get(r.module_id, 0) + 1
        return self._root_modules.get(max(counts, key=counts.__getitem__))

    def _stop_discovery(self, keep_loop: bool) -> None:
        self._compiling.uninstall()
        self._uncount_optimizers()
        if self._roots is not None:
            self._roots.stop()
            self._roots = None
        if self._loops is not None:
            if keep_loop and self.definition is not None:
                if self.definition.loop is not None:
                    self._loops.follow(self.definition.loop)
            else:
                self._loops.stop()
                self._loops = None
        if self.definition is None or self.definition.source != "window":
            self._stop_alarm()
        self._root_modules = {}

    # -- the main thread's clock (discovery ticks, then timed windows) -----------------------------------
    def _start_alarm(self, interval_s: float) -> None:
        if threading.current_thread() is not threading.main_thread():
            self.notes.append("not in the main thread: no timed discovery or windows")
            return
        if self._alarm is None:
            current = signal.getsignal(signal.SIGALRM)
            if current not in (signal.SIG_DFL, signal.SIG_IGN, None):
                self.notes.append("the script handles SIGALRM itself: no timed discovery or windows")
                return
            self._alarm = current
            if self._alarm_found is None:
                self._alarm_found = current
            signal.signal(signal.SIGALRM, self._on_alarm)
            signal.siginterrupt(signal.SIGALRM, False)  # restart system calls the tick interrupts
        signal.setitimer(signal.ITIMER_REAL, interval_s, interval_s)

    def _stop_alarm(self) -> None:
        if self._alarm is None:
            return
        with contextlib.suppress(ValueError):  # not the main thread: nothing of ours can be in
            signal.setitimer(signal.ITIMER_REAL, 0, 0)
            signal.signal(signal.SIGALRM, self._alarm)
        self._alarm = None

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self._in_alarm:
            return
        self._in_alarm = True
        try:
            if self.definition is None:
                self._decide()
            elif self.definition.source == "window":
                self._step()
        finally:
            self._in_alarm = False


def _labelled(closure: Callable[[], Any]) -> Callable[[], Any]:
    def closure_in_range() -> Any:
        from torch.profiler import record_function

        with record_function(CLOSURE_LABEL):
            return closure()

    return closure_in_range
