"""JSON Schema -> GBNF with llama.cpp's output shape (spec/grammar §5), its bugs Q9/Q10 fixed.

The output lists rules sorted by name, one ``name ::= body`` per line, exactly as llama.cpp prints them, so
grammars from both are interchangeable. Structural schema errors and invalid regular expressions raise
:class:`GrammarError`; unsupported regex features fall back to a plain string with a warning (as llama.cpp).
"""

from __future__ import annotations

import json
import math
import re
import warnings
from typing import Any

from samplechain.grammar.parser import GrammarError

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
DOT = "[^\\x0A\\x0D]"
DOT_ALL = "[\\U00000000-\\U0010FFFF]"
_INVALID_NAME = re.compile(r"[^a-zA-Z0-9-]+")
_NON_LITERAL = set("|.()[]{}*+?")
_REGEX_ONLY_ESCAPES = set("^$.[]()|{}*+?")
_GBNF_ESCAPES = set('trn\\"[]-')
_KEYWORDS_NOT_SCHEMAS = {"title", "description", "$schema", "$id", "default", "examples", "$comment"}
MAX_INT_DIGITS = 15  # the integer-range construction allows at most 16 digits in a number
MAX_PATTERN_NESTING = 100


class _Unsupported(Exception):
    """A regex feature the translation cannot express (llama.cpp: warn and fall back to a plain string)."""


def _literal(text: str) -> str:
    """A GBNF literal (llama.cpp escapes only CR, LF, quote and backslash)."""
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "\\r").replace("\n", "\\n")
    return f'"{out}"'


def _class_char(c: str) -> str:
    """One code point inside ``[...]``."""
    if c.isascii() and (c.isalnum() or c in " !#$%&'()*+,./:;<=>?@_`{|}~"):
        return c
    cp = ord(c)
    return f"\\x{cp:02X}" if cp < 0x80 else (f"\\u{cp:04X}" if cp < 0x10000 else f"\\U{cp:08X}")


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _repetition(item: str, lo: int, hi: int | None, separator: str = "") -> str:
    """llama.cpp's build_repetition (spec §5.6); ``hi`` None: unbounded."""
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
    rest = _repetition(f"({separator} {item})", max(lo - 1, 0), None if hi is None else hi - 1)
    result = f"{item} {rest}"
    return f"({result})?" if lo == 0 else result


