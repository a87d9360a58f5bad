"""Each fix of `gpudoctor fix` is a reversible patch: applied on the CPU to real modules, optimizers and
DataLoaders it changes what it says, records the call site of the change, and undone it leaves the process
exactly as it found it (an autouse fixture compares every global it could touch)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.nn.modules import module as nn_module
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from gpudoctor.fixes.catalog import build_patch, can_switch
from gpudoctor.fixes.patches.base import FixPatch, PatchContext
from gpudoctor.runner.hooks import Restorer, RootFinder, patched

OPTIMIZERS = [getattr(torch.optim, n) for n in ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad")]


def _globals() -> dict[str, Any]:
    import torch._inductor.config as inductor

    return {
        "tensor": {k: vars(torch.Tensor).get(k) for k in ("backward", "to", "cuda", "item")},
        "loader": {k: vars(DataLoader).get(k) for k in ("__init__", "__iter__")},
        "optim": {c.__name__: vars(c).get("__init__") for c in OPTIMIZERS},
        "optimizer_base": (vars(torch.optim.Optimizer)["__init__"], vars(torch.optim.Optimizer)["zero_grad"]),
        "module_zero_grad": vars(torch.nn.Module)["zero_grad"],
        "empty_cache": (vars(torch.cuda)["empty_cache"], vars(torch.cuda.memory)["empty_cache"]),
        "module_hooks": (dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks)),
        "optimizer_hooks": (dict(_global_optimizer_pre_hooks), dict(_global_optimizer_post_hooks)),
        "precision": torch.get_float32_matmul_precision(),
        "cudnn": (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32),
        "fallback_random": inductor.fallback_random,
    }


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    before = _globals()
    yield
    assert _globals() == before


def ctx(script: str | None = None) -> PatchContext:
    return PatchContext(RootFinder(), script)


def run_patched(fix: str, body: Any, context: PatchContext | None = None, **kwargs: Any) -> FixPatch:
    """Apply `fix` (and the root finder), run `body()`, undo; the patch, for its outcome."""
    return run_with_patch(fix, lambda _patch: body(), context, **kwargs)


def run_with_patch(fix: str, body: Any, context: PatchContext | None = None, **kwargs: Any) -> FixPatch:
    """As `run_patched`, `body` given the patch (to switch it)."""
    c = context or ctx(__file__)
    patch = build_patch(fix, c, **kwargs)
    c.finder.install()
    try:
        with patched([patch]):
            body(patch)
    finally:
        c.finder.uninstall()
    return patch


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 2)
        self.seen_layouts: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen_layouts.append(x.is_contiguous(memory_format=torch.channels_last))
        return self.fc(self.conv(x).flatten(1))


def test_tf32_sets_the_matmul_precision_and_puts_it_back() -> None:
    seen = []
    patch = run_patched("tf32", lambda: seen.append(torch.get_float32_matmul_precision()))
    assert seen == ["high"]
    outcome = patch.outcome()
    assert outcome.applied and outcome.edits[0].op == "insert_after_imports"


def test_tf32_is_not_applicable_where_the_precision_is_already_lowered() -> None:
    torch.set_float32_matmul_precision("high")
    try:
        patch = run_patched("tf32", lambda: None)
    finally:
        torch.set_float32_matmul_precision("highest")
    assert not patch.outcome().applied and "already" in (patch.outcome().reason or "")


def test_cudnn_benchmark_flag_on_then_off() -> None:
    seen = []
    run_patched("cudnn_benchmark", lambda: seen.append(torch.backends.cudnn.benchmark))
    assert seen == [True]


def test_autocast_runs_the_root_forward_in_bfloat16_from_its_first_call_and_returns_float32() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    inner, outer = [], []
    model[2].register_forward_hook(lambda m, a, out: inner.append(out.dtype))

    def body() -> None:
        for _ in range(3):
            outer.append(model(torch.randn(4, 8)).dtype)

    patch = run_patched("autocast", body)
    # the first call finds the root (its forward was already looked up: it runs under autocast entered
    # around it), the later ones run the wrapped forward; what leaves the model is float32 each time
    assert inner == [torch.bfloat16] * 3 and outer == [torch.float32] * 3
    assert "forward" not in vars(model) and model(torch.randn(4, 8)).dtype == torch.float32
    edit = patch.outcome().edits[0]
    assert edit.op == "wrap_statement" and edit.wrap == 'torch.autocast("cpu", dtype=torch.bfloat16)'
    assert edit.code == ("{target} = {target}.float()",)  # the output is a tensor: its statement casts it


def test_autocast_over_a_gans_two_modules_leaves_their_loss_outside_in_float32() -> None:
    # GIVEN a GAN's step as DCGAN writes it: BCELoss on the discriminator's output beside float32 labels,
    # outside any autocast (a bfloat16 output there fails: "Found dtype Float but expected BFloat16")
    torch.manual_seed(0)
    netG = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh())
    netD = torch.nn.Sequential(torch.nn.Linear(8, 1), torch.nn.Sigmoid(), torch.nn.Flatten(0))
    criterion = torch.nn.BCELoss()
    optD, optG = torch.optim.Adam(netD.parameters()), torch.optim.Adam(netG.parameters())
    losses = []

    def body() -> None:
        for _ in range(3):
            ones, zeros = torch.ones(6), torch.zeros(6)
            netD.zero_grad()
            output = netD(torch.randn(6, 8))
            err_real = criterion(output, ones)
            err_real.backward()
            fake = netG(torch.randn(6, 4))
            output = netD(fake.detach())
            err_fake = criterion(output, zeros)
            err_fake.backward()
            optD.step()
            netG.zero_grad()
            err_g = criterion(netD(fake), ones)
            err_g.backward()
            optG.step()
            losses.append((err_real.dtype, err_g.dtype))

    # WHEN both modules run under the autocast patch (the finder watching every step, as in a round)
    patch = run_patched("autocast", body, PatchContext(RootFinder(until=lambda: False), __file__))
    # THEN every step runs, its losses in float32, and each module's call site casts what it returns
    assert losses == [(torch.float32, torch.float32)] * 3
    edits = patch.outcome().edits
    assert all(e.code == ("{target} = {target}.float()",) for e in edits)
    # AND the discriminator's change is written at each line the step called it from, the two after its
    # first as calls of netD itself (where a line is a loss around it, the diff leaves it: `diff`)
    assert sorted((e.line - edits[0].line, e.call) for e in edits) == [
        (0, ""),
        (3, ""),
        (4, "netD"),
        (9, "netD"),
    ]


def test_the_outputs_a_forward_returns_in_containers_leave_in_float32() -> None:
    from gpudoctor.fixes.patches.autocast import outputs_to_float32

    bf = torch.ones(2, dtype=torch.bfloat16)
    out = outputs_to_float32(
        {"logits": bf, "ids": torch.ones(2, dtype=torch.long), "parts": (bf, [bf]), "n": 3}
    )
    assert out["logits"].dtype == torch.float32 and out["ids"].dtype == torch.long and out["n"] == 3
    assert [t.dtype for t in (out["parts"][0], out["parts"][1][0])] == [torch.float32, torch.float32]


def test_float16_autocast_scales_the_loss_and_unscales_before_the_step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    grads, updates = [], []

    def body() -> None:
        for _ in range(3):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
            opt.zero_grad()
            loss.backward()
            grads.append(model.bias.grad.abs().item())
            before = model.bias.detach().clone()
            opt.step()
            updates.append((before - model.bias.detach()).abs().item())

    patch = run_patched("autocast:float16", body)
    assert patch.outcome().applied and "loss scaling" in patch.outcome().changes[0]
    # the gradient the script sees is scaled (2**16); the step applies the unscaled one
    assert grads[1] > 1000 * updates[1] / 0.1
    assert updates[1] == pytest.approx(0.1 * grads[1] / 2**16, rel=1e-2)


def test_compile_replaces_the_root_forward_and_undo_deletes_it() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(2, 8)
    expected = model(x)
    forwards, outputs = [], []

    def body() -> None:
        for _ in range(3):
            outputs.append(model(x))
            forwards.append(vars(model).get("forward"))

    patch = run_patched("compile", body, compile_backend="eager")
    assert forwards[0] is not None and forwards[0] is forwards[-1]
    assert all(torch.allclose(o, expected) for o in outputs)
    assert "forward" not in vars(model)
    edit = patch.outcome().edits[0]
    # torch's own Sequential: `model.compile()` would compile nothing (tests/test_fix_compile_form.py)
    assert (edit.op, edit.name) == ("after_assignment", "model")
    assert edit.code[0].startswith("{name}.forward = torch.compile({name}.forward)")


def test_compile_exact_random_draws_random_numbers_as_eager() -> None:
    import torch._inductor.config as inductor

    seen = []
    run_patched(
        "compile",
        lambda: seen.append(inductor.fallback_random),
        compile_backend="inductor",
        exact_random=True,
    )
    assert seen == [True]


def test_channels_last_converts_the_model_and_its_inputs_and_back() -> None:
    model = Net()
    x = torch.randn(2, 3, 8, 8)

    def body() -> None:
        model(x)
        model(x)

    patch = run_patched("channels_last", body)
    assert model.seen_layouts == [True, True]
    assert model.conv.weight.is_contiguous()  # back to the layout it had
    edits = patch.outcome().edits
    assert [e.op for e in edits] == ["after_assignment", "before_statement"]
    assert edits[1].code == ("x = x.to(memory_format=torch.channels_last)",)


def test_channels_last_reaches_a_generator_of_transposed_convolutions() -> None:
    """A DCGAN's generator has ConvTranspose2d alone (no Conv2d): its weights turn channels_last too, and
    the transposed convolutions run on NHWC inputs."""
    from gpudoctor.fixes.evidence import work_probe

    generator = torch.nn.Sequential(
        torch.nn.ConvTranspose2d(16, 8, 4, 1, 0, bias=False),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.ConvTranspose2d(8, 3, 4, 2, 1, bias=False),
    )
    noise = torch.randn(2, 16, 1, 1)
    during = []

    def body() -> None:
        with work_probe() as probe:
            generator(noise)
        during.append(probe.tally())
        during.append(generator[3].weight.is_contiguous(memory_format=torch.channels_last))

    patch = run_patched("channels_last", body)
    work, weights_nhwc = during
    assert patch.outcome().applied and weights_nhwc
    assert work.conv_flops > 0 and work.conv_nhwc_flops == work.conv_flops
    assert generator[3].weight.is_contiguous()  # put back
    # the generator converted where it is made; its (N, C, 1, 1) noise is channels_last as it is
    assert [e.op for e in patch.outcome().edits] == ["after_assignment"]


def test_channels_last_leaves_a_model_without_convolutions_alone() -> None:
    model = torch.nn.Linear(4, 4)
    patch = run_patched("channels_last", lambda: model(torch.randn(1, 4)))
    assert not patch.outcome().applied and "no 2-D convolution" in (patch.outcome().reason or "")


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD])
def test_fused_optimizer_rewrites_the_constructor_arguments(cls: type) -> None:
    model = torch.nn.Linear(4, 4)
    made = []
    patch = run_patched(
        "fused_optimizer", lambda: made.append(cls(model.parameters(), lr=0.01, foreach=False))
    )
    group = made[0].param_groups[0]
    assert group["fused"] is True and not group["foreach"]
    assert len(made[0].param_groups[0]["params"]) == 2  # the generator was not spent by a first attempt
    (edit,) = patch.outcome().edits
    assert (edit.op, edit.call, edit.kwargs, edit.drop) == (
        "set_kwargs",
        cls.__name__,
        {"fused": "True"},
        ("foreach",),
    )
    assert edit.file == __file__
    assert cls(model.parameters(), lr=0.01).param_groups[0]["fused"] is None  # undone


def test_fused_optimizer_falls_back_to_foreach_where_parameters_cannot_be_fused() -> None:
    p = torch.zeros(3, dtype=torch.complex64, requires_grad=True)  # no fused kernels for complex
    made = []
    patch = run_patched("fused_optimizer", lambda: made.append(torch.optim.SGD([p], lr=0.1)))
    assert made[0].param_groups[0]["foreach"] is True and patch.outcome().edits[0].kwargs == {
        "foreach": "True"
    }


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_the_fused_flag_switches_between_steps_and_the_step_counts_follow(cls: type) -> None:
    # GIVEN a loop whose optimizer the fix built fused, switched off and on between its steps (its A/B
    # in blocks of one process)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    seen: list[tuple[object, object, bool]] = []
    losses: list[float] = []
    made: list[torch.optim.Optimizer] = []

    def body(patch: FixPatch) -> None:
        opt = cls(model.parameters(), lr=0.01)
        made.append(opt)
        for on in (True, False, False, True, False, True):
            patch.switch(on)
            group = opt.param_groups[0]
            seen.append((group["fused"], group["foreach"], opt._step_supports_amp_scaling))
            loss = model(torch.ones(2, 4)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())

    patch = run_with_patch("fused_optimizer", body)
    # THEN each step ran as its side asked — the script's flags (as it wrote them: defaults) or fused —
    # every step counted once whichever ran it, and the loss went down through the switches
    assert seen == [(True, None, True), (None, None, False), (None, None, False), (True, None, True),
                    (None, None, False), (True, None, True)]  # fmt: skip
    state = made[0].state[model.weight]
    assert float(state["step"]) == 6 and losses[-1] < losses[0]
    assert patch.outcome().applied


def test_the_fused_flag_switched_off_moves_device_step_counts_to_the_cpu() -> None:
    from gpudoctor.fixes.patches.optimizer import _set_flags

    class Count:  # a step count on a device (no GPU here): where it is, and where `.to` sends it
        def __init__(self, device: str) -> None:
            self.device = torch.device(device)

        def to(self, device: object) -> Count:
            return Count(str(device))

    # GIVEN a fused optimizer's step counts on the parameters' device
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([p], lr=0.1, foreach=False)
    opt.state[p]["step"] = Count("cuda:0")
    # THEN the script's foreach side moves them to the CPU, where a foreach step reads them
    _set_flags(opt, {"fused": None, "foreach": None})
    assert opt.state[p]["step"].device.type == "cpu" and opt.param_groups[0]["fused"] is None
    # AND the fused side moves them back to where the parameter is (here: the CPU, so they stay)
    opt.state[p]["step"] = Count("cuda:0")
    _set_flags(opt, {"fused": True, "foreach": None})
    assert opt.state[p]["step"].device.type == p.device.type and opt._step_supports_amp_scaling


def test_zero_grad_set_to_none() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(1, 2)).sum().backward()
    patch = run_patched("zero_grad_none", lambda: opt.zero_grad(set_to_none=False))
    assert model.weight.grad is None
    assert patch.outcome().edits[0].kwargs == {"set_to_none": "True"}


def _dataset() -> TensorDataset:
    return TensorDataset(torch.arange(32.0).reshape(16, 2))


def test_workers_rewrite_every_dataloader_and_not_the_class_after() -> None:
    loaders = []
    patch = run_patched("workers:2", lambda: loaders.append(DataLoader(_dataset(), batch_size=4)))
    lo = loaders[0]
    assert (lo.num_workers, lo.persistent_workers, lo.prefetch_factor) == (2, True, 4)
    assert patch.outcome().edits[0].kwargs == {
        "num_workers": "2",
        "persistent_workers": "True",
        "prefetch_factor": "4",
    }
    assert DataLoader(_dataset()).num_workers == 0


def test_workers_refuse_an_iterable_dataset() -> None:
    class Stream(IterableDataset):
        def __iter__(self) -> Iterator[int]:
            return iter(range(4))

    loaders = []
    patch = run_patched("workers:2", lambda: loaders.append(DataLoader(Stream())))
    assert loaders[0].num_workers == 0
    assert not patch.outcome().applied and "IterableDataset" in (patch.outcome().reason or "")


def test_pin_memory_pins_batches_and_leaves_tensor_to_as_it_was() -> None:
    loaders = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no accelerator here: torch says it cannot pin
        patch = run_patched("pin_memory", lambda: loaders.append(DataLoader(_dataset(), batch_size=4)))
    assert loaders[0].pin_memory is True and patch.outcome().edits[0].kwargs == {"pin_memory": "True"}
    assert "to" not in vars(torch.Tensor)


def test_pinned_batches_on_top_of_workers_rewrite_the_same_loader() -> None:
    # GIVEN the workers fix applied, then pinned batches on top of it (a fix on top of a kept one): the
    # second wraps the first's DataLoader.__init__
    c = ctx(__file__)
    workers, pin = build_patch("workers:2", c), build_patch("pin_memory", c)
    loaders = []
    c.finder.install()
    try:
        with warnings.catch_warnings(), patched([workers, pin]):
            warnings.simplefilter("ignore")  # no accelerator here: torch says it cannot pin
            loaders.append(DataLoader(_dataset(), batch_size=4))
    finally:
        c.finder.uninstall()
    # THEN the loader gets both (at 120ee2a: "__init__() got multiple values for argument 'loader'")
    lo = loaders[0]
    assert (lo.num_workers, lo.persistent_workers, lo.pin_memory) == (2, True, True)
    assert workers.outcome().applied and pin.outcome().applied


def test_pinned_batches_switch_in_a_running_process_and_settle_the_batches_made_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN DataLoader's pinning (here a stand-in that marks what it pinned: no accelerator to pin on),
    # and pinned batches on top of two workers, switched off and on as an A/B in blocks does
    from torch.utils.data._utils import pin_memory as pinning

    pinned: list[object] = []
    monkeypatch.setattr(
        pinning, "pin_memory", lambda data, device=None: pinned.append(data) or ("pinned", data)
    )
    c = ctx(__file__)
    workers, pin = build_patch("workers:2", c), build_patch("pin_memory", c)
    assert type(pin).switchable and can_switch(("pin_memory",))
    c.finder.install()
    try:
        with warnings.catch_warnings(), patched([workers, pin]):
            warnings.simplefilter("ignore")
            DataLoader(_dataset(), batch_size=4)
            # THEN on, the loader's pinning pins; off, each batch goes on as it came (the script's
            # blocking copies); on again, pinned again
            assert pinning.pin_memory("a") == ("pinned", "a")
            pin.switch(False)
            assert pinning.pin_memory("b") == "b"
            pin.switch(True)
            assert pinning.pin_memory("c") == ("pinned", "c") and pinned == ["a", "c"]
            # AND the batches in flight when it switches (2 workers × prefetch_factor 4, and one) settle
            assert pin.lag() == 2 * 4 + 1
    finally:
        c.finder.uninstall()
    # AND undone, DataLoader's own pinning is back
    assert pinning.pin_memory("d") == ("pinned", "d")


def test_larger_batch_doubles_the_batch_size() -> None:
    loaders = []
    run_patched("batch:x2", lambda: loaders.append(DataLoader(_dataset(), batch_size=4)))
    assert loaders[0].batch_size == 8


def test_no_empty_cache_skips_the_call_and_records_the_line() -> None:
    patch = run_patched("no_empty_cache", lambda: torch.cuda.empty_cache())
    (edit,) = patch.outcome().edits
    assert (edit.op, edit.call, edit.file) == ("delete_statement", "empty_cache", __file__)


class FakeHFModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.config = type("Config", (), {"_attn_implementation": "eager"})()

    def set_attn_implementation(self, name: str) -> None:
        self.config._attn_implementation = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_sdpa_switches_a_hugging_face_model_and_back() -> None:
    model = FakeHFModel()
    seen = []

    def body() -> None:
        model(torch.randn(1, 2))
        seen.append(model.config._attn_implementation)

    patch = run_patched("sdpa", body)
    assert seen == ["sdpa"] and model.config._attn_implementation == "eager"
    assert patch.outcome().applied


def test_sdpa_is_not_applicable_to_other_models() -> None:
    model = torch.nn.Linear(2, 2)
    patch = run_patched("sdpa", lambda: model(torch.randn(1, 2)))
    assert not patch.outcome().applied and "not a Hugging Face model" in (patch.outcome().reason or "")


def test_a_patch_that_fails_half_way_leaves_nothing() -> None:
    class Broken(FixPatch):
        def _apply(self) -> None:
            self.restorer.replace(torch.Tensor, "item", lambda t: 0)
            raise RuntimeError("half-way")

    with pytest.raises(RuntimeError, match="half-way"), patched([Broken(ctx())]):
        pass


def test_patches_are_undone_in_reverse_order_also_when_the_script_raises() -> None:
    order: list[str] = []

    class Step:
        def __init__(self, name: str) -> None:
            self.name = name

        def apply(self) -> None:
            order.append(f"+{self.name}")

        def undo(self) -> None:
            order.append(f"-{self.name}")

    with pytest.raises(ValueError), patched([Step("a"), Step("b")]):
        raise ValueError("the script failed")
    assert order == ["+a", "+b", "-b", "-a"]


def test_restorer_puts_back_a_class_attribute_and_deletes_an_instance_one() -> None:
    model = torch.nn.Linear(2, 2)
    r = Restorer()
    r.replace(model, "forward", lambda x: x)
    r.replace(torch.Tensor, "backward", lambda *a: None)
    r.restore()
    assert "forward" not in vars(model) and vars(torch.Tensor)["backward"] is not None


def test_the_root_is_the_outermost_module_with_parameters_and_the_hooks_leave() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    loss_fn = torch.nn.MSELoss()
    finder = RootFinder().install()
    try:
        loss_fn(torch.zeros(1), torch.ones(1))  # no parameters: not the root
        out = model(torch.randn(1, 2))
        assert nn_module._global_forward_pre_hooks == {}  # gone after the root's first call
    finally:
        finder.uninstall()
    assert finder.root is model and finder.names == ("model",)
    assert finder.site is not None and finder.site.file == __file__ and out.shape == (1, 2)
    assert finder.binding == (finder.site, "model")


class _SelfCalling(torch.nn.Module):
    """As Lightning's training_step: the module calls itself (`self(x)`) from a method in the user's file."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)


