""":class:`~haepo_ray.llm.settings.LLMTrainSettings` fields as command-line options.

One option per field (``--batch-prompts`` for ``batch_prompts``), its default the field's and
its help :data:`~haepo_ray.llm.settings.HELP`'s: the settings are the one home of both. An
option given for a run that does not read it (:func:`~haepo_ray.llm.settings.unread`:
``--clip-param`` for HAEPO, ``--lora-alpha`` without ``--lora-r``) is a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Sequence
from typing import Any

from haepo_ray.cli.errors import UsageError
from haepo_ray.llm.settings import ALGORITHMS, HELP, SWITCHES, LLMTrainSettings, unread

__all__ = ["add_settings_options", "settings_from_args"]

_CHOICES = {"algo": ALGORITHMS, **SWITCHES}
_GIVEN = "settings_given"  # the namespace's set of the fields whose options the command line gave


def _record(namespace: argparse.Namespace, dest: str) -> None:
    setattr(namespace, _GIVEN, getattr(namespace, _GIVEN, frozenset()) | {dest})


class _Store(argparse.Action):
    """argparse's store, noting that the option was given."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        _record(namespace, self.dest)


class _Switch(argparse.BooleanOptionalAction):
    """``--name`` / ``--no-name``, noting that the option was given."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        _record(namespace, self.dest)


def add_settings_options(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    """Add an option for each of the settings' fields ``names``."""
    hints = typing.get_type_hints(LLMTrainSettings)
    defaults = {f.name: f.default for f in dataclasses.fields(LLMTrainSettings)}
    for name in names:
        kind, default = hints[name], defaults[name]
        options: dict[str, Any] = {"default": default, "help": f"{HELP[name]} (default: %(default)s)",
                                   "action": _Store}
        if kind is bool:
            options["action"] = _Switch
        elif typing.get_origin(kind) is tuple:
            item, *rest = typing.get_args(kind)
            options |= {"type": item, "nargs": "+" if rest == [Ellipsis] else len(typing.get_args(kind)),
                        "metavar": name.split("_")[-1].upper()}
            options["help"] = f"{HELP[name]} (default: {' '.join(map(str, default))})"
        else:
            options["type"] = kind
            if name in _CHOICES:
                options["choices"] = _CHOICES[name]
        parser.add_argument("--" + name.replace("_", "-"), **options)


def settings_from_args(args: argparse.Namespace, names: Sequence[str], **values: Any) -> LLMTrainSettings:
    """The settings of the parsed options ``names`` (and ``values``); a bad value, or an option
    the run would not read, is a UsageError."""
    try:
        settings = LLMTrainSettings(**{name: getattr(args, name) for name in names}, **values)
    except ValueError as err:
        raise UsageError(str(err)) from None
    ignored = unread([settings], sorted(getattr(args, _GIVEN, ())))
    if ignored:
        raise UsageError("\n".join(f"--{name.replace('_', '-')}: this run would not read it: {why}; "
                                   "leave it out" for name, why in ignored.items()))
    return settings
