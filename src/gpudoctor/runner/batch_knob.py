"""Setting an unmodified script's batch size from outside: its `--batch-size`-like command-line option
(argparse, also through subclasses such as Hugging Face's HfArgumentParser), else the `batch_size`
of every DataLoader it builds. `BatchKnob.install()` patches `ArgumentParser.parse_known_args` and
`DataLoader.__init__`; `uninstall()` puts both back. `applied` says what was set and its default."""

from __future__ import annotations

import argparse
import re
from typing import Any

# Option names (lower case, dashes and underscores dropped) that mean "the batch size", best first.
BATCH_OPTIONS = (
    "batchsize",
    "perdevicetrainbatchsize",
    "trainbatchsize",
    "microbatchsize",
    "batch",
    "bs",
)


def _normal(option: str) -> str:
    return re.sub(r"[-_]", "", option.lower())


def batch_action(parser: argparse.ArgumentParser, name: str | None = None) -> argparse.Action | None:
    """The parser's batch-size option: the one named `name` (a flag or a dest), else the best match."""
    actions = [a for a in parser._actions if a.option_strings and a.nargs in (None, "?")]
    if name is not None:
        wanted = _normal(name)
        return next(
            (a for a in actions if wanted in {_normal(o) for o in a.option_strings} | {_normal(a.dest)}), None
        )
    for key in BATCH_OPTIONS:
        for a in actions:
            if key in {_normal(o) for o in a.option_strings}:
                return a
    return None


class BatchKnob:
    def __init__(self, batch: int, option: str | None = None) -> None:
        self.batch = batch
        self.option = option  # --batch-arg: the option to set, when the script's name is unusual
        self.applied: dict[str, Any] | None = None
        self._parse: Any = None
        self._loader_init: Any = None

    def install(self) -> BatchKnob:
        from torch.utils.data import DataLoader

        knob = self
        parse = argparse.ArgumentParser.parse_known_args

        def parse_known_args(parser: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
            result = parse(parser, args, namespace)
            knob._set_option(parser, result[0])
            return result

        loader_init = DataLoader.__init__

        def __init__(loader: Any, dataset: Any, *args: Any, **kwargs: Any) -> None:
            args, kwargs = knob._loader_arguments(args, kwargs, dataset)
            loader_init(loader, dataset, *args, **kwargs)

        argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]
        DataLoader.__init__ = __init__  # type: ignore[method-assign]
        self._parse, self._loader_init = parse, loader_init
        return self

    def uninstall(self) -> None:
        if self._parse is not None:
            argparse.ArgumentParser.parse_known_args = self._parse  # type: ignore[method-assign]
            self._parse = None
        if self._loader_init is not None:
            from torch.utils.data import DataLoader

            DataLoader.__init__ = self._loader_init  # type: ignore[method-assign]
            self._loader_init = None

    def _set_option(self, parser: argparse.ArgumentParser, namespace: Any) -> None:
        if self.applied is not None and self.applied["kind"] == "option":
            return  # the first parser with a batch option wins (a later one is another tool's)
        action = batch_action(parser, self.option)
        if action is None or not hasattr(namespace, action.dest):
            return
        self.applied = {
            "kind": "option",
            "option": action.option_strings[-1],
            "dest": action.dest,
            "default": getattr(namespace, action.dest),
        }
        setattr(namespace, action.dest, self.batch)

    def _loader_arguments(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], dataset: Any = None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """DataLoader(dataset, batch_size=…) with the sweep's size, unless an option set it already (then
        the script passes that on itself) or the loader batches through a batch_sampler. `samples` is
        the smallest dataset of the loaders set (where it has a length): a batch above it is not that
        batch."""
        if self.applied is not None and self.applied["kind"] == "option":
            return args, kwargs
        if kwargs.get("batch_sampler") is not None:
            return args, kwargs
        if args:
            current = args[0]
            args = (self.batch, *args[1:])
        else:
            current = kwargs.get("batch_size", 1)
            if current is None:
                return args, kwargs
            kwargs = {**kwargs, "batch_size": self.batch}
        if self.applied is None:
            self.applied = {
                "kind": "dataloader",
                "option": None,
                "dest": None,
                "default": current,
                "loaders": 0,
            }
        self.applied["loaders"] += 1
        try:
            size = len(dataset)
        except Exception:  # an IterableDataset, or no __len__
            size = None
        if isinstance(size, int) and (self.applied.get("samples") is None or size < self.applied["samples"]):
            self.applied["samples"] = size
        return args, kwargs