class _IntRange:
    """Digit-wise GBNF for canonical integers in [lo, hi] (spec §5.7), llama.cpp's shape.

    Fixed: a minimum whose remaining digits start with 0 (Q10, e.g. 1005) keeps those zeros, and below the
    top level a remaining minimum that starts with 1 still admits longer numbers starting with 0.
    """

    def __init__(self) -> None:
        self.out: list[str] = []

    def digit_range(self, a: str, b: str) -> None:
        self.out.append(f"[{a}]" if a == b else f"[{a}-{b}]")

    def more_digits(self, lo: int, hi: int | None) -> None:
        self.out.append("[0-9]")
        if lo == hi == 1:
            return
        self.out.append(f"{{{lo}")
        if hi != lo:
            self.out.append(",")
            if hi is not None:
                self.out.append(str(hi))
        self.out.append("}")

    def uniform(self, a: str, b: str) -> None:
        out = self.out
        i = 0
        while i < len(a) and a[i] == b[i]:
            i += 1
        if i > 0:
            out.append(f'"{a[:i]}"')
        if i >= len(a):
            return
        if i > 0:
            out.append(" ")
        k = len(a) - i - 1
        if k == 0:
            out.append(f"[{a[i]}-{b[i]}]")
            return
        a_rest, b_rest = a[i + 1 :], b[i + 1 :]
        zeros, nines = "0" * k, "9" * k
        reached = False
        out.append("(")
        if a_rest == zeros:
            self.digit_range(a[i], chr(ord(b[i]) - 1))
            out.append(" ")
            self.more_digits(k, k)
        else:
            out.append(f"[{a[i]}] (")
            self.uniform(a_rest, nines)
            out.append(")")
            if ord(a[i]) < ord(b[i]) - 1:
                out.append(" | ")
                if b_rest == nines:
                    self.digit_range(chr(ord(a[i]) + 1), b[i])
                    reached = True
                else:
                    self.digit_range(chr(ord(a[i]) + 1), chr(ord(b[i]) - 1))
                out.append(" ")
                self.more_digits(k, k)
        if not reached:
            out.append(" | ")
            self.digit_range(b[i], b[i])
            out.append(" ")
            self.uniform(zeros, b_rest)
        out.append(")")

    def both(self, lo: int, hi: int) -> None:
        out = self.out
        if lo < 0 and hi < 0:
            out.append('"-" (')
            self.both(-hi, -lo)
            out.append(")")
            return
        if lo < 0:
            out.append('"-" (')
            self.both(0, -lo)
            out.append(") | ")
            lo = 0
        lo_s, hi_s = str(lo), str(hi)
        for digits in range(len(lo_s), len(hi_s)):
            self.uniform(lo_s, "9" * digits)
            lo_s = "1" + "0" * digits
            out.append(" | ")
        self.uniform(lo_s, hi_s)

    def minimum(self, digits: str, decimals_left: int, top_level: bool) -> None:
        """Numbers >= ``digits``; below the top level, ``digits`` is the rest after a fixed first digit and
        may start with zeros: a rest of the same length must be >= it, a longer one is always larger."""
        out = self.out
        less = max(decimals_left - 1, 1)
        if digits.startswith("-"):
            out.append('"-" (')
            self.maximum(int(digits[1:]), decimals_left, top_level=False)
            out.append(") | [0] | [1-9] ")
            self.more_digits(0, decimals_left - 1)
            return
        if int(digits) == 0:
            if top_level:
                out.append("[0] | [1-9] ")
                self.more_digits(0, less)
            else:
                self.more_digits(len(digits), decimals_left)
            return
        start = "1" if top_level else "0"
        c = digits[0]
        if len(digits) == 1:
            if c > start:
                self.digit_range(start, chr(ord(c) - 1))
                out.append(" ")
                self.more_digits(1, less)
                out.append(" | ")
            self.digit_range(c, "9")
            out.append(" ")
            self.more_digits(0, less)
            return
        if c > start:
            self.digit_range(start, chr(ord(c) - 1))
            out.append(" ")
            self.more_digits(len(digits), less)
            out.append(" | ")
        self.digit_range(c, c)
        out.append(" (")
        self.minimum(digits[1:], less, top_level=False)
        out.append(")")
        if c < "9":
            out.append(" | ")
            self.digit_range(chr(ord(c) + 1), "9")
            out.append(" ")
            self.more_digits(len(digits) - 1, less)

    def maximum(self, hi: int, decimals_left: int, top_level: bool) -> None:
        out = self.out
        if hi >= 0:
            if top_level:
                out.append('"-" [1-9] ')
                self.more_digits(0, max(decimals_left - 1, 1))
                out.append(" | ")
            self.both(0, hi)
        else:
            out.append('"-" (')
            self.minimum(str(-hi), decimals_left, top_level=False)
            out.append(")")


def _integer_range(lo: int | None, hi: int | None) -> str:
    r = _IntRange()
    if lo is not None and hi is not None:
        r.both(lo, hi)
    elif lo is not None:
        r.minimum(str(lo), 16, top_level=True)
    else:
        r.maximum(hi, 16, top_level=True)
    return "".join(r.out)