# a framework's loop (in an installed package, not the user's code) that calls the module's method
_FRAMEWORK: dict = {"torch": torch}
exec(
    compile("def fit(m):\n    return m.step(torch.randn(1, 2))\n", "/x/site-packages/fw.py", "exec"),
    _FRAMEWORK,
)


def test_a_module_that_calls_itself_is_bound_where_the_user_named_it() -> None:
    classifier = _SelfCalling()
    finder = RootFinder().install()
    try:
        _FRAMEWORK["fit"](classifier)
    finally:
        finder.uninstall()
    assert finder.names == ("self",) and finder.site is not None and finder.site.function == "step"
    assert finder.binding is not None
    site, name = finder.binding  # the framework's `m` is not the user's: this test's `classifier`
    assert (name, site.function, site.file) == (
        "classifier",
        "test_a_module_that_calls_itself_is_bound_where_the_user_named_it",
        __file__,
    )


def test_a_model_the_script_compiled_runs_whole_under_the_finder() -> None:
    # GIVEN a method compiled by the script (as Lightning compiles training_step) that calls its module
    torch._dynamo.reset()
    classifier = _SelfCalling()
    compiled_step = torch.compile(classifier.step, backend="eager")
    finder = RootFinder().install()
    try:
        # WHEN it runs under the finder's global hooks
        explained = torch._dynamo.explain(compiled_step)(torch.randn(1, 2))
        out = compiled_step(torch.randn(1, 2))
    finally:
        finder.uninstall()
        torch._dynamo.reset()
    # THEN the hooks, traced, do nothing: one graph, no break, no error from the hook dicts changing
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert out.shape == (1, 2) and finder.root is None


