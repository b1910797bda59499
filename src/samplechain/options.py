"""Options declared once, as sampling parameters are (``param_specs``): a field of a configuration dataclass made
with ``option(...)`` carries its default, its command-line flags (and a ``--no-`` form for a switch), ``--help``, its
check and how a flag's value becomes the field's.

The declared classes: ``ServerConfig`` (``server/config.py``: ``serve``'s settings), ``ModelOptions``
(``runtime/config.py``: how a model loads, for ``generate`` and ``serve``), ``Rules`` (``runtime/decoding.py``: the
stop and limit options) and ``SpeculationConfig`` (``speculative/config.py``: drafting). A command adds a class's
flags with :func:`add_declared` and reads them back with :func:`declared_values`; the code that runs reads the field.
Adding an option is one declaration plus its use.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_OPTION = "samplechain.option"
UNSET: Any = object()  # ``flag_default`` not given: the flag's default is the field's


@dataclass(frozen=True)
class Option:
    """One declared option: the configuration field ``name``, its flags and what the command line does with it.

    ``flags``: ``add_argument`` names; ``negative``: the names of a switch's off form; ``arg``: ``add_argument``'s
    other options (``type``, ``metavar``, ``choices``; a switch is ``action="store_true"``); ``check``: the parsed
    value -> an error message or None (a usage error); ``convert``: the parsed value -> the field's (default: as
    is); ``flag_default``: the flag's default where it differs from the field's (``-np -1``: auto)."""

    name: str
    default: Any
    flags: tuple[str, ...]
    help: str
    negative: tuple[str, ...] = ()
    negative_help: str | None = None
    arg: tuple[tuple[str, Any], ...] = ()
    check: Callable[[Any], str | None] | None = None
    convert: Callable[[Any], Any] | None = None
    flag_default: Any = UNSET

    @property
    def dest(self) -> str:
        return self.name

    def value(self, parsed: Any) -> Any:
        """The field's value from the flag's parsed value; ValueError with the check's message."""
        if self.check is not None:
            message = self.check(parsed)
            if message is not None:
                raise ValueError(message)
        return self.convert(parsed) if self.convert is not None else parsed


def option(default: Any, *flags: str, help: str, negative: Sequence[str] = (), negative_help: str | None = None,
           check: Callable[[Any], str | None] | None = None, convert: Callable[[Any], Any] | None = None,
           flag_default: Any = UNSET, **arg: Any) -> Any:
    """A configuration field with its declaration (a ``dataclasses.field`` carrying it as metadata)."""
    decl = dict(flags=tuple(flags), help=help, negative=tuple(negative), negative_help=negative_help,
                arg=tuple(arg.items()), check=check, convert=convert, flag_default=flag_default)
    return dataclasses.field(default=default, metadata={_OPTION: decl})


@functools.cache
def declared(cls: type) -> tuple[Option, ...]:
    """The declared options of a config class, in field order (fields made without ``option()`` are not)."""
    return tuple(Option(f.name, f.default, **f.metadata[_OPTION]) for f in dataclasses.fields(cls)
                 if _OPTION in f.metadata)



def add_declared(group: argparse._ArgumentGroup | argparse.ArgumentParser, cls: type, *,
                 skip: Collection[str] = (), defaults: Mapping[str, Any] | None = None) -> None:
    """The flags of ``cls``'s declared options but ``skip``: each with its field as ``dest``; a switch's ``--no-``
    form sets it false. ``defaults``: a command's own default for some fields (``serve`` starts without a context
    shift, ``generate`` with one, as llama-server and llama-cli do)."""
    for opt in declared(cls):
        if opt.name in skip:
            continue
        arg = dict(opt.arg)
        if arg.get("action") is None and "metavar" not in arg:  # N for numbers, else the long flag's name
            number = arg.get("type") not in (None, str)
            arg["metavar"] = "N" if number else opt.flags[-1].lstrip("-").upper().replace("-", "_")
        default = opt.default if opt.flag_default is UNSET else opt.flag_default
        if defaults and opt.name in defaults:
            default = defaults[opt.name]
        group.add_argument(*opt.flags, dest=opt.name, default=default, help=opt.help, **arg)
        if opt.negative:
            group.add_argument(*opt.negative, dest=opt.name, action="store_false", help=opt.negative_help)


def declared_values(args: argparse.Namespace, cls: type, *, skip: Collection[str] = ()) -> dict[str, Any]:
    """The declared options' fields (but ``skip``) from the parsed flags, each checked and converted (ValueError:
    a usage error, with the option's message)."""
    return {opt.name: opt.value(getattr(args, opt.name)) for opt in declared(cls) if opt.name not in skip}
