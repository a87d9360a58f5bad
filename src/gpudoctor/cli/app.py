"""The `gpudoctor` typer app: its global options, its commands (one per module, listed in `COMMANDS`),
and the mapping of errors to exit codes (a `GpudoctorError` is one line on stderr and exit 2, --debug
shows its traceback; usage errors exit 2; Ctrl-C exits 130). `cli.main` is the console script."""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import Any

import typer
from typer.core import TyperGroup

from gpudoctor.cli.common import DebugOption, error_line, is_debug, set_debug
from gpudoctor.util.errors import GpudoctorError
from gpudoctor.util.version import __version__

# Each name is a module gpudoctor.cli.<name> with `register(app)`; adding a command is one entry.
COMMANDS = ("analyze", "demo", "monitor", "bench", "explore", "run", "report", "fix", "batch")


class _Group(TyperGroup):
    """Turns a `GpudoctorError` raised anywhere below into one line on stderr and its exit code."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except GpudoctorError as err:
            if is_debug(ctx):
                traceback.print_exc(file=sys.stderr)
            else:
                print(error_line(err), file=sys.stderr)
            raise typer.Exit(err.exit_code) from None


app = typer.Typer(
    cls=_Group,
    name="gpudoctor",
    help="Why is my PyTorch GPU code slow, what does each cause cost, and what do I change?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpudoctor {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    ctx: typer.Context,
    debug: DebugOption = False,
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version and exit."
    ),
) -> None:
    set_debug(ctx, debug)


for _name in COMMANDS:
    importlib.import_module(f"gpudoctor.cli.{_name}").register(app)
