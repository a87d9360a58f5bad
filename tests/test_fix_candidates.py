"""Which fixes `gpudoctor fix` tries: those the findings point to, ranked by the saving they promised,
plus cheap ones where the script shows the condition; what no fix can change safely is reported with its
source line and the change to make."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gpudoctor.fixes.candidates import choose
from gpudoctor.fixes.loaders import worker_values
from gpudoctor.fixes.observe import LoaderInfo, Observations, OptimizerInfo, RootInfo, SiteCount
from gpudoctor.fixes.order import alternative_next, defer_answered, defer_under_compile
from gpudoctor.rules.finding import SCHEMA, Diagnosis, Finding, Fix, Severity
from gpudoctor.runner.hooks import CallSite, StepFunction
from gpudoctor.util.errors import UsageError

SITE = CallSite("train.py", 3, "<module>")


def obs(
    *, cuda: bool = True, conv: bool = False, free: int = 8, attention: str | None = None
) -> Observations:
    root = RootInfo("Net", 10, "float32", "cuda" if cuda else "cpu", True, conv, False, attention, ("model",),
                    SITE, (((8, 3),),) * 3)  # fmt: skip
    loader = LoaderInfo(SITE, 32, 0, False, False, None, False, True)
    return Observations(root, (loader,), (OptimizerInfo(SITE, "AdamW", None, None, 4),), (), (), (),
                        "highest", False, cuda, cuda, free)  # fmt: skip


def finding(rule: str, saving: float, sources: tuple[str, ...] = ()) -> Finding:
    return Finding(
        rule, Severity.of_saving(saving), rule.replace("_", " "), saving, (), Fix("fix it", ""), {}, sources
    )


def diagnosis(*findings: Finding) -> Diagnosis:
    return Diagnosis(SCHEMA, findings, "", {})


def test_a_model_the_script_made_channels_last_is_not_offered_channels_last_but_keeps_cudnn_benchmark() -> (
    None
):
    # GIVEN a convolution net on a GPU, its weights made channels_last by the script (as a tuned DDP script
    # does before wrapping: switched back and forth, its DDP buckets' gradients no longer matched the
    # weights and a fused AdamW failed)
    from gpudoctor.fixes.applies import why_not

    made = replace(obs(conv=True), root=replace(obs(conv=True).root, channels_last=True))
    fixes = [c.fix for c in choose(diagnosis(), made)[0]]
    # THEN channels_last is neither proposed nor applies, while cuDNN's autotuner still is
    assert "channels_last" not in fixes and "cudnn_benchmark" in fixes
    assert why_not("channels_last", made, 25) == (
        "does not apply: the script already makes its convolutions' weights channels_last"
    )
    assert "channels_last" in [c.fix for c in choose(diagnosis(), obs(conv=True))[0]]


def test_the_observer_tells_channels_last_weights_from_nchw_and_from_1x1_kernels() -> None:
    from gpudoctor.fixes.observe import _channels_last

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 1))
    assert not _channels_last(net)
    assert _channels_last(net.to(memory_format=torch.channels_last))
    assert not _channels_last(torch.nn.Conv2d(8, 8, 1))  # a 1x1 kernel reads as both layouts
    assert not _channels_last(torch.nn.Linear(3, 3))


def test_fixes_follow_the_findings_highest_promised_saving_first() -> None:
    d = diagnosis(finding("input_pipeline", 30.0), finding("optimizer_unfused", 12.0))
    cands, _ = choose(d, obs())
    fixes = [c.fix for c in cands]
    # one of each group first (the middle worker count), the alternatives last
    assert fixes[:2] == ["workers:4", "pin_memory"] and fixes[-2:] == ["workers:2", "workers:8"]
    fused = next(c for c in cands if c.fix == "fused_optimizer")
    assert fused.predicted_saving_pct == 12.0 and fused.rules == ("optimizer_unfused",)
    assert {"compile", "autocast", "tf32"} <= set(fixes)  # cheap ones on a float32 model on a GPU
    assert "workers:2" in fixes and "compile:reduce-overhead" not in fixes  # not launch-bound


@pytest.mark.parametrize("rule", ["launch_overhead", "host_python"])
def test_a_host_bound_loop_with_static_shapes_tries_cuda_graphs_first(rule: str) -> None:
    cands, _ = choose(diagnosis(finding(rule, 40.0)), obs())
    fixes = [c.fix for c in cands]
    # CUDA graphs first; plain compile, their alternative, after one of every other group
    assert fixes[0] == "compile:reduce-overhead" and fixes[-1] == "compile" and "autocast" in fixes[1:-1]
    varying = replace(obs(), root=replace(obs().root, input_shapes=(((8, 3),), ((9, 3),), ((8, 3),))))
    assert "compile:reduce-overhead" not in [
        c.fix for c in choose(diagnosis(finding(rule, 40.0)), varying)[0]
    ]


def test_a_step_of_several_modules_tries_plain_compile_before_cuda_graphs() -> None:
    # GIVEN a host-bound step that calls a text encoder and a UNet, as the diffusion fine-tune does
    o = obs()
    roots = (replace(o.root, cls="CLIPTextModel", training=False), replace(o.root, cls="UNet"))
    cands, _ = choose(diagnosis(finding("launch_overhead", 40.0)), replace(o, roots=roots))
    fixes = [c.fix for c in cands]
    # THEN plain compile is the group's first (CUDA graphs of several modules overwrite each other's
    # outputs), and CUDA graphs its alternative, after one of every other group
    assert fixes[0] == "compile" and fixes[-1] == "compile:reduce-overhead" and "autocast" in fixes[1:-1]
    assert next(c for c in cands if c.fix == "compile").why == "the 2 modules the step calls can be compiled"


def test_modules_called_from_a_plain_function_have_it_compiled_first_then_each_module() -> None:
    # GIVEN an actor and a critic the rollout calls from `def act(obs)`, a host-bound step
    o = obs()
    roots = (replace(o.root, cls="Actor"), replace(o.root, cls="Critic"))
    act = StepFunction("rl.py", "act", 12)
    cands, _ = choose(
        diagnosis(finding("launch_overhead", 40.0)), replace(o, roots=roots, step_functions=(act,))
    )
    fixes = [c.fix for c in cands]
    # THEN the function is the compile group's first; the modules' compile and CUDA graphs its alternatives
    assert fixes[0] == "compile_fn" and fixes[-2:] == ["compile", "compile:reduce-overhead"]
    assert "act()" in cands[0].why
    # AND a failure of it brings the modules' own compile next
    queue = list(enumerate(cands, 1))[1:]
    assert next(c.fix for _, c in alternative_next(queue, "compile_fn")) == "compile"


def test_a_failed_candidate_gives_its_place_to_the_next_of_its_group() -> None:
    cands, _ = choose(diagnosis(finding("launch_overhead", 40.0)), obs())
    queue = list(enumerate(cands, 1))[1:]  # CUDA graphs, tried first, failed
    moved = [c.fix for _, c in alternative_next(queue, "compile:reduce-overhead")]
    assert moved[0] == "compile" and sorted(moved) == sorted(c.fix for _, c in queue)
    assert alternative_next(queue, "sdpa") == queue  # none of its group left


def test_bfloat16_for_tf32_convolutions_is_not_taken_as_answered_by_cuda_graphs() -> None:
    # GIVEN ResNet-50 in float32 on an H100 as gpudoctor fix saw it (convnet_nchw, 5 minutes): launch-bound,
    # unfused elementwise ops, and its convolutions in TF32 on the tensor cores
    d = diagnosis(
        finding("conv_layout", 30.5), finding("launch_overhead", 20.8), finding("unfused_elementwise", 20.8),
        finding("tf32_not_bf16", 12.0),
    )  # fmt: skip
    cands, _ = choose(d, obs(conv=True))
    autocast = next(c for c in cands if c.fix == "autocast")
    # THEN autocast answers the TF32 finding too: once CUDA graphs are kept, having answered the launches
    # and the elementwise ops, it does not wait behind the fixes that answer nothing (tf32, fused)
    assert "tf32_not_bf16" in autocast.rules
    queue = defer_answered(list(enumerate(cands)), {"launch_overhead", "unfused_elementwise", "host_python"})
    order = [c.fix for _, c in queue]
    assert order.index("autocast") < order.index("tf32") and order.index("autocast") < order.index(
        "fused_optimizer"
    )


def test_channels_last_waits_behind_the_rest_once_compile_is_kept() -> None:
    # GIVEN a float32 convolution net whose candidates (in their order) include channels_last ahead of
    # the fused optimizer, as timm's ConvNeXt had on the H200 (the optimizer ran out of budget there)
    cands, _ = choose(None, obs(conv=True))
    queue = list(enumerate(cands, 1))
    order = [c.fix for _, c in queue]
    assert order.index("channels_last") < order.index("fused_optimizer")
    # THEN with autocast kept nothing moves; with compile kept, channels_last goes last (Inductor lays
    # out the graph's convolutions itself), but for the first candidates, which stay ahead
    assert defer_under_compile(queue, ("autocast",)) == queue
    moved = [c.fix for _, c in defer_under_compile(queue, ("autocast", "compile"))]
    assert moved[-1] == "channels_last" and sorted(moved) == sorted(order)
    first = order.index("channels_last") + 1
    assert defer_under_compile(queue, ("compile:reduce-overhead",), first) == queue


def test_convolutions_and_hugging_face_attention() -> None:
    fixes = [c.fix for c in choose(None, obs(conv=True, attention="eager"))[0]]
    assert {"channels_last", "cudnn_benchmark", "sdpa"} <= set(fixes)


def test_on_the_cpu_without_findings_only_what_the_script_shows() -> None:
    fixes = [c.fix for c in choose(None, obs(cuda=False, free=1))[0]]
    assert fixes == ["fused_optimizer", "workers:1"]


@pytest.mark.parametrize(
    ("free", "have", "values"), [(15, 0, [4, 8, 15]), (3, 0, [2, 3]), (8, 4, [8]), (0, 0, [])]
)
def test_worker_counts_go_up_to_the_free_cores(free: int, have: int, values: list[int]) -> None:
    assert worker_values(free, have) == values


def test_only_and_skip() -> None:
    assert [c.fix for c in choose(None, obs(), only=("tf32", "workers:3"))[0]] == ["tf32", "workers:3"]
    assert all(not c.fix.startswith("workers") for c in choose(None, obs(), skip=("workers",))[0])
    with pytest.raises(UsageError):
        choose(None, obs(), only=("warp_speed",))


def test_a_larger_batch_only_when_allowed() -> None:
    d = diagnosis(finding("small_batch", 25.0))
    cands, manual = choose(d, obs())
    assert "batch:x2" not in [c.fix for c in cands] and manual[0].rule == "small_batch"
    cands, manual = choose(d, obs(), allow_batch=True)
    assert next(c for c in cands if c.fix == "batch:x2").predicted_saving_pct == 25.0 and not manual


def test_a_sync_in_the_loop_is_left_to_the_user_with_its_source_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nfor step in range(10):\n    print(loss.item())\n")
    d = diagnosis(finding("host_sync", 20.0, (f"{script}(3): <module>",)), finding("data_parallel", 40.0))
    _, manual = choose(d, obs())
    sync = next(m for m in manual if m.rule == "host_sync")
    assert sync.where == f"{script}:3" and sync.source_line == "print(loss.item())"
    assert "every N steps" in sync.change
    assert any(m.rule == "data_parallel" and "DistributedDataParallel" in m.change for m in manual)


def test_item_calls_seen_at_runtime_are_reported_even_without_a_stack_trace(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("x = 1\nacc = loss.item()\n")
    seen = replace(obs(), item_syncs=(SiteCount(CallSite(str(script), 2, "<module>"), 20),
                                      SiteCount(CallSite(str(script), 1, "<module>"), 1)))  # fmt: skip
    _, manual = choose(diagnosis(finding("host_sync", 20.0)), seen, steps=25)
    (m,) = manual  # the line seen once in 25 steps (logging every N steps) is not a per-step sync
    assert m.source_line == "acc = loss.item()" and m.title == ".item() on a GPU tensor: 20 calls in 25 steps"


def test_an_item_inside_a_library_call_names_the_users_line_that_made_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("trainer.fit(model, loader)\n")
    seen = replace(obs(), item_syncs=(SiteCount(CallSite(str(script), 1, "<module>"), 30),))
    (m,) = choose(None, seen, steps=25)[1]
    assert m.source_line == "trainer.fit(model, loader)" and "a call made from this line" in m.change


def test_left_to_the_user_once_per_place_and_not_how_the_run_was_observed() -> None:
    d = diagnosis(
        finding("memory_held", 5.0), finding("memory_held", 3.0), finding("profiler_distortion", 0.0)
    )
    _, manual = choose(d, obs())
    assert [m.rule for m in manual] == ["memory_held"]


# -- a loader that waits rather than computes ---------------------------------------------------------------
def waiting(fetch_wall_s: float, fetch_cpu_s: float, batches: int = 10) -> Observations:
    o = obs(cuda=False, free=1)  # the 2-core CI machine: one core free beside the loop
    loader = replace(o.loaders[0], fetches=batches, fetch_wall_s=fetch_wall_s, fetch_cpu_s=fetch_cpu_s)
    return replace(o, loaders=(loader,))


def test_a_loader_that_waits_gets_worker_counts_past_the_cores() -> None:
    # GIVEN a loader whose batches take 8.5 ms of wall time and 0.3 ms of CPU time (2 ms of sleep per
    # item, 4 items a batch) in a loop of 9.5 ms a step, on a machine with one core free
    cands, _ = choose(None, waiting(0.085, 0.003), steps=25, step_s=0.0095)
    workers = [c for c in cands if c.fix.startswith("workers")]
    # THEN it is offered workers past the core: enough to hide 8.5 ms behind 1 ms (10), the middle first
    assert [c.fix for c in workers] == ["workers:8", "workers:4", "workers:10"]
    assert workers[0].why.startswith("the DataLoader waits (its batches take little CPU time)")


def test_a_loader_that_computes_gets_workers_up_to_the_free_cores() -> None:
    cands, _ = choose(None, waiting(0.085, 0.080), steps=25, step_s=0.0095)
    assert [c.fix for c in cands if c.fix.startswith("workers")] == ["workers:1"]
    assert worker_values(1, 0, needed=100) == [8, 16, 32]  # never past 32


def test_a_gpu_bound_loop_whose_batches_are_made_on_the_training_thread_is_still_offered_workers() -> None:
    # GIVEN ConvNeXt-tiny in float32 on an H100 as gpudoctor fix saw it at 9c738e6: the GPU busy 99% of
    # its 105 ms step, so no loader finding, but each batch made on the training thread in 63 ms
    d = diagnosis(finding("tensor_cores_unused", 33.1), finding("tf32_not_bf16", 33.1),
                  finding("pageable_copy", 3.6))  # fmt: skip
    o = obs(conv=True, free=15)
    made = replace(o, loaders=(replace(o.loaders[0], fetches=30, fetch_wall_s=1.88, fetch_cpu_s=4.13),))
    cands, _ = choose(d, made, steps=30, step_s=0.105)
    fixes = [c.fix for c in cands]
    # THEN worker counts are among its candidates (after the fixes the findings promise savings for:
    # they pay once bfloat16 has cut the GPU's work), saying why
    workers = [c for c in cands if c.fix.startswith("workers:")]
    assert [c.fix for c in workers] == ["workers:8", "workers:4", "workers:15"]
    assert fixes.index("workers:8") > fixes.index("autocast")
    assert workers[0].why == "the training thread spends 60% of the step on the DataLoader's batches"
    # AND a loader that takes 2 ms of a 105 ms step is left alone
    light = replace(o, loaders=(replace(o.loaders[0], fetches=30, fetch_wall_s=0.06, fetch_cpu_s=0.06),))
    assert not any(c.fix.startswith("workers:") for c in choose(d, light, steps=30, step_s=0.105)[0])


def test_a_validation_loader_is_not_the_training_threads_loader() -> None:
    # GIVEN a Lightning fit on the CPU as gpudoctor fix saw it: its training loader handed out 167 batches
    # in 167 steps of 17.7 ms, 0.7 ms each; its validation loader 2 (the sanity check), 7.6 ms each
    o = obs(cuda=False, free=1)
    train = replace(o.loaders[0], fetches=167, fetch_wall_s=0.118, fetch_cpu_s=0.118, taken=167)
    check = replace(o.loaders[0], site=CallSite("train.py", 9, "<module>"), fetches=2, fetch_wall_s=0.0153,
                    fetch_cpu_s=0.0153, taken=2)  # fmt: skip
    both = replace(o, loaders=(train, check))
    # THEN no loader paces the loop (0.7 of 17.7 ms, not the validation batches' 7.6), and no worker count
    # is offered for it
    cands, _ = choose(diagnosis(finding("optimizer_unfused", 5.0)), both, steps=167, step_s=0.0177)
    assert not any(c.fix.startswith("workers:") for c in cands)
    # AND a loop that takes four batches a step (gradient accumulation) spends four batches' time on them
    accumulating = replace(o, loaders=(replace(train, fetch_wall_s=0.5, fetch_cpu_s=0.5, taken=668), check))
    workers = [c for c in choose(diagnosis(finding("optimizer_unfused", 5.0)), accumulating, steps=167,
                                 step_s=0.0177)[0] if c.fix.startswith("workers:")]  # fmt: skip
    assert (
        workers and workers[0].why == "the training thread spends 68% of the step on the DataLoader's batches"
    )


def test_a_loader_made_anew_each_epoch_feeds_the_steps_from_its_one_call_site() -> None:
    from gpudoctor.fixes.loaders import training_loaders

    o = obs()
    epochs = [replace(o.loaders[0], taken=10) for _ in range(5)]  # 5 epochs of 10 batches, one line
    other = replace(o.loaders[0], site=CallSite("train.py", 9, "<module>"), taken=3)
    fed = training_loaders([*epochs, other], steps=50)
    assert len(fed) == 5 and all(n == 1.0 for _, n in fed)
    # two made on one line (`tl = DataLoader(tr, 64); vl = DataLoader(va, 256)`): their batch sizes differ
    train, validation = replace(o.loaders[0], taken=50), replace(o.loaders[0], batch_size=256, taken=2)
    assert [lo for lo, _ in training_loaders([train, validation], 50)] == [train]


def test_a_model_already_under_autocast_is_not_offered_bfloat16_or_tf32() -> None:
    # GIVEN BERT under the Trainer's bf16=True: float32 parameters, its layers run under bfloat16 autocast
    o = obs()
    under = replace(o, root=replace(o.root, autocast="bfloat16"))
    fixes = [c.fix for c in choose(diagnosis(finding("tensor_cores_unused", 9.3)), under)[0]]
    # THEN neither is tried (bfloat16 autocast on top of it measured -1.2%, TF32 +3.1%, both noise)
    assert "autocast" not in fixes and "tf32" not in fixes and "compile" in fixes
    assert under.reduced_precision == "bfloat16" and o.reduced_precision is None


def test_what_does_not_apply_is_said_and_why() -> None:
    from gpudoctor.fixes.applies import why_not

    o = obs()
    assert why_not("no_empty_cache", o, 25) == (
        "does not apply: torch.cuda.empty_cache() is not called in the loop (0 calls in 25 steps)"
    )
    once = replace(o, empty_cache=(SiteCount(SITE, 1),))
    assert why_not("no_empty_cache", once, 25) is not None
    assert why_not("no_empty_cache", replace(o, empty_cache=(SiteCount(SITE, 24),)), 25) is None
    assert (
        why_not("zero_grad_none", o, 25)
        == "does not apply: zero_grad(set_to_none=False) is not called in the loop"
    )
    assert why_not("tf32", replace(o, float32_matmul_precision="high"), 25) == (
        "does not apply: float32 matmul precision is already 'high'"
    )
    assert why_not("channels_last", o, 25) == "does not apply: Net has no 2-D convolution"
    assert why_not("workers:4", replace(o, loaders=(replace(o.loaders[0], num_workers=8),)), 25) == (
        "does not apply: the DataLoader already has 8 workers"
    )
    assert (
        why_not("pin_memory", obs(cuda=False), 25)
        == "does not apply: no CUDA device: nothing is copied to a GPU"
    )
    assert why_not("cudnn_benchmark", obs(cuda=False, conv=True), 25) == (
        "does not apply: no CUDA device: cuDNN is not used"
    )
    assert why_not("cudnn_benchmark", obs(conv=True), 25) is None
    compiled = replace(o, root=replace(o.root, compiled=True, autocast="bfloat16"))
    assert (
        why_not("compile", compiled, 25)
        == "does not apply: the script compiles the model itself (torch.compile)"
    )
    assert why_not("autocast", compiled, 25) == "does not apply: Net already runs under bfloat16 autocast"
    assert all(
        why_not(f, o, 25) is None
        for f in ("tf32", "autocast", "compile", "fused_optimizer", "workers:4", "noop")
    )


def test_a_sync_found_in_a_profilers_frame_names_its_function() -> None:
    # GIVEN syncs the trace found under two functions of a script, named as the profiler names frames: the
    # file alone and the line each function starts on (no line of the file to read there)
    sources = ("rl.py(80): forward", "rl.py(102): act")
    _, manual = choose(diagnosis(finding("host_sync", 12.0, sources)), obs())
    # THEN each place says which function it means
    assert [m.where for m in manual if m.rule == "host_sync"] == [
        "rl.py:80 in forward()",
        "rl.py:102 in act()",
    ]


def test_the_numerics_yardstick_round_is_not_a_fix_to_ask_for() -> None:
    from gpudoctor.fixes.catalog import asked

    assert asked("compile_fn") == "compile_fn" and asked("no_validation") == "no_validation"
    with pytest.raises(UsageError, match="unknown fix 'reseed'") as err:
        asked("reseed")
    assert "reseed" not in str(err.value).split("known:")[1]
