"""runner.compile_time: the wall time torch.compile spends compiling, from its compile callbacks, counted
as each compilation ends and while one is under way; uninstalled, the callbacks are gone."""

from __future__ import annotations

import time

import torch
from torch._dynamo.callback import callback_handler

from gpudoctor.runner.compile_time import CompileTime


def test_compilation_is_timed_and_the_callbacks_leave() -> None:
    # GIVEN a compiler backend that takes 0.3 s, and the clock installed
    seen_during: list[float] = []

    def slow_backend(graph: torch.fx.GraphModule, inputs: object) -> object:
        time.sleep(0.3)
        seen_during.append(clock.seconds())  # under way: counted already
        return graph.forward

    torch._dynamo.reset()  # (which clears every compile callback: ours go in after it)
    before = (len(callback_handler.start_callbacks), len(callback_handler.end_callbacks))
    spent: list[float] = []
    clock = CompileTime(spent.append).install()
    try:
        # WHEN a function is compiled and called
        fn = torch.compile(lambda x: (x * 2).sum(), backend=slow_backend)
        fn(torch.randn(4))
        fn(torch.randn(4))  # no recompilation: nothing more
    finally:
        clock.uninstall()
        clock.uninstall()  # twice is safe
        torch._dynamo.reset()
    # THEN one compilation of at least 0.3 s was counted, also while under way
    assert clock.available and len(spent) == 1 and spent[0] >= 0.3 and clock.total_s == spent[0]
    assert seen_during and seen_during[0] >= 0.3 and clock.seconds() == clock.total_s
    assert (len(callback_handler.start_callbacks), len(callback_handler.end_callbacks)) == before