# -- switched off and on in the running process (an A/B in blocks) --------------------------------------
def observed_switching(
    fix: str, model: torch.nn.Module, look: Any, x: torch.Tensor, **kwargs: Any
) -> list[Any]:
    """What `look()` sees after a first call with the fix on, then off, on, off, on; then undone."""
    seen: list[Any] = []

    def body(patch: FixPatch) -> None:
        model(x)  # finds the root
        for on in (True, False, True, False, True):
            patch.switch(on)
            seen.append(look())

    run_with_patch(fix, body, **kwargs)
    return seen


def test_flags_switch_and_undo_puts_back_what_apply_found() -> None:
    seen = observed_switching(
        "tf32", torch.nn.Linear(2, 2), torch.get_float32_matmul_precision, torch.randn(1, 2)
    )
    assert seen == ["high", "highest", "high", "highest", "high"]
    seen = observed_switching(
        "cudnn_benchmark", torch.nn.Linear(2, 2), lambda: torch.backends.cudnn.benchmark, torch.randn(1, 2)
    )
    assert seen == [True, False, True, False, True]


def test_autocast_and_compile_switch_the_root_forward_and_keep_what_they_made() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(2, 8)
    inner: list[torch.dtype] = []
    model[0].register_forward_hook(lambda m, a, out: inner.append(out.dtype))
    dtypes = observed_switching("autocast", model, lambda: (model(x), inner[-1])[1], x)
    assert dtypes == [torch.bfloat16, torch.float32, torch.bfloat16, torch.float32, torch.bfloat16]
    forwards = observed_switching(
        "compile", model, lambda: vars(model).get("forward"), x, compile_backend="eager"
    )
    compiled = forwards[0]
    assert compiled is not None and forwards == [compiled, None, compiled, None, compiled]  # compiled once
    assert "forward" not in vars(model)


