"""The GBNF building blocks every part of the conversion uses: llama.cpp's primitive and format rules,
literals and repetitions (common/json-schema-to-grammar.cpp)."""

from __future__ import annotations

import json
from typing import Any

SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'
PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "boolean": ('("true" | "false")', ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "number": ('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
               ("integral-part", "decimal-part")),
    "integer": ('("-"? integral-part)', ("integral-part",)),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": ('"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"',
               ("string", "value")),
    "array": ('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": ('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
             '[0-9a-fA-F]{12} "\\""', ()),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": ('"\\"" char* "\\""', ("char",)),
    "null": ('"null"', ()),
}
FORMATS: dict[str, tuple[str, tuple[str, ...]]] = {
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )', ()),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) '
             '( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', ()),
    "date-time": ('date "T" time', ("date", "time")),
    "date-string": ('"\\"" date "\\""', ("date",)),
    "time-string": ('"\\"" time "\\""', ("time",)),
    "date-time-string": ('"\\"" date-time "\\""', ("date-time",)),
}
RESERVED = {"root", *PRIMITIVES, *FORMATS}


class UnsupportedPattern(Exception):
    """A regex feature the translation cannot express (llama.cpp: warn and fall back to a plain string)."""


def gbnf_literal(text: str) -> str:
    """A GBNF literal (llama.cpp escapes only CR, LF, quote and backslash)."""
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "\\r").replace("\n", "\\n")
    return f'"{out}"'


def class_char(c: str) -> str:
    """One code point inside ``[...]``."""
    if c.isascii() and (c.isalnum() or c in " !#$%&'()*+,./:;<=>?@_`{|}~"):
        return c
    cp = ord(c)
    return f"\\x{cp:02X}" if cp < 0x80 else (f"\\u{cp:04X}" if cp < 0x10000 else f"\\U{cp:08X}")


def json_text(value: Any) -> str:
    """``value`` as compact JSON text (no spaces, non-ASCII kept), as llama.cpp dumps consts, enums and keys."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def repetition(item: str, lo: int, hi: int | None, separator: str = "") -> str:
    """llama.cpp's build_repetition; ``hi`` None: unbounded."""
    if hi == 0:
        return ""
    if lo == 0 and hi == 1:
        return f"{item}?"
    if not separator:
        if lo == 1 and hi is None:
            return f"{item}+"
        if lo == 0 and hi is None:
            return f"{item}*"
        return f"{item}{{{lo},{'' if hi is None else hi}}}"
    rest = repetition(f"({separator} {item})", max(lo - 1, 0), None if hi is None else hi - 1)
    result = f"{item} {rest}"
    return f"({result})?" if lo == 0 else result
