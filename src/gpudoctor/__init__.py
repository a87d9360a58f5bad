"""gpudoctor: why is my PyTorch GPU step slow, what does each cause cost, and what do I change.

Importing the package is cheap and changes nothing: torch is imported only by the parts that run code.
"""

from typing import Any

from gpudoctor.util.version import __version__ as __version__


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
