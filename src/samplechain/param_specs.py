"""The declaration of a sampling parameter: one place for everything the parameter is.

Each field of ``SamplingParams`` is declared with :func:`param`: its default, how the Python API validates it,
how llama-server reads it from a request (its names in priority order and its rule: a soft clamp, a hard range,
or a parser of its own, as in llama-server's tools/server/server-schema.cpp) and its command-line flags
(llama.cpp's common/arg.cpp). The dataclass's validation, ``from_dict``, the ``generate``/``serve`` flags and the
server's request parsing all walk these declarations, so a new parameter is one declaration.

This module knows nothing of the parameters themselves (they live in ``params``), nor of the server.
"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from samplechain.validate import JSON_READERS, Check

Read = Callable[[Any, Any], Any]  # (JSON value, the server's default) -> the value; ValueError(detail)
FromArgs = Callable[[argparse.Namespace], Any]


# --- llama-server's rules ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JsonRule:
    """How a request's JSON value becomes the field's value.

    ``kind`` names llama-server's rule: ``plain`` (type only), ``soft`` (clamped into ``limits``), ``hard``
    (outside ``limits`` is an error) or ``custom``. ``strict`` replaces ``read`` in ``SamplingParams.from_dict``
    where the server is lenient (it skips malformed ``logit_bias`` entries; the Python API refuses them).
    """

    kind: str
    read: Read
    limits: tuple[float, float] | None = None
    strict: Read | None = None


def plain(kind: type) -> JsonRule:
    """A value of one JSON type (``int``, ``float``, ``bool``, ``str``), no range."""
    reader = JSON_READERS[kind]
    return JsonRule("plain", lambda value, default: reader(value))


def soft(lo: float, hi: float, kind: type = float) -> JsonRule:
    """A number clamped silently into ``[lo, hi]`` (NaN is left for the Python check to refuse)."""
    reader = JSON_READERS[kind]

    def read(value: object, default: object) -> Any:
        x = reader(value)
        return x if x != x else min(max(x, lo), hi)
    return JsonRule("soft", read, (lo, hi))


def _cpp(x: float, kind: type) -> str:
    """A number as C++'s ``std::to_string`` writes it (llama-server's range message): ``%d`` or ``%f``."""
    return f"{int(x)}" if kind is int else f"{float(x):f}"


def hard(lo: float, hi: float, kind: type = int) -> JsonRule:
    """A number that must lie in ``[lo, hi]``; the message is llama-server's, to the character."""
    reader = JSON_READERS[kind]

    def read(value: object, default: object) -> Any:
        x = reader(value)
        if not lo <= x <= hi:
            raise ValueError(f"Value must be between {_cpp(lo, kind)} <= value <= {_cpp(hi, kind)}, "
                             f"but got {_cpp(x, kind)}")
        return x
    return JsonRule("hard", read, (lo, hi))


def custom(read: Read, strict: Read | None = None) -> JsonRule:
    """A parser of the field's own: ``read(value, server_default)``."""
    return JsonRule("custom", read, strict=strict)


# --- command-line flags --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Flag:
    """One command-line option: ``add_argument(*names, **options)``.

    Without ``action`` and ``default``, the parameter's default is the flag's default. ``group`` is
    ``"sampling"`` or ``"constraints"`` (the grammar and JSON-schema flags, which ``generate`` lists apart).
    ``options["help"]`` is the flag's one-line meaning; ``--help`` adds the default (:func:`flag_help`), written
    as ``shown_default`` where the stored value does not read as what one types (the seed's -1).
    """

    names: tuple[str, ...]
    options: tuple[tuple[str, Any], ...] = ()
    group: str = "sampling"
    shown_default: str | None = None

    @property
    def dest(self) -> str:
        """The attribute argparse stores the value in."""
        given = dict(self.options).get("dest")
        if given is not None:
            return given
        name = next((n for n in self.names if n.startswith("--")), self.names[0])
        return name.lstrip("-").replace("-", "_")


def flag(*names: str, group: str = "sampling", shown_default: str | None = None, **options: Any) -> Flag:
    return Flag(tuple(names), tuple(options.items()), group, shown_default)


def cli_logit_bias(text: str) -> tuple[int, float]:
    """``-l TOKEN_ID(+/-)BIAS``, e.g. ``15043+1`` or ``2-inf``."""
    m = re.fullmatch(r"\s*(\d+)\s*([+-]\s*(?:inf|[0-9.eE+-]+))\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected TOKEN_ID(+/-)BIAS, e.g. 15043+1, got {text!r}")
    return int(m.group(1)), float(m.group(2).replace(" ", ""))