def test_float16_autocast_with_loss_scaling_cannot_switch() -> None:
    from gpudoctor.fixes.patches.base import NotSwitchable

    model = torch.nn.Linear(2, 2)
    with pytest.raises(NotSwitchable, match="loss scaling"):
        observed_switching("autocast:float16", model, lambda: None, torch.randn(1, 2))


def test_channels_last_switches_the_weights_and_the_inputs() -> None:
    model = Net()
    x = torch.randn(2, 3, 8, 8)

    def look() -> tuple[bool, bool]:
        model(x)
        return model.conv.weight.is_contiguous(memory_format=torch.channels_last), model.seen_layouts[-1]

    seen = observed_switching("channels_last", model, look, x)
    assert seen == [(True, True), (False, False), (True, True), (False, False), (True, True)]
    assert model.conv.weight.is_contiguous() and not nn_module._global_forward_pre_hooks
    assert not model._forward_pre_hooks  # the input hook removed by undo


def test_channels_last_switches_the_optimizer_state_with_the_weights() -> None:
    # GIVEN momentum made while the weights were channels_last (the fix on from the start)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(2, 3, 8, 8)

    def look() -> tuple[bool, bool]:
        model(x).sum().backward()
        opt.step()
        buf = opt.state[model.conv.weight]["momentum_buffer"]
        return model.conv.weight.is_contiguous(), buf.is_contiguous()

    seen = observed_switching("channels_last", model, look, x)
    # THEN the momentum follows the weights' layout each way
    assert seen == [(False, False), (True, True), (False, False), (True, True), (False, False)]


