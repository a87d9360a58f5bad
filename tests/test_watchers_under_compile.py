"""gpudoctor's hooks in torch under torch.compile (`runner.hooks.eager_only`: the root watcher, the call hook,
the memory probe, the fix rounds' numerics recorder and observer): traced into the user's graph, they fold
away there — no graph break, no recompilation (either would change the compiled step we measure) and no
reads of our caches while the discovery threads write them (CI once saw dynamo fail with "dictionary
changed size during iteration"). The step detector's optimizer hooks: tests/test_run_steps.py."""

from __future__ import annotations

from typing import Any

import torch

from gpudoctor.runner.discovery import RootCall
from gpudoctor.runner.loops import UserCode
from gpudoctor.runner.modules import CallHook, RootWatcher


def _graphs_of(fn: Any, *args: Any) -> int:
    torch._dynamo.reset()
    graphs: list[Any] = []

    def counting(graph: torch.fx.GraphModule, _inputs: Any) -> Any:
        graphs.append(graph)
        return graph.forward

    torch.compile(fn, backend=counting)(*args)
    return len(graphs)


def test_the_root_watcher_and_call_hook_do_not_break_a_compiled_graph() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    roots: list[tuple[RootCall, Any]] = []
    calls: list[int] = []
    watcher = RootWatcher(lambda call, module: roots.append((call, module)), UserCode()).start()
    hook = CallHook(model, lambda: calls.append(1))
    try:
        x = torch.randn(4, 8)
        assert _graphs_of(lambda t: model(t).sum(), x) == 1  # one graph: the hooks folded away
        assert roots == [] and calls == []  # nothing recorded from inside the compiled code
        model(x)  # the same model called eagerly is still seen
        assert [m for _c, m in roots] == [model] and calls == [1]
    finally:
        hook.remove()
        watcher.stop()
        torch._dynamo.reset()


def test_the_root_watcher_and_call_hook_see_each_call_of_a_model_compiled_with_module_compile() -> None:
    # `model.compile()` runs the model's hooks inside its compiled call: `gpudoctor run`'s step
    # discovery saw no model there and timed an inference loop by its iterations; now each call is
    # seen from outside the compiled code, once, and compiled into one graph
    before = torch.nn.Module.compile
    roots: list[tuple[RootCall, Any]] = []
    calls: list[int] = []
    watcher = RootWatcher(lambda call, module: roots.append((call, module)), UserCode()).start()
    torch._dynamo.reset()
    graphs: list[Any] = []

    def counting(graph: torch.fx.GraphModule, _inputs: Any) -> Any:
        graphs.append(graph)
        return graph.forward

    model = _Net()
    model.compile(backend=counting)
    hook = CallHook(model, lambda: calls.append(1))
    try:
        for _ in range(3):
            model(torch.ones(2, 4))
        assert [m for _c, m in roots] == [model] * 3 and calls == [1, 1, 1] and len(graphs) == 1
    finally:
        hook.remove()
        watcher.stop()
        torch._dynamo.reset()
    assert torch.nn.Module.compile is before  # put back with the last listener


def test_the_memory_probe_does_not_break_a_compiled_graph() -> None:
    from gpudoctor.runner.memory_probe import ModuleProbe

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    probe = ModuleProbe({}, lambda: 0, cuda=False).install()
    try:
        x = torch.randn(4, 8)
        assert _graphs_of(lambda t: model(t).sum(), x) == 1
        assert probe.calls == []
        model(x)
        assert [c["type"] for c in probe.calls] == ["Linear", "ReLU", "Sequential"]  # in order of return
    finally:
        probe.remove()
        torch._dynamo.reset()


