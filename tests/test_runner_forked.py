"""A DataLoader's workers, forked from a process gpudoctor instruments, run without its instrumentation
(`runner.forked`): before, every `nn.Module` a worker called (torchvision's transforms) ran the step
discovery's global hooks and every line of the user's Dataset its line tracer — a loop whose two workers
ran transforms made its batches 3.5–4× slower inside a fix round than run plainly (CPU, 2 cores), and a
worker's copy of the step discovery once took a transform for the step and ended the worker. The
script's own hooks stay."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.nn.modules import module as nn_module
from torch.utils.data import DataLoader, Dataset

from gpudoctor.runner.forked import is_ours, leave_forked_children, strip_instrumentation
from gpudoctor.runner.hooks import eager_only
from gpudoctor.runner.loops import LoopWatcher, UserCode
from gpudoctor.runner.modules import RootWatcher


class Seen(Dataset):  # type: ignore[type-arg]
    """Each item: what the process that made it had installed."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> tuple[int, int, bool]:
        pre = list(nn_module._global_forward_pre_hooks.values())
        return sum(map(is_ours, pre)), len(pre) - sum(map(is_ours, pre)), sys.gettrace() is not None


def users_hook(module: Any, args: Any) -> None:
    return None


def test_a_forked_worker_runs_without_gpudoctors_hooks_and_tracer_the_scripts_stay() -> None:
    roots = RootWatcher(lambda call, module: None, UserCode((__file__,))).start()
    loops = LoopWatcher(lambda key, when: None, UserCode((__file__,))).start()
    mine = nn_module.register_module_forward_pre_hook(users_hook)
    try:
        leave_forked_children()
        here = Seen()[0]
        (ours, theirs, traced), *_ = DataLoader(Seen(), batch_size=None, num_workers=1)
    finally:
        mine.remove()
        loops.stop()
        roots.stop()
    assert here[0] == 1 and here[1] == 1  # in this process: gpudoctor's hook and the script's
    assert (int(ours), int(theirs), bool(traced)) == (0, 1, False)


def test_only_gpudoctors_own_functions_count_as_its_hooks() -> None:
    watcher = RootWatcher(lambda c, m: None, UserCode())
    assert is_ours(watcher._pre) and is_ours(eager_only(watcher._post))  # a method, and as wrapped
    assert not is_ours(eager_only(users_hook))  # the script's function, whoever wrapped it
    assert not is_ours(users_hook) and not is_ours(torch.nn.Linear.forward) and not is_ours(None)


def test_strip_takes_out_gpudoctors_global_hooks_alone() -> None:
    watcher = RootWatcher(lambda c, m: None, UserCode())
    handles = [nn_module.register_module_forward_hook(eager_only(watcher._post)),
               nn_module.register_module_forward_hook(users_hook)]  # fmt: skip
    try:
        assert strip_instrumentation() == 1
        assert list(nn_module._global_forward_hooks.values()) == [users_hook]
    finally:
        for h in handles:
            h.remove()


def test_strip_takes_out_the_listeners_to_compiled_calls_and_puts_module_compile_back() -> None:
    before = torch.nn.Module.compile
    watcher = RootWatcher(lambda c, m: None, UserCode()).start()
    try:
        assert torch.nn.Module.compile is not before  # wrapped while the watcher listens
        assert strip_instrumentation() == 3  # its two global hooks and its listener
        assert torch.nn.Module.compile is before
    finally:
        watcher.stop()
    assert torch.nn.Module.compile is before