def test_call_site_fixes_switch_what_they_skip() -> None:
    calls: list[bool] = []
    original = torch.cuda.empty_cache
    torch.cuda.memory.empty_cache, saved = (lambda: calls.append(True)), torch.cuda.memory.empty_cache
    try:
        observed_switching(
            "no_empty_cache", torch.nn.Linear(2, 2), lambda: torch.cuda.empty_cache(), torch.randn(1, 2)
        )
    finally:
        torch.cuda.memory.empty_cache = saved
    assert calls == [True, True] and torch.cuda.empty_cache is original  # called through when off
    model = torch.nn.Linear(2, 2)

    def look() -> bool:
        model(torch.randn(1, 2)).sum().backward()
        model.zero_grad(set_to_none=False)
        return model.weight.grad is None

    assert observed_switching("zero_grad_none", model, look, torch.randn(1, 2)) == [
        True,
        False,
        True,
        False,
        True,
    ]


def test_sdpa_switches_the_attention_implementation() -> None:
    model = FakeHFModel()
    seen = observed_switching("sdpa", model, lambda: model.config._attn_implementation, torch.randn(1, 2))
    assert seen == ["sdpa", "eager", "sdpa", "eager", "sdpa"] and model.config._attn_implementation == "eager"


def test_fixes_that_switch_and_those_that_cannot() -> None:
    from gpudoctor.fixes.catalog import can_switch

    assert can_switch(("tf32",)) and can_switch(("compile:reduce-overhead",)) and can_switch(("noop",))
    assert not can_switch(("workers:4",)) and not can_switch(()) and can_switch(("fused_optimizer",))
    # autocast beneath a torch.compile that stays, and one compile mode in another's place: each side's
    # forward built from its own wrappers (fixes.patches.forward.ForwardVariants)
    assert can_switch(("autocast",)) and can_switch(("compile",), ("compile:reduce-overhead",))
    assert can_switch(("autocast:float16",), ("autocast",))
    # what is replaced must wrap the root's forward (the A side alone holds it)
    assert not can_switch(("workers:16",), ("workers:32",)) and not can_switch(
        ("tf32",), ("cudnn_benchmark",)
    )
    assert not can_switch((), ("compile",))


