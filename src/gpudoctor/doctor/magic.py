"""`%load_ext gpudoctor`, then `%%gpudoctor [options]` on a cell: the cell run under `gpudoctor.profile()`
(`doctor.notebook`) and its report displayed — the HTML report inline in Jupyter, the terminal text
elsewhere. Imported only by `%load_ext`; registering the magic is all it changes in the shell."""

from __future__ import annotations

import shlex
from typing import Any

from IPython.core.magic import Magics, cell_magic, magics_class

from gpudoctor.doctor.notebook import Present, Profile, ProfileOptions
from gpudoctor.util.errors import GpudoctorError

USAGE = (
    "%%gpudoctor [--steps N] [--light-steps N] [--warmup N] [--with-stack] [--record-shapes] "
    "[--profile-memory] [--no-nvml] [--out DIR]"
)


def options_of(line: str) -> tuple[ProfileOptions, str | None]:
    """The magic's options (its line after %%gpudoctor); a bad one is a one-line `GpudoctorError`."""
    import argparse

    parser = argparse.ArgumentParser(prog="%%gpudoctor", add_help=False, exit_on_error=False)
    for name in ("--steps", "--light-steps", "--warmup"):
        parser.add_argument(name, type=int)
    for name in ("--with-stack", "--record-shapes", "--profile-memory", "--no-nvml"):
        parser.add_argument(name, action="store_true")
    parser.add_argument("--out")
    try:
        ns, rest = parser.parse_known_args(shlex.split(line))
    except (argparse.ArgumentError, ValueError) as err:
        raise GpudoctorError(f"{err}; usage: {USAGE}") from None
    if rest:
        raise GpudoctorError(f"unknown option {' '.join(rest)}; usage: {USAGE}")
    given = {k: v for k, v in vars(ns).items() if v not in (None, False) and k not in ("out", "no_nvml")}
    return ProfileOptions(**given, nvml=not ns.no_nvml), ns.out


@magics_class
class GpudoctorMagics(Magics):
    def __init__(self, shell: Any, present: Present) -> None:
        super().__init__(shell)
        self._present = present

    @cell_magic
    def gpudoctor(self, line: str, cell: str) -> None:
        """Run the cell under the doctor and show its report: `%%gpudoctor [--steps N] …`."""
        from IPython.display import display

        try:
            options, out = options_of(line)
        except GpudoctorError as err:
            print(f"gpudoctor: error: {err}")
            return
        with Profile(options, out=out, name="cell", present=self._present) as profile:
            self.shell.run_cell(cell)
        display(profile.report)


def register(ipython: Any, present: Present) -> None:
    ipython.register_magics(GpudoctorMagics(ipython, present))
