"""What the script does that decides which fixes apply, seen from inside the child process without
changing what it computes: the root module (class, parameters, convolutions, dropout, Hugging Face
attention, input shapes of its first calls), the DataLoaders and optimizers it builds (with their call
sites; for a loader without workers, the wall and CPU time of its batches: a loader that waits on I/O
rather than computes can use more workers than there are cores), per-step `empty_cache()`,
`zero_grad(set_to_none=False)` and `.item()` on GPU tensors, and the backend flags. The `Observer` is installed in every child (baseline and candidates alike), after the
fixes' patches, so it sees the arguments they leave."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any

from gpudoctor.fixes.evidence import (
    CompileCounts,
    WorkTally,
    compile_counts,
    listen_for_cudagraph_skips,
    since,
    summed,
    work_probe,
)
from gpudoctor.fixes.patches.layout import conv2d_layers
from gpudoctor.runner.hooks import (
    CallSite,
    Restorer,
    RootFinder,
    StepFunction,
    call_site,
    eager_frame,
    eager_only,
)
from gpudoctor.util.serial import Serialized

INPUT_CALLS = 5  # root calls whose input shapes are recorded
WAITS_KEPT = 512  # a loader with workers: the training thread's latest waits for them, kept per loader
WAITS_UNDER = 0.5  # a loader whose batches take less CPU time than this share of their wall time waits
HALF_DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class RootInfo:
    cls: str
    params: int
    dtype: str  # of the first parameter
    device: str  # cuda, cpu
    training: bool
    conv2d: bool
    dropout: bool  # a dropout module with p > 0 in training mode: compiled random numbers differ
    hf_attention: str | None  # config._attn_implementation of a Hugging Face model
    names: tuple[str, ...]  # the names the calling frame binds to it
    site: CallSite | None
    input_shapes: tuple[tuple[tuple[int, ...], ...], ...]  # tensor shapes of its first calls
    # the dtype autocast computes its layers in (bfloat16, float16), seen inside its first call; None
    # without autocast or where not seen (a compiled root): the Trainer's bf16=True wraps the forward
    autocast: str | None = None
    compiled: bool = False  # the script compiles it itself (torch.compile(model), model.compile())
    calls: int = 1  # its top-level calls while the modules were being found (a few steps)
    work: WorkTally | None = None  # the work its first call's forward ran (None: not probed)
    # the script made its convolutions' weights channels_last itself (every Conv2d weight is, and one at
    # least differs from NCHW: 1x1 kernels read as both)
    channels_last: bool = False

    @property
    def draws_random(self) -> bool:
        """Its forward draws random numbers — dropout, or a sampling of its own (a VAE encoder's
        `randn_like`) its first call ran: compiled, or in bfloat16, it draws other ones."""
        return self.dropout or bool(self.work is not None and self.work.random_ops)

    @property
    def samples(self) -> bool:
        """Its forward draws random numbers other than dropout's (a VAE encoder's `randn_like`): compiled
        code may draw other ones even with Inductor's `fallback_random` (torch 2.13 on the CPU:
        `randn_like` of a channel slice)."""
        return bool(self.work is not None and self.work.sampling_ops)


@dataclass(frozen=True)
class LoaderInfo:
    site: CallSite | None
    batch_size: int | None
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    iterable: bool  # an IterableDataset: workers would each yield all of it
    iterated: bool
    # batches made on the training thread (no workers), and the wall and CPU time (the whole process's)
    # they took: CPU time well under wall time means the loader waits (I/O, a remote store, sleep)
    fetches: int = 0
    fetch_wall_s: float = 0.0
    fetch_cpu_s: float = 0.0
    # with workers: the training thread's mean wait per batch for them, over the later half of the
    # batches it took (the workers' start-up left out); None without workers or batches
    wait_s: float | None = None
    taken: int = 0  # batches the process asked it for (an epoch's end too), with workers or without

    @property
    def waits(self) -> bool:
        return self.fetches > 0 and self.fetch_cpu_s < WAITS_UNDER * self.fetch_wall_s

    @property
    def fetch_s(self) -> float | None:
        """Wall time per batch made on the training thread."""
        return self.fetch_wall_s / self.fetches if self.fetches else None

    @property
    def batch_wait_s(self) -> float | None:
        """What the training thread spends per batch on this loader: with workers, its wait for them;
        without, making the batch itself (time it does not launch GPU work in)."""
        return self.wait_s if self.num_workers > 0 else self.fetch_s


@dataclass(frozen=True)
class OptimizerInfo:
    site: CallSite | None
    cls: str
    foreach: bool | None
    fused: bool | None
    params: int
    fusable: bool = True  # the class has a fused or foreach implementation (LBFGS has neither)


@dataclass(frozen=True)
class DdpInfo:
    """A DistributedDataParallel the script built: where, and the knobs it set that the `ddp` fix changes."""

    site: CallSite | None
    own_call: bool  # built on a line of the user's files (not inside a library: accelerate, Lightning)
    to_set: tuple[str, ...] = ()  # the knobs the fix would change (static_graph, …)
    # built by a framework whose own option the `ddp` fix writes (patches.ddp.FRAMEWORKS), else None
    framework: str | None = None
    # its forwards (with gradients) per optimizer step, and how many of them all-reduce (the others run
    # under no_sync()): the median over the steps seen; 0 where no optimizer step was seen
    micro_batches: int = 0
    synced: int = 0


@dataclass
class _MicroBatches:
    """One DDP model's forwards (with gradients) since the last optimizer step, how many of them
    all-reduce, and (forwards, all-reducing) of each optimizer step seen (the first 1000)."""

    forwards: int = 0
    synced: int = 0
    steps: list[tuple[int, int]] = field(default_factory=list)

    def forward(self, syncs: bool) -> None:
        self.forwards += 1
        self.synced += syncs

    def step(self) -> None:
        if self.forwards and len(self.steps) < 1000:
            self.steps.append((self.forwards, self.synced))
        self.forwards = self.synced = 0


@dataclass(frozen=True)
class SiteCount:
    site: CallSite | None
    count: int


@dataclass(frozen=True)
class Observations(Serialized):
    root: RootInfo | None
    loaders: tuple[LoaderInfo, ...]
    optimizers: tuple[OptimizerInfo, ...]
    empty_cache: tuple[SiteCount, ...]
    zero_grad_keep: tuple[SiteCount, ...]  # zero_grad(set_to_none=False)
    item_syncs: tuple[SiteCount, ...]  # .item() on a GPU tensor
    float32_matmul_precision: str
    cudnn_benchmark: bool
    cuda: bool
    bf16_supported: bool
    free_cores: int
    cudnn_tf32: bool = False  # torch.backends.cudnn.allow_tf32 (PyTorch's default: on)
    # every top-level module the step calls (`root` is the first of them), and what torch.compile did
    roots: tuple[RootInfo, ...] = ()
    compiled: CompileCounts | None = None
    ddp: tuple[DdpInfo, ...] = ()  # the DistributedDataParallel wrappers it built
    # torch.distributions objects built with their arguments validated (which synchronizes), by line
    validated_distributions: tuple[SiteCount, ...] = ()
    # the plain functions of the user's files that call the top-level modules (`def act(obs)`)
    step_functions: tuple[StepFunction, ...] = ()

    @property
    def step_roots(self) -> tuple[RootInfo, ...]:
        """The top-level modules the step calls (the root alone in a record without them)."""
        return self.roots or ((self.root,) if self.root is not None else ())

    @property
    def work(self) -> WorkTally | None:
        """The forward work of the step's modules' first calls, summed (None where none was probed)."""
        tallies = [r.work for r in self.step_roots if r.work is not None]
        return summed(tallies) if tallies else None

    @property
    def tf32_baseline(self) -> bool:
        """The script's own float32 arithmetic already rounds at TF32 on the GPU: its matmuls (a
        float32_matmul_precision below "highest") or its convolutions (cuDNN's TF32, on by default)."""
        if not self.cuda:
            return False
        convs = self.root is not None and self.root.conv2d and self.cudnn_tf32
        return convs or self.float32_matmul_precision != "highest"

    @property
    def reduced_precision(self) -> str | None:
        """The reduced precision the script's models already compute in (under autocast, or their
        parameters' dtype) where all of them do, else None."""
        precisions = [r.autocast or (r.dtype if r.dtype in HALF_DTYPES else None) for r in self.step_roots]
        if not precisions or any(p is None for p in precisions):
            return None
        return precisions[0]

    @property
    def static_shapes(self) -> bool:
        """Every top-level module's inputs kept their shapes over its first calls (CUDA graphs need that)."""
        roots = self.step_roots
        return bool(roots) and all(
            len(r.input_shapes) >= 2 and all(s == r.input_shapes[0] for s in r.input_shapes) for r in roots
        )

    @property
    def samples_per_step(self) -> int | None:
        """The batch size of the first DataLoader the loop iterated."""
        return next((lo.batch_size for lo in self.loaders if lo.iterated), None)


def free_cores() -> int:
    """CPU cores this process may use, less one for the training loop itself."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(n - 1, 0)


# where the Observer installed counts the torch.distributions built with their arguments validated (a
# module global, not a closure: see `validated` in `Observer._count_calls`)
_VALIDATED: list[Counter[CallSite | None]] = []


class Observer:
    name = "observer"

    def __init__(self, finder: RootFinder, *, all_devices: bool = False) -> None:
        self.finder = finder
        self.all_devices = all_devices  # count .item() on CPU tensors too (tests)
        self._restorer = Restorer()
        self._roots: dict[int, _RootWatch] = {}  # every top-level module, by id, in the order found
        self._work: dict[int, WorkTally] = {}  # what each one's first call ran
        self._compile_start: CompileCounts | None = None
        self._loaders: list[tuple[Any, CallSite | None]] = []
        self._loader_infos: tuple[LoaderInfo, ...] | None = None  # once undone (the loaders let go)
        self._iterated: list[int] = []
        self._optimizers: list[OptimizerInfo] = []
        self._ddp: list[tuple[int, DdpInfo]] = []  # (id of the DDP model, what was seen of its building)
        self._micro_batches: dict[int, _MicroBatches] = {}  # by id of the DDP model
        self._counts: dict[str, Counter[CallSite | None]] = {
            k: Counter() for k in ("empty", "zero", "item", "validated")
        }
        self._fetch: dict[int, list[float]] = {}  # id(loader) -> [batches, wall s, CPU s]
        self._waits: dict[int, deque[float]] = {}  # id(loader) -> its latest waits for workers, s
        self._taken: dict[int, int] = {}  # id(loader) -> batches taken from it

    def apply(self) -> None:
        try:
            self._install()
        except BaseException:
            self._restorer.restore()
            raise

    def undo(self) -> None:
        for watch in self._roots.values():
            watch.stop()
        self._restorer.restore()
        # the script's loaders let go, what was seen of them kept: one held to the interpreter's exit keeps
        # its persistent workers, which multiprocessing then terminates, each leaving its pymp-* folder in
        # the temp directory (a round of `gpudoctor fix` on a main() with persistent workers left one)
        self._loader_infos = self._seen_loaders()
        self._loaders.clear()

    def _seen_loaders(self) -> tuple[LoaderInfo, ...]:
        if self._loader_infos is not None:
            return self._loader_infos
        return tuple(
            _loader_info(
                lo,
                site,
                id(lo) in self._iterated,
                self._fetch.get(id(lo)),
                self._waits.get(id(lo)),
                self._taken.get(id(lo), 0),
            )
            for lo, site in self._loaders
        )

    def _install(self) -> None:
        import torch
        from torch.utils.data import DataLoader

        r, observer = self._restorer, self
        init, iterate = DataLoader.__init__, DataLoader.__iter__

        def loader_init(loader: Any, *args: Any, **kwargs: Any) -> None:
            site = call_site()
            init(loader, *args, **kwargs)
            observer._loaders.append((loader, site))

        def loader_iter(loader: Any) -> Any:
            if id(loader) not in observer._iterated:
                observer._iterated.append(id(loader))
            it = iterate(loader)
            it._gpudoctor_loader = id(loader)
            return it

        r.replace(DataLoader, "__init__", loader_init)
        r.replace(DataLoader, "__iter__", loader_iter)
        self._time_batches()
        optimizer_init = torch.optim.Optimizer.__init__

        def opt_init(opt: Any, params: Any, defaults: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            optimizer_init(opt, params, defaults, *args, **kwargs)
            count = sum(len(g["params"]) for g in opt.param_groups)
            observer._optimizers.append(
                OptimizerInfo(
                    call_site(),
                    type(opt).__name__,
                    defaults.get("foreach"),
                    defaults.get("fused"),
                    count,
                    fusable="foreach" in defaults or "fused" in defaults,
                )
            )

        r.replace(torch.optim.Optimizer, "__init__", opt_init)
        self._watch_ddp()
        self._count_calls(torch)
        listen_for_cudagraph_skips()
        self._compile_start = compile_counts()
        self.finder.on_root(self._on_root)
        self.finder.around_first_call(self._probe)

    def _watch_ddp(self) -> None:
        import torch
        import torch.distributed

        if not torch.distributed.is_available():
            return
        from torch.nn.parallel import DistributedDataParallel
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from gpudoctor.fixes.patches.ddp import built_at

        init, observer = DistributedDataParallel.__init__, self

        def ddp_init(ddp: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            site = call_site()
            init(ddp, module, *args, **kwargs)
            call, framework, knobs = built_at(site, kwargs)
            info = DdpInfo(site, call is not None, tuple(knobs), framework)
            observer._ddp.append((id(ddp), info))

        forward, counts = DistributedDataParallel.forward, self._micro_batches

        @eager_frame
        def ddp_forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():
                counts.setdefault(id(ddp), _MicroBatches()).forward(bool(ddp.require_backward_grad_sync))
            return forward(ddp, *args, **kwargs)

        def after_step(*_: Any) -> None:
            for c in counts.values():
                c.step()

        self._restorer.replace(DistributedDataParallel, "__init__", ddp_init)
        self._restorer.replace(DistributedDataParallel, "forward", ddp_forward)
        self._restorer.on_restore(register_optimizer_step_post_hook(after_step).remove)

    def _time_batches(self) -> None:
        from torch.utils.data import dataloader

        base = dataloader._BaseDataLoaderIter
        following = base.__next__
        fetch, waits, taken = self._fetch, self._waits, self._taken

        def timed_next(it: Any) -> Any:
            owner = getattr(it, "_gpudoctor_loader", None)
            if owner is None:
                return following(it)
            taken[owner] = taken.get(owner, 0) + 1
            if getattr(it, "_num_workers", 0) > 0:  # the training thread waits for the workers
                wall = time.perf_counter()
                try:
                    return following(it)
                finally:
                    waits.setdefault(owner, deque(maxlen=WAITS_KEPT)).append(time.perf_counter() - wall)
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return following(it)
            finally:
                entry = fetch.setdefault(owner, [0, 0.0, 0.0])
                entry[0] += 1
                entry[1] += time.perf_counter() - wall
                entry[2] += time.process_time() - cpu

        self._restorer.replace(base, "__next__", timed_next)

    def _count_calls(self, torch: Any) -> None:
        r, counts, observer = self._restorer, self._counts, self
        empty_cache = torch.cuda.empty_cache

        def empty(*args: Any, **kwargs: Any) -> Any:
            counts["empty"][call_site()] += 1
            return empty_cache(*args, **kwargs)

        r.replace(torch.cuda, "empty_cache", empty)
        for owner in (torch.optim.Optimizer, torch.nn.Module):
            r.replace(owner, "zero_grad", self._zero_grad(owner.zero_grad))
        item = torch.Tensor.item

        def item_call(tensor: Any) -> Any:
            if not torch.compiler.is_compiling() and (tensor.is_cuda or observer.all_devices):
                counts["item"][call_site()] += 1
            return item(tensor)

        r.replace(torch.Tensor, "item", item_call)
        distribution = torch.distributions.Distribution
        made = distribution.__init__
        _VALIDATED.append(counts["validated"])
        r.on_restore(lambda: _VALIDATED.remove(counts["validated"]))

        def validated(obj: Any, *args: Any, **kwargs: Any) -> None:
            # (no Counter in its closure: Dynamo inlines it where compiled code builds a distribution,
            # and a closure it cannot wrap would break the graph there)
            made(obj, *args, **kwargs)
            if obj._validate_args and not torch.compiler.is_compiling():
                _VALIDATED[-1][call_site()] += 1

        r.replace(distribution, "__init__", validated)

    def _zero_grad(self, original: Any) -> Any:
        counts = self._counts

        def zero_grad(obj: Any, set_to_none: bool = True) -> None:
            if not set_to_none:
                counts["zero"][call_site()] += 1
            original(obj, set_to_none=set_to_none)

        return zero_grad

    def _on_root(self, module: Any, args: tuple[Any, ...]) -> None:
        self._roots[id(module)] = _RootWatch(module, args, self.finder)

    def _probe(self, module: Any) -> Any:
        """The work of the module's first call, counted by op (not where something compiled runs in it:
        a dispatch mode there would change what Dynamo does)."""
        import torch

        if torch.compiler.is_compiling() or _compiled_inside(module):
            return None
        return self._probing(module)

    @contextlib.contextmanager
    def _probing(self, module: Any) -> Any:
        probe = work_probe()
        with probe:
            yield
        self._work[id(module)] = probe.tally()

    def observations(self) -> Observations:
        import torch

        step = {id(r.module): r.calls for r in self.finder.per_step()}
        infos = {
            key: watch.info(calls=_calls(self.finder, key), work=self._work.get(key))
            for key, watch in self._roots.items()
        }
        roots = tuple(info for key, info in infos.items() if key in step)
        return Observations(
            root=roots[0] if roots else next(iter(infos.values()), None),
            loaders=self._seen_loaders(),
            optimizers=tuple(self._optimizers),
            empty_cache=_site_counts(self._counts["empty"]),
            zero_grad_keep=_site_counts(self._counts["zero"]),
            item_syncs=_site_counts(self._counts["item"]),
            validated_distributions=_site_counts(self._counts["validated"]),
            float32_matmul_precision=torch.get_float32_matmul_precision(),
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
            cuda=torch.cuda.is_available() and torch.cuda.is_initialized(),
            bf16_supported=bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported()),
            free_cores=free_cores(),
            cudnn_tf32=bool(torch.backends.cudnn.allow_tf32),
            roots=roots,
            compiled=since(compile_counts(), self._compile_start) if self._compile_start else None,
            ddp=tuple(self._ddp_infos()),
            step_functions=tuple(self.finder.step_functions()),
        )

    def _ddp_infos(self) -> list[DdpInfo]:
        out = []
        for key, info in self._ddp:
            seen = self._micro_batches[key].steps if key in self._micro_batches else []
            if seen:
                forwards, synced = (int(statistics.median_low(x)) for x in zip(*seen, strict=True))
                info = replace(info, micro_batches=forwards, synced=synced)
            out.append(info)
        return out


def _calls(finder: RootFinder, key: int) -> int:
    seen = finder.seen.get(key)
    return seen.calls if seen is not None else 1


def _compiled_inside(module: Any) -> bool:
    """The module, or one inside it, is compiled by the script (or scripted with TorchScript), or wrapped
    for data parallelism: its first call is left unprobed."""
    for m in module.modules():
        name = type(m).__name__
        if name in ("OptimizedModule", "DistributedDataParallel", "FullyShardedDataParallel"):
            return True
        if getattr(m, "_compiled_call_impl", None) is not None or name.startswith("Recursive"):
            return True
    return False


def _channels_last(module: Any) -> bool:
    """Every 2-D convolution's weight of `module` in channels_last, and one at least not also NCHW."""
    import torch

    weights = [m.weight for m in conv2d_layers(module)]
    nhwc = torch.channels_last
    return (
        bool(weights)
        and all(w.is_contiguous(memory_format=nhwc) for w in weights)
        and any(not w.is_contiguous() for w in weights)
    )