def test_the_users_frame_is_found_without_listing_the_librarys_folders_each_time() -> None:
    # every `.item()` of the loop (and every distribution it builds) is counted by its line in every round:
    # listing Python's library folders took 130 µs a call, 260 µs a counted call in all (a GAN reads five
    # statistics a step), so the folders and each file's verdict are worked out once
    from gpudoctor.runner import hooks

    hooks.call_site()
    before = hooks._library_dirs.cache_info().misses, hooks.is_user_file.cache_info().misses
    for _ in range(3):
        site = hooks.call_site()
    assert site is not None and site.file == __file__
    assert (hooks._library_dirs.cache_info().misses, hooks.is_user_file.cache_info().misses) == before


def test_the_reseeded_round_draws_other_masks_from_the_same_weights() -> None:
    from gpudoctor.fixes.catalog import build_patch
    from gpudoctor.fixes.patches.base import PatchContext

    def run(fixes: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)  # as every round is seeded
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
        x = torch.ones(4, 8)  # made before the first module call, as a batch is
        finder = RootFinder(until=lambda: True)
        patches = [build_patch(f, PatchContext(finder, __file__)) for f in fixes]
        finder.install()
        try:
            with patched(patches):
                out = model(x)
        finally:
            finder.uninstall()
        return model[0].weight.detach().clone(), out.detach()

    w0, out0 = run(())
    w1, out1 = run(("reseed",))
    assert torch.equal(w0, w1)  # the same model
    assert not torch.equal(out0 == 0, out1 == 0)  # other dropout masks
    assert torch.equal(run(("reseed",))[1], out1)  # and the same ones every time


def test_the_nudged_round_moves_every_weight_by_one_ulp_once() -> None:
    from gpudoctor.fixes.catalog import build_patch
    from gpudoctor.fixes.patches.base import PatchContext

    torch.manual_seed(0)
    shared = torch.nn.Linear(8, 8)
    actor, critic = (
        torch.nn.Sequential(shared, torch.nn.Tanh()),
        torch.nn.Sequential(shared, torch.nn.Linear(8, 1)),
    )
    before = shared.weight.detach().clone()
    finder = RootFinder(until=lambda: False)  # watching: both modules are the step's
    patch = build_patch("nudge", PatchContext(finder, __file__))
    finder.install()
    try:
        with patched([patch]):
            for _ in range(3):  # the step's two modules, called every step
                critic(actor(torch.ones(4, 8)))
    finally:
        finder.uninstall()
    # every weight one unit in its last place further from zero, the one both modules share once
    step = (shared.weight.detach() - before).abs()
    ulp = before.abs() * torch.finfo(torch.float32).eps
    assert bool((step > 0.4 * ulp).all()) and bool((step < 2.1 * ulp).all())