def test_hooks_on_a_root_found_eagerly_do_not_recompile_it_inside_compiled_code() -> None:
    # GIVEN the fix rounds' root hooks (the numerics recorder, the observer of input shapes) on a model
    # the script calls once eagerly (a warm-up, an evaluation) and then inside a compiled train step
    from gpudoctor.fixes.observe import Observer
    from gpudoctor.runner.hooks import RootFinder
    from gpudoctor.runner.outputs import OutputRecorder

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    finder = RootFinder().install()
    observer = Observer(finder)
    recorder = OutputRecorder(finder, limit=3)
    observer.apply()
    recorder.apply()
    try:
        model(torch.randn(2, 8))
        # WHEN the compiled step calls it six times
        torch._dynamo.reset()
        graphs: list[Any] = []

        def counting(graph: torch.fx.GraphModule, _inputs: Any) -> Any:
            graphs.append(graph)
            return graph.forward

        step = torch.compile(lambda t: model(t).sum(), backend=counting)
        for _ in range(6):
            step(torch.randn(2, 8))
        # THEN it compiled once (traced, the hooks' lists and removals recompiled it at each call before)
        assert len(graphs) == 1
        assert recorder.values()[0] == "output" and len(recorder.values()[1]) == 1  # the eager call's
    finally:
        recorder.undo()
        observer.undo()
        finder.uninstall()
        torch._dynamo.reset()


def test_the_observers_ddp_counting_does_not_recompile_a_compiled_ddp(tmp_path: Any) -> None:
    # GIVEN the fix rounds' observer, which counts each DDP model's forwards per optimizer step from a
    # stand-in for DistributedDataParallel.forward, and a DDP model compiled whole
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from gpudoctor.fixes.observe import Observer
    from gpudoctor.runner.hooks import RootFinder

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    finder = RootFinder().install()
    observer = Observer(finder)
    observer.apply()
    try:
        model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch._dynamo.reset()
        graphs: list[Any] = []

        def counting(graph: torch.fx.GraphModule, _inputs: Any) -> Any:
            graphs.append(graph)
            return graph.forward

        step = torch.compile(model, backend=counting)
        breaks = torch._dynamo.utils.counters["graph_break"]
        seen = []
        for _ in range(6):
            step(torch.randn(2, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            seen.append((len(graphs), sum(breaks.values())))
        # THEN its counting is not traced: nothing is traced again after the first calls (traced, its
        # counters were guarded on and the stand-in retraced, to the same graph break, at every call),
        # and it still counts
        assert seen[1:] == [seen[1]] * 5, seen
        assert observer.observations().ddp[0].micro_batches == 1
    finally:
        observer.undo()
        finder.uninstall()
        dist.destroy_process_group()
        torch._dynamo.reset()


def test_the_fix_rounds_root_finder_sees_a_module_the_script_compiles_with_module_compile() -> None:
    # `model.compile()` runs the module's hooks inside its compiled call, where they fold away: the
    # finder wraps that call instead (Module.compile, while it watches) and sees it as an eager call
    from gpudoctor.runner.hooks import RootFinder

    torch._dynamo.reset()
    graphs: list[Any] = []

    def counting(graph: torch.fx.GraphModule, _inputs: Any) -> Any:
        graphs.append(graph)
        return graph.forward

    before = torch.nn.Module.compile
    finder = RootFinder(until=lambda: False).install()
    try:
        model = _Net()  # a class of the user's: .compile() skips torch's own (pytorch#150915)
        model.compile(backend=counting)

        def step(x: torch.Tensor) -> torch.Tensor:
            return model(x)

        for _ in range(3):
            step(torch.ones(2, 4))
        [seen] = finder.roots()
        assert seen.module is model and seen.calls == 3
        assert seen.site is not None and seen.site.function == "step"
        assert len(graphs) == 1  # one graph, compiled once: the finder's wrapper stays outside it
    finally:
        finder.uninstall()
    assert torch.nn.Module.compile is before
    model(torch.ones(2, 4))  # the wrapper left in place passes the call through once the finder is gone


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_a_module_compiled_by_the_script_either_way_is_known_as_compiled() -> None:
    # the profiler's module view and the memory probe's per-module hooks stay off such a model
    from gpudoctor.runner.modules import compiled_by_script

    plain, by_method = _Net(), _Net()
    by_method.compile(backend="eager")
    assert not compiled_by_script(plain) and compiled_by_script(by_method)
    assert compiled_by_script(torch.compile(_Net(), backend="eager"))
