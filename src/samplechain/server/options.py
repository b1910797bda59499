"""Server options declared once, as sampling parameters are (``param_specs``): a ``ServerConfig`` field made with
``option(...)`` carries its default, its command-line flags (and a ``--no-`` form for a switch), ``--help``, its
check and how a flag's value becomes the field's. ``samplechain serve`` builds its flags and reads them back from
these declarations (``cli/serve.py``), the server reads the field; adding an option is one declaration plus its use.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_OPTION = "samplechain.option"
UNSET: Any = object()  # ``flag_default`` not given: the flag's default is the field's


@dataclass(frozen=True)
class Option:
    """One declared option: the ``ServerConfig`` field ``name``, its flags and what the command line does with it.

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
    """A ``ServerConfig`` field with its declaration (a ``dataclasses.field`` carrying it as metadata)."""
    decl = dict(flags=tuple(flags), help=help, negative=tuple(negative), negative_help=negative_help,
                arg=tuple(arg.items()), check=check, convert=convert, flag_default=flag_default)
    return dataclasses.field(default=default, metadata={_OPTION: decl})


@functools.cache
def declared(cls: type) -> tuple[Option, ...]:
    """The declared options of a config class, in field order (fields made without ``option()`` are not)."""
    return tuple(Option(f.name, f.default, **f.metadata[_OPTION]) for f in dataclasses.fields(cls)
                 if _OPTION in f.metadata)