def unescape(text: str) -> str:
    """``\\n``, ``\\t``, ... processed, as llama.cpp's ``--escape`` does."""
    return codecs.decode(text.encode("utf-8", "backslashreplace"), "unicode_escape") if "\\" in text else text


def read_text_file(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read {what} {path}: {e.strerror}") from None


def at_least(dest: str, flag_name: str, minimum: int) -> FromArgs:
    """A flag's value, refused below ``minimum`` with the flag's name (llama.cpp's message for negative counts)."""
    def from_args(args: argparse.Namespace) -> int:
        value = getattr(args, dest)
        if value < minimum:
            raise ValueError(f"{flag_name} must be >= {minimum}, got {value}")
        return value
    return from_args


# --- the declaration -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    """Everything about one ``SamplingParams`` field; see the module docstring."""

    name: str
    default: Any
    check: Check
    json: JsonRule
    aliases: tuple[str, ...] = ()  # llama-server's other request names, tried after ``name``, in order
    server: bool = True  # llama-server reads it from requests (else only ``from_dict`` does)
    common_names: tuple[str, ...] = ()  # llama.cpp's common_params_sampling names, accepted by ``from_dict``
    cli: tuple[Flag, ...] = ()
    from_args: FromArgs | None = None  # the value from parsed flags (default: the single flag's value)
    doc: str = ""

    @property
    def request_names(self) -> tuple[str, ...]:
        """The names llama-server reads, in priority order (empty when it does not read the field)."""
        return (self.name, *self.aliases) if self.server else ()

    @property
    def dict_names(self) -> tuple[str, ...]:
        """The names ``SamplingParams.from_dict`` reads, in priority order."""
        return (self.name, *self.aliases, *self.common_names)

    def value_from_args(self, args: argparse.Namespace) -> Any:
        """The field's value from parsed command-line flags."""
        if self.from_args is not None:
            return self.from_args(args)
        if len(self.cli) != 1:
            raise TypeError(f"{self.name}: declare from_args to combine flags {[f.names for f in self.cli]}")
        return getattr(args, self.cli[0].dest)

    def read_json(self, value: object, default: object, *, strict: bool = False) -> Any:
        """A request value (not null) as the checked field value; ValueError with the detail."""
        read = self.json.strict if strict and self.json.strict is not None else self.json.read
        return self.check(self.name, read(value, default))


_DECLARATION = "samplechain.param"


def param(default: Any, *, check: Check, json: JsonRule, aliases: Sequence[str] = (), server: bool = True,
          common_names: Sequence[str] = (), cli: Sequence[Flag] = (), from_args: FromArgs | None = None,
          doc: str = "") -> Any:
    """A ``SamplingParams`` field with its declaration (a ``dataclasses.field`` carrying it as metadata)."""
    decl = dict(check=check, json=json, aliases=tuple(aliases), server=server, common_names=tuple(common_names),
                cli=tuple(cli), from_args=from_args, doc=doc)
    return dataclasses.field(default=default, metadata={_DECLARATION: decl})


@functools.cache
def declarations(cls: type) -> tuple[Param, ...]:
    """The declarations of a ``SamplingParams`` class (or subclass), in field order."""
    out = []
    for f in dataclasses.fields(cls):
        decl = f.metadata.get(_DECLARATION)
        if decl is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with param()")
        out.append(Param(f.name, f.default, **decl))
    return tuple(out)


def _shown(value: Any) -> str:
    """A default as ``--help`` writes it: floats as llama.cpp's ``%.2f``, lists joined with ``;``."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, (tuple, list)):
        return ";".join(map(str, value)) or "none"
    return "none" if value is None or value == "" else str(value)


def flag_help(p: Param, f: Flag) -> str | None:
    """The flag's ``--help`` line: its meaning from the declaration, then the default (a switch is marked
    ``(default)`` when it is on by default), so the help cannot drift from the declared values."""
    options = dict(f.options)
    meaning = options.get("help")
    if meaning == argparse.SUPPRESS:
        return meaning
    action = options.get("action")
    if action in ("store_true", "store_false"):
        on_by_default = options.get("default", action == "store_false") == (action == "store_true")
        return f"{meaning} (default)" if on_by_default and meaning else meaning
    if f.shown_default is not None:
        shown = f.shown_default
    else:
        value = options.get("default", p.default)
        shown = _shown(p.default if value is None else value)
    return f"{meaning} (default: {shown})" if meaning else f"default: {shown}"
