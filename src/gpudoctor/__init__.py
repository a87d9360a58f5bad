"""gpudoctor: why is my PyTorch GPU step slow, what does each cause cost, and what do I change.

    with gpudoctor.profile() as p:       # the doctor on a block of your own code (a notebook cell)
        train_steps()
    p.report                             # the report: text in a console, HTML inline in Jupyter
    gpudoctor.diagnose("trace.json.gz")  # any Kineto trace, a directory of rank traces, a run directory
    %load_ext gpudoctor                  # then %%gpudoctor on a cell

Importing the package is cheap and changes nothing: torch and the rest are imported by the parts that run."""

from typing import Any

from gpudoctor.util.version import __version__

__all__ = ["__version__", "bench", "diagnose", "load_ipython_extension", "profile", "session", "step"]


def profile(*, out: Any = None, **options: Any) -> Any:
    """`with gpudoctor.profile() as p: ...` then `p.report`: the block's steps found, a few timed without
    the profiler and a few traced, the block run to its end, and diagnosed. Options: `steps`,
    `light_steps`, `light_seconds`, `warmup`, `warmup_seconds`, `with_stack`, `record_shapes`,
    `profile_memory`, `nvml`, `module_depth`; `out`: the run directory (default gpudoctor-runs/…)."""
    import dataclasses

    from gpudoctor.doctor.notebook import Profile, ProfileOptions
    from gpudoctor.report.notebook import Shown
    from gpudoctor.util.errors import UsageError

    known = {f.name for f in dataclasses.fields(ProfileOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(
            f"gpudoctor.profile(): no option {', '.join(unknown)} (options: {', '.join(sorted(known | {'out'}))})"
        )
    return Profile(ProfileOptions(**options), out=out, present=Shown)


def diagnose(path: Any, *, rank: int | None = None) -> Any:
    """The report of a trace (from any tool that writes Kineto traces), a directory of rank traces
    (`rank`: the one to detail), a `gpudoctor run` directory, or a saved analysis."""
    from gpudoctor.doctor.notebook import diagnose as _diagnose
    from gpudoctor.report.notebook import Shown

    return _diagnose(path, rank=rank, present=Shown)


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext gpudoctor`: the `%%gpudoctor` cell magic."""
    from gpudoctor.doctor.magic import register
    from gpudoctor.report.notebook import Shown

    register(ipython, present=Shown)


def bench(fn: Any, *args: Any, **options: Any) -> Any:
    """`gpudoctor.timing.bench`: time `fn(*args)` correctly on the GPU or the CPU (see its docs)."""
    from gpudoctor.timing import bench as _bench  # imported on first use: the package stays cheap

    return _bench(fn, *args, **options)


def step() -> None:
    """Mark the end of a step for `gpudoctor run` (loops without an optimizer); a no-op otherwise."""
    from gpudoctor.runner.capture import step as _step

    _step()


def session() -> Any:
    """`with gpudoctor.session() as s: ... s.step()`: a region of steps for `gpudoctor run`; leaving it
    ends the capture. Outside `gpudoctor run` it does nothing."""
    from gpudoctor.runner.capture import session as _session

    return _session()