class _Converter:
    def __init__(self, root_schema: Any, dotall: bool = False) -> None:
        self.root_schema = root_schema
        self.dotall = dotall
        self.rules: dict[str, str] = {"space": SPACE_RULE}
        self.refs_resolving: set[str] = set()
        self.ref_targets: dict[str, Any] = {}

    # --- rules ----------------------------------------------------------------------------------------------

    def add_rule(self, name: str, body: str) -> str:
        name = _INVALID_NAME.sub("-", name)
        if self.rules.get(name, body) == body:
            self.rules[name] = body
            return name
        i = 0
        while self.rules.get(f"{name}{i}", body) != body:
            i += 1
        self.rules[f"{name}{i}"] = body
        return f"{name}{i}"

    def add_primitive(self, name: str, rule: tuple[str, tuple[str, ...]]) -> str:
        out = self.add_rule(name, rule[0])
        for dep in rule[1]:
            if dep not in self.rules:
                self.add_primitive(dep, PRIMITIVES.get(dep) or FORMATS[dep])
        return out

    def primitive(self, rule_name: str, kind: str) -> str:
        return self.add_primitive("root" if rule_name == "root" else kind, PRIMITIVES[kind])

    # --- references -----------------------------------------------------------------------------------------

    def target(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#/"):
            if isinstance(ref, str) and ref == "#":
                return self.root_schema
            raise GrammarError(f"unsupported $ref {ref!r}: only references into the same document (#/...) are "
                               "supported")
        if ref not in self.ref_targets:
            node = self.root_schema
            for step in ref[2:].split("/"):
                if isinstance(node, dict) and step in node:
                    node = node[step]
                elif isinstance(node, list) and step.isdigit() and int(step) < len(node):
                    node = node[int(step)]
                else:
                    raise GrammarError(f"Unresolved $ref {ref!r}")
            self.ref_targets[ref] = node
        return self.ref_targets[ref]

    def resolve_ref(self, ref: str) -> str:
        target = self.target(ref)
        name = "ref" + _INVALID_NAME.sub("-", ref[ref.find("#") + 1 :])
        if name not in self.rules and ref not in self.refs_resolving:
            self.refs_resolving.add(ref)
            name = self.visit(target, name)
            self.refs_resolving.discard(ref)
        return name

    # --- schema nodes (spec §5.2) ----------------------------------------------------------------------------

    def visit(self, schema: Any, name: str) -> str:
        if not isinstance(schema, dict):
            raise GrammarError(f"schema must be an object, got {_json_text(schema)[:80]}")
        rule_name = name + "-" if name in RESERVED else (name or "root")
        if "$ref" in schema:
            return self.add_rule(rule_name, self.resolve_ref(schema["$ref"]))
        if "oneOf" in schema or "anyOf" in schema:
            alts = schema["oneOf"] if "oneOf" in schema else schema["anyOf"]
            if not isinstance(alts, list) or not alts:
                raise GrammarError(f"{'oneOf' if 'oneOf' in schema else 'anyOf'} must be a non-empty array")
            return self.add_rule(rule_name, self.union(name, alts))
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind:
                raise GrammarError("type must not be an empty array")
            return self.add_rule(rule_name, self.union(name, [{**schema, "type": t} for t in kind]))
        if "const" in schema:
            return self.add_rule(rule_name, _literal(_json_text(schema["const"])))
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise GrammarError("enum must be a non-empty array")
            return self.add_rule(rule_name, "(" + " | ".join(_literal(_json_text(v)) for v in values) + ")")
        if kind is not None and not isinstance(kind, str):
            raise GrammarError("type must be a string or an array of strings")
        has_properties = "properties" in schema or (
            "additionalProperties" in schema and schema["additionalProperties"] is not True)
        if kind is None:
            if has_properties:
                kind = "object"
            elif "allOf" in schema:
                return self.all_of(schema, name, rule_name)
            elif "items" in schema or "prefixItems" in schema:
                kind = "array"
            elif any(k in schema for k in ("pattern", "minLength", "maxLength")) or self.known_format(schema):
                kind = "string"
            else:
                return self.add_rule(rule_name, self.add_primitive("value", PRIMITIVES["value"]))
        if kind == "object":
            if not has_properties and "allOf" in schema:
                return self.all_of(schema, name, rule_name)
            return self.object(schema, name, rule_name)
        if kind == "string":
            if "allOf" in schema:
                return self.all_of(schema, name, rule_name)
            return self.string(schema, rule_name)
        if kind == "array":
            return self.array(schema, name, rule_name)
        if kind == "integer":
            return self.integer(schema, rule_name)
        if kind in ("number", "boolean", "null"):
            return self.primitive(rule_name, kind)
        raise GrammarError(f"unrecognized type {kind!r}")

    def union(self, name: str, alts: list) -> str:
        return " | ".join(self.visit(s, f"{name}{'-' if name else 'alternative-'}{i}") for i, s in enumerate(alts))

    @staticmethod
    def known_format(schema: dict) -> bool:
        fmt = schema.get("format")
        return isinstance(fmt, str) and (re.fullmatch("uuid[1-5]?", fmt) is not None or fmt in FORMATS)

    def string(self, schema: dict, rule_name: str) -> str:
        for key in ("pattern", "format"):
            if key in schema and not isinstance(schema[key], str):
                raise GrammarError(f"{key} must be a string")
        lo = _non_negative(schema, "minLength", 0)
        hi = _non_negative(schema, "maxLength", None)
        if "pattern" in schema:
            return self.pattern(schema["pattern"], rule_name)
        fmt = schema.get("format", "")
        if re.fullmatch("uuid[1-5]?", fmt):
            return self.add_primitive("root" if rule_name == "root" else "uuid", PRIMITIVES["uuid"])
        if fmt in FORMATS:
            return self.add_rule(rule_name, self.add_primitive(f"{fmt}-string", FORMATS[f"{fmt}-string"]))
        if lo > 0 or hi is not None:
            char = self.add_primitive("char", PRIMITIVES["char"])
            return self.add_rule(rule_name, f'"\\"" {_repetition(char, lo, hi)} "\\""')
        return self.primitive(rule_name, "string")

    def integer(self, schema: dict, rule_name: str) -> str:
        def bound(key: str) -> float | None:
            v = schema.get(key)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise GrammarError(f"{key} must be a finite number, got {v!r}")
            return v

        lo = hi = None
        if (v := bound("minimum")) is not None:
            lo = math.ceil(v)
        elif (v := bound("exclusiveMinimum")) is not None:
            lo = math.floor(v) + 1
        if (v := bound("maximum")) is not None:
            hi = math.floor(v)
        elif (v := bound("exclusiveMaximum")) is not None:
            hi = math.ceil(v) - 1
        if lo is None and hi is None:
            return self.primitive(rule_name, "integer")
        for v in (lo, hi):
            if v is not None and abs(v) >= 10**MAX_INT_DIGITS:
                raise GrammarError(f"integer bound {v} has more than {MAX_INT_DIGITS} digits (not supported)")
        if lo is not None and hi is not None and lo > hi:
            raise GrammarError(f"integer range is empty: minimum {lo} > maximum {hi}")
        return self.add_rule(rule_name, f"({_integer_range(lo, hi)})")

    def array(self, schema: dict, name: str, rule_name: str) -> str:
        items = schema["items"] if "items" in schema else schema.get("prefixItems")
        if isinstance(items, list):
            parts = [self.visit(s, f"{name}{'-' if name else ''}tuple-{i}") for i, s in enumerate(items)]
            return self.add_rule(rule_name, '"[" space ' + ' "," space '.join(parts) + ' space "]"')
        lo = _non_negative(schema, "minItems", 0)
        hi = _non_negative(schema, "maxItems", None)
        if items is None or (isinstance(items, dict) and _is_any(items)):
            if lo == 0 and hi is None:
                return self.primitive(rule_name, "array")
            item = self.add_primitive("value", PRIMITIVES["value"])
        else:
            item = self.visit(items, f"{name}{'-' if name else ''}item")
        return self.add_rule(rule_name, '"[" space ' + _repetition(item, lo, hi, '"," space') + ' space "]"')

    def object(self, schema: dict, name: str, rule_name: str) -> str:
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise GrammarError("properties must be an object")
        required = schema.get("required", [])
        if not isinstance(required, list):
            raise GrammarError("required must be an array")
        required = {r for r in required if isinstance(r, str)}
        if "additionalProperties" in schema:
            extra = schema["additionalProperties"]
            if not isinstance(extra, (bool, dict)):
                raise GrammarError("additionalProperties must be a boolean or a schema")
        else:
            extra = not props  # llama.cpp: with declared properties, no others unless asked for
        if not props and (extra is True or (isinstance(extra, dict) and _is_any(extra))):
            return self.add_rule(rule_name, self.add_primitive("object", PRIMITIVES["object"]))
        return self.add_rule(rule_name, self.object_rule(list(props.items()), required, name, extra))

    def object_rule(self, props: list[tuple[str, Any]], required: set[str], name: str, extra: Any) -> str:
        prefix = f"{name}-" if name else ""
        kv: dict[str, str] = {}
        req: list[str] = []
        opt: list[str] = []
        for key, sub in props:
            value = self.visit(sub, prefix + key)
            kv[key] = self.add_rule(f"{prefix}{key}-kv", f"{_literal(_json_text(key))} space \":\" space {value}")
            (req if key in required else opt).append(key)
        if extra is True or isinstance(extra, dict):
            sub_name = f"{prefix}additional"
            value = (self.visit(extra, f"{sub_name}-value") if isinstance(extra, dict) and not _is_any(extra)
                     else self.add_primitive("value", PRIMITIVES["value"]))
            key_rule = (self.add_primitive("string", PRIMITIVES["string"]) if not props
                        else self.add_rule(f"{sub_name}-k", self.not_strings([k for k, _ in props])))
            kv["*"] = self.add_rule(f"{sub_name}-kv", f'{key_rule} ":" space {value}')
            opt.append("*")
        rule = '"{" space ' + ' "," space '.join(kv[k] for k in req)
        if opt:
            rule += " ("
            if req:
                rule += ' "," space ( '

            def chain(keys: list[str], first_optional: bool) -> str:
                k = keys[0]
                comma = f'( "," space {kv[k]} )'
                if first_optional:
                    res = comma + ("*" if k == "*" else "?")
                else:
                    res = kv[k] + (f" {comma}*" if k == "*" else "")
                if len(keys) > 1:
                    res += " " + self.add_rule(f"{prefix}{k}-rest", chain(keys[1:], True))
                return res

            rule += " | ".join(chain(opt[i:], False) for i in range(len(opt)))
            if req:
                rule += " )"
            rule += " )?"
        return rule + ' space "}"'

    def not_strings(self, strings: list[str]) -> str:
        """A JSON string that is none of ``strings`` (llama.cpp's trie construction, quirk Q7 kept)."""
        trie: dict = {}
        for s in strings:
            node = trie
            for c in s:
                node = node.setdefault(c, {})
            node[None] = True
        char = self.add_primitive("char", PRIMITIVES["char"])
        out = ['["] ( ']

        def walk(node: dict) -> None:
            children = sorted((c for c in node if c is not None), key=ord)
            for i, c in enumerate(children):
                if i:
                    out.append(" | ")
                out.append(f"[{_class_char(c)}]")
                child = node[c]
                if any(k is not None for k in child):
                    out.append(" (")
                    walk(child)
                    out.append(")")
                elif child.get(None):
                    out.append(f" {char}+")
            if children:
                out.append(' | [^"' + "".join(_class_char(c) for c in children) + f"] {char}*")

        walk(trie)
        out.append(" )")
        if not trie.get(None):
            out.append("?")
        out.append(' ["]')
        return "".join(out)

    def all_of(self, schema: dict, name: str, rule_name: str) -> str:
        comps = schema["allOf"]
        if not isinstance(comps, list) or not comps:
            raise GrammarError("allOf must be a non-empty array")
        props: list[tuple[str, Any]] = []
        required: set[str] = set()
        enums: dict[str, int] = {}

        def add(comp: Any, is_required: bool) -> None:
            while isinstance(comp, dict) and "$ref" in comp:
                comp = self.target(comp["$ref"])
            if not isinstance(comp, dict):
                raise GrammarError("allOf components must be schemas")
            if "properties" in comp:
                for key, sub in comp["properties"].items():
                    props.append((key, sub))
                    if is_required:
                        required.add(key)
            elif "enum" in comp:
                for v in comp["enum"]:
                    lit = _literal(_json_text(v))
                    enums[lit] = enums.get(lit, 0) + 1

        for comp in comps:
            if isinstance(comp, dict) and "anyOf" in comp:
                for alt in comp["anyOf"]:
                    add(alt, False)
            else:
                add(comp, True)
        if enums:
            common = sorted(lit for lit, n in enums.items() if n == len(comps))
            if common:
                return self.add_rule(rule_name, "(" + " | ".join(common) + ")")
        if not props and not enums:
            # Q9 fixed: components that are neither objects nor enums (e.g. string constraints) are merged into
            # one schema instead of producing an empty object
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for comp in comps:
                while isinstance(comp, dict) and "$ref" in comp:
                    comp = self.target(comp["$ref"])
                merged.update({k: v for k, v in comp.items() if k not in _KEYWORDS_NOT_SCHEMAS})
            return self.visit(merged, name)
        return self.add_rule(rule_name, self.object_rule(props, required, name, False))

    # --- regular expressions (spec §5.8) ---------------------------------------------------------------------

    def pattern(self, pattern: str, rule_name: str) -> str:
        saved = dict(self.rules)
        try:
            if not (pattern.startswith("^") and pattern.endswith("$")) or len(pattern) < 2:
                raise _Unsupported("the pattern must start with '^' and end with '$'")
            body = _PatternTranslator(self, pattern[1:-1], rule_name).translate()
            return self.add_rule(rule_name, f'"\\"" ({body}) "\\""')
        except _Unsupported as e:
            self.rules = saved
            warnings.warn(f"JSON schema pattern {pattern!r} not supported ({e}); accepting any string",
                          stacklevel=4)
            return self.add_rule(rule_name, self.add_primitive("string", PRIMITIVES["string"]))


class _PatternTranslator:
    """A regular expression (between its anchors) -> a GBNF expression."""

    def __init__(self, conv: _Converter, pattern: str, rule_name: str) -> None:
        self.conv = conv
        self.p = pattern
        self.i = 0
        self.name = rule_name
        self.sub_rules: dict[str, str] = {}

    def translate(self) -> str:
        text, is_lit = self.sequence(0)
        if self.i < len(self.p):  # a ')' closed a group that was never opened
            raise GrammarError(f"JSON schema conversion failed: unbalanced parentheses in pattern /{self.p}/")
        return f'"{text}"' if is_lit else text

    def dot(self) -> str:
        return self.conv.add_rule("dot", DOT_ALL if self.conv.dotall else DOT)

    def sequence(self, depth: int) -> tuple[str, bool]:
        if depth > MAX_PATTERN_NESTING:
            raise _Unsupported(f"groups nested deeper than {MAX_PATTERN_NESTING}")
        p, n = self.p, len(self.p)
        seq: list[tuple[str, bool]] = []
        while self.i < n:
            c = p[self.i]
            if c == ".":
                seq.append((self.dot(), False))
                self.i += 1
            elif c == "(":
                self.i += 1
                if p.startswith("?", self.i):
                    if not p.startswith("?:", self.i):
                        raise _Unsupported("lookaround, named groups and flags")
                    self.i += 2
                inner = self.sequence(depth + 1)
                if self.i >= n or p[self.i] != ")":
                    raise GrammarError(f"JSON schema conversion failed: unbalanced parentheses in pattern /{p}/")
                self.i += 1
                seq.append((f"({_to_rule(inner)})", False))
            elif c == ")":
                if depth == 0:
                    raise GrammarError(f"JSON schema conversion failed: unbalanced parentheses in pattern /{p}/")
                return _join(seq)
            elif c == "[":
                seq.append((self.char_class(), False))
            elif c == "|":
                seq.append(("|", False))
                self.i += 1
            elif c in "*+?":
                self.need_operand(seq, c)
                seq[-1] = (_to_rule(seq[-1]) + c, False)
                self.i += 1
            elif c == "{":
                self.need_operand(seq, c)
                seq[-1] = (self.braces(seq[-1]), False)
            elif c in "]}":
                raise _Unsupported(f"stray '{c}'")
            elif c in "^$":
                raise _Unsupported(f"'{c}' inside the pattern")
            else:
                seq.append((self.literal(), True))
        return _join(seq)

    def need_operand(self, seq: list[tuple[str, bool]], c: str) -> None:
        if not seq or seq[-1] == ("|", False):
            raise GrammarError(f"JSON schema conversion failed: quantifier '{c}' with nothing before it in "
                               f"pattern /{self.p}/")

    def hex_escape(self) -> str:
        """``\\xHH``, ``\\uHHHH`` or ``\\UHHHHHHHH`` at the cursor, kept as written (GBNF reads them too)."""
        e = self.p[self.i + 1]
        width = {"x": 2, "u": 4, "U": 8}[e]
        digits = self.p[self.i + 2 : self.i + 2 + width]
        if len(digits) < width or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise _Unsupported(f"escape \\{e} without {width} hex digits")
        self.i += 2 + width
        return "\\" + e + digits

    def char_class(self) -> str:
        p, n = self.p, len(self.p)
        out = "["
        self.i += 1
        while self.i < n and p[self.i] != "]":
            if p[self.i] == "\\":
                if self.i + 1 >= n:
                    break
                e = p[self.i + 1]
                if e in "xuU":
                    out += self.hex_escape()
                    continue
                if e not in _GBNF_ESCAPES:
                    raise _Unsupported(f"escape \\{e} inside a character class")
                out += p[self.i : self.i + 2]
                self.i += 2
            else:
                out += p[self.i]
                self.i += 1
        if self.i >= n:
            raise GrammarError(f"JSON schema conversion failed: unterminated '[' in pattern /{p}/")
        self.i += 1
        return out + "]"

    def braces(self, last: tuple[str, bool]) -> str:
        p = self.p
        end = p.find("}", self.i)
        if end < 0:
            raise _Unsupported("unterminated '{'")
        nums = [s.strip() for s in p[self.i + 1 : end].split(",")]
        self.i = end + 1
        if len(nums) > 2 or not all(s.isdigit() or (s == "" and k > 0) or (s == "" and len(nums) == 2)
                                    for k, s in enumerate(nums)):
            raise _Unsupported(f"quantifier {{{','.join(nums)}}}")
        if len(nums) == 1:
            lo = hi = int(nums[0])
        else:
            lo = int(nums[0]) if nums[0] else 0
            hi = int(nums[1]) if nums[1] else None
        if hi is not None and hi < lo:
            raise GrammarError(f"JSON schema conversion failed: quantifier {{{lo},{hi}}} in pattern /{p}/")
        sub, is_lit = last
        if not is_lit:
            rule = self.sub_rules.get(sub)
            if rule is None:
                rule = self.conv.add_rule(f"{self.name}-{len(self.sub_rules) + 1}", sub)
                self.sub_rules[sub] = rule
            sub = rule
        return _repetition(f'"{sub}"' if is_lit else sub, lo, hi)

    def literal(self) -> str:
        p, n = self.p, len(self.p)
        out = ""
        while self.i < n:
            c = p[self.i]
            if c == "\\":
                if self.i + 1 >= n:
                    raise GrammarError(f"JSON schema conversion failed: trailing backslash in pattern /{p}/")
                e = p[self.i + 1]
                if e in _REGEX_ONLY_ESCAPES:
                    out += e
                    self.i += 2
                elif e in _GBNF_ESCAPES:
                    out += p[self.i : self.i + 2]
                    self.i += 2
                elif e in "xuU":
                    out += self.hex_escape()
                else:
                    raise _Unsupported(f"escape \\{e}")
            elif c == '"':
                out += '\\"'
                self.i += 1
            elif c not in _NON_LITERAL and c not in "^$" and (
                self.i == n - 1 or out == "" or p[self.i + 1] == "." or p[self.i + 1] not in _NON_LITERAL
            ):
                out += c
                self.i += 1
            else:
                break
        if not out:
            raise _Unsupported(f"'{p[self.i]}'")
        return out


def _to_rule(item: tuple[str, bool]) -> str:
    text, is_lit = item
    return f'"{text}"' if is_lit else text


def _join(seq: list[tuple[str, bool]]) -> tuple[str, bool]:
    """Merge adjacent literals; a single literal stays a literal."""
    merged: list[tuple[str, bool]] = []
    for text, is_lit in seq:
        if is_lit and merged and merged[-1][1]:
            merged[-1] = (merged[-1][0] + text, True)
        else:
            merged.append((text, is_lit))
    if len(merged) == 1 and merged[0][1]:
        return merged[0]
    return " ".join(_to_rule(x) for x in merged), False


def _is_any(schema: dict) -> bool:
    return not any(k not in _KEYWORDS_NOT_SCHEMAS and k not in ("definitions", "$defs") for k in schema)


def _non_negative(schema: dict, key: str, default: int | None) -> int | None:
    v = schema.get(key, default)
    if v is default:
        return v
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise GrammarError(f"{key} must be a non-negative integer, got {v!r}")
    return v


def server_response_schema(schema: Any) -> Any:
    """The schema llama-server converts for a request's ``json_schema`` / ``response_format``: there an empty
    ``{}`` means any JSON *object* (spec/grammar §4.3, spec/server), while to the converter it is any value."""
    return {"type": "object"} if schema == {} else schema


def json_schema_to_gbnf(schema: Any, dotall: bool = False) -> str:
    """GBNF for JSON documents valid under ``schema`` (a dict, or JSON text); GrammarError when unsupported.

    A schema without type or keywords (``{}``) is any JSON value (spec/grammar §5.2 step 8), as in llama.cpp's
    converter and ``--json-schema``; the server's reading of ``{}`` is :func:`server_response_schema`.
    """
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"JSON schema is not valid JSON: {e}") from None
    conv = _Converter(schema, dotall)
    try:
        conv.visit(schema, "")
    except RecursionError:
        raise GrammarError("JSON schema nested too deeply") from None
    return "".join(f"{name} ::= {body}\n" for name, body in sorted(conv.rules.items(), key=lambda kv: kv[0].encode()))