class _RootWatch:
    """What is seen of one top-level module: its class and parameters at its first call, the input
    shapes of its first calls, and whether its layers run under autocast (seen at its first leaf with
    parameters inside its first call: a wrapper may enter autocast inside its forward — accelerate, and
    so the Trainer's bf16=True — after the module's own hooks ran)."""

    def __init__(self, module: Any, args: tuple[Any, ...], finder: RootFinder) -> None:
        import torch

        first = next(module.parameters())
        config = getattr(module, "config", None)
        seen = finder.seen_of(module)
        self.fields: dict[str, Any] = {
            "cls": type(getattr(module, "_orig_mod", None) or module).__name__,  # a compiled one's own class
            "params": sum(p.numel() for p in module.parameters()),
            "dtype": str(first.dtype).removeprefix("torch."),
            "device": first.device.type,
            "training": bool(module.training),
            "conv2d": bool(conv2d_layers(module)),
            "channels_last": _channels_last(module),
            "dropout": any(
                isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 and m.training
                for m in module.modules()
            ),
            "hf_attention": getattr(config, "_attn_implementation", None),
            "names": seen.names if seen else (),
            "site": seen.site if seen else None,
            # torch.compile(model), or model.compile(): compiled by the script itself
            "compiled": type(module).__name__ == "OptimizedModule"
            or getattr(module, "_compiled_call_impl", None) is not None,
        }
        device = first.device.type
        if torch.is_autocast_enabled(device):  # entered around the call (a compiled root shows it only here)
            self.fields["autocast"] = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
        self.shapes = [_shapes(args, {})]
        self._hook: Any = module.register_forward_pre_hook(eager_only(self._on_call), with_kwargs=True)
        self._leaf_hook: Any = self._watch_autocast(module, device)

    def _watch_autocast(self, root: Any, device: str) -> Any:
        import torch

        leaf = next(
            (
                m
                for m in root.modules()
                if next(m.children(), None) is None and next(m.parameters(recurse=False), None) is not None
            ),
            None,
        )
        if leaf is None:
            return None
        fields, looked = self.fields, []

        def seen(module: Any, args: tuple[Any, ...]) -> None:
            # once (removed at the module's next call: not while torch iterates the leaf's hooks)
            if looked:
                return
            looked.append(True)
            if torch.is_autocast_enabled(device):
                fields["autocast"] = str(torch.get_autocast_dtype(device)).removeprefix("torch.")

        return leaf.register_forward_pre_hook(eager_only(seen))

    def _on_call(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.shapes.append(_shapes(args, kwargs))
        if self._leaf_hook is not None:
            self._leaf_hook.remove()
            self._leaf_hook = None
        if len(self.shapes) >= INPUT_CALLS and self._hook is not None:
            self._hook.remove()
            self._hook = None

    def stop(self) -> None:
        for name in ("_hook", "_leaf_hook"):
            handle = getattr(self, name)
            if handle is not None:
                handle.remove()
                setattr(self, name, None)

    def info(self, calls: int, work: WorkTally | None) -> RootInfo:
        return RootInfo(**self.fields, input_shapes=tuple(self.shapes), calls=calls, work=work)


def _shapes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[int, ...], ...]:
    import torch

    values = [*args, *kwargs.values()]
    return tuple(tuple(v.shape) for v in values if isinstance(v, torch.Tensor))


def _loader_info(
    loader: Any,
    site: CallSite | None,
    iterated: bool,
    fetch: list[float] | None,
    waits: deque[float] | None = None,
    taken: int = 0,
) -> LoaderInfo:
    from torch.utils.data import IterableDataset

    batches, wall, cpu = fetch or (0, 0.0, 0.0)
    later = list(waits or ())[len(waits or ()) // 2 :]
    return LoaderInfo(
        site=site,
        batch_size=loader.batch_size,
        num_workers=int(loader.num_workers),
        pin_memory=bool(loader.pin_memory),
        persistent_workers=bool(loader.persistent_workers),
        prefetch_factor=loader.prefetch_factor,
        iterable=isinstance(loader.dataset, IterableDataset),
        iterated=iterated,
        fetches=int(batches),
        fetch_wall_s=wall,
        fetch_cpu_s=cpu,
        wait_s=sum(later) / len(later) if later else None,
        taken=taken,
    )


def _site_counts(counter: Counter[CallSite | None]) -> tuple[SiteCount, ...]:
    return tuple(SiteCount(site, n) for site, n in counter.most_common())
