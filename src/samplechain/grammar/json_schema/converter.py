"""The schema walker (the converter's ``visit`` in llama.cpp's common/json-schema-to-grammar.cpp): types,
enum/const, objects, arrays, strings and formats, allOf/anyOf and same-document ``$ref``s, with the entry points
``json_schema_to_gbnf`` and ``server_response_schema``."""

from __future__ import annotations

import json
import math
import re
import warnings
from typing import Any

from samplechain.grammar.json_schema.integers import integer_range
from samplechain.grammar.json_schema.pattern import PatternTranslator
from samplechain.grammar.json_schema.rules import (
    FORMATS,
    PRIMITIVES,
    RESERVED,
    SPACE_RULE,
    UnsupportedPattern,
    class_char,
    gbnf_literal,
    json_text,
    repetition,
)
from samplechain.grammar.parser import GrammarError

_INVALID_NAME = re.compile(r"[^a-zA-Z0-9-]+")
_KEYWORDS_NOT_SCHEMAS = {"title", "description", "$schema", "$id", "default", "examples", "$comment"}
MAX_INT_DIGITS = 16  # the integer-range construction allows at most 16 digits in a number (2**53 - 1 has 16)


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

    # --- schema nodes ----------------------------------------------------------------------------------------

    def visit(self, schema: Any, name: str) -> str:
        if not isinstance(schema, dict):
            raise GrammarError(f"schema must be an object, got {json_text(schema)[:80]}")
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
            return self.add_rule(rule_name, gbnf_literal(json_text(schema["const"])))
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise GrammarError("enum must be a non-empty array")
            return self.add_rule(rule_name, "(" + " | ".join(gbnf_literal(json_text(v)) for v in values) + ")")
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
            return self.add_rule(rule_name, f'"\\"" {repetition(char, lo, hi)} "\\""')
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
        widest = 10**MAX_INT_DIGITS - 1  # an open side's construction counts up to 15 digits from a 16-digit bound:
        if lo is not None and hi is None and abs(lo) > widest // 10:  # close it at the digit cap, which equals it
            hi = widest
        elif hi is not None and lo is None and abs(hi) > widest // 10:
            lo = -widest
        for v in (lo, hi):
            if v is not None and abs(v) > widest:  # JSON's safe integers (2**53 - 1, agents' tool schemas) are in
                raise GrammarError(f"integer bound {v} has more than {MAX_INT_DIGITS} digits (not supported)")
        if lo is not None and hi is not None and lo > hi:
            raise GrammarError(f"integer range is empty: minimum {lo} > maximum {hi}")
        return self.add_rule(rule_name, f"({integer_range(lo, hi)})")

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
        return self.add_rule(rule_name, '"[" space ' + repetition(item, lo, hi, '"," space') + ' space "]"')

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
            kv[key] = self.add_rule(f"{prefix}{key}-kv", f"{gbnf_literal(json_text(key))} space \":\" space {value}")
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
        """A JSON string that is none of ``strings`` (llama.cpp's trie construction and its quirk kept:
        a proper prefix of a declared property name is refused too)."""
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
                out.append(f"[{class_char(c)}]")
                child = node[c]
                if any(k is not None for k in child):
                    out.append(" (")
                    walk(child)
                    out.append(")")
                elif child.get(None):
                    out.append(f" {char}+")
            if children:
                out.append(' | [^"' + "".join(class_char(c) for c in children) + f"] {char}*")

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
                    lit = gbnf_literal(json_text(v))
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
            # llama.cpp bug fixed: components that are neither objects nor enums (e.g. string constraints) are
            # merged into one schema instead of producing an empty object
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for comp in comps:
                while isinstance(comp, dict) and "$ref" in comp:
                    comp = self.target(comp["$ref"])
                merged.update({k: v for k, v in comp.items() if k not in _KEYWORDS_NOT_SCHEMAS})
            return self.visit(merged, name)
        return self.add_rule(rule_name, self.object_rule(props, required, name, False))

    # --- regular expressions -------------------------------------------------------------------------------

    def pattern(self, pattern: str, rule_name: str) -> str:
        saved = dict(self.rules)
        try:
            if not (pattern.startswith("^") and pattern.endswith("$")) or len(pattern) < 2:
                raise UnsupportedPattern("the pattern must start with '^' and end with '$'")
            body = PatternTranslator(self, pattern[1:-1], rule_name).translate()
            return self.add_rule(rule_name, f'"\\"" ({body}) "\\""')
        except UnsupportedPattern as e:
            self.rules = saved
            warnings.warn(f"JSON schema pattern {pattern!r} not supported ({e}); accepting any string",
                          stacklevel=4)
            return self.add_rule(rule_name, self.add_primitive("string", PRIMITIVES["string"]))


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
    ``{}`` means any JSON *object* (``oaicompat_chat_params_parse`` in tools/server/server-common.cpp), while to
    the converter it is any value."""
    return {"type": "object"} if schema == {} else schema


def json_schema_to_gbnf(schema: Any, dotall: bool = False) -> str:
    """GBNF for JSON documents valid under ``schema`` (a dict, or JSON text); GrammarError when unsupported.

    A schema without type or keywords (``{}``) is any JSON value, as in llama.cpp's
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
    return _gbnf(conv.rules)


def _gbnf(rules: dict[str, str]) -> str:
    """Rules as llama.cpp prints them: sorted by name, one ``name ::= body`` a line."""
    return "".join(f"{name} ::= {body}\n" for name, body in sorted(rules.items(), key=lambda kv: kv[0].encode()))


class GrammarBuilder:
    """One grammar from several schemas and hand-written rules: llama.cpp's ``build_grammar`` with its
    ``common_grammar_builder`` (``add_rule``, ``add_schema``), which the chat formats' tool-call grammars use."""

    def __init__(self) -> None:
        self._conv = _Converter({})

    def add_rule(self, name: str, body: str) -> str:
        """Adds ``name ::= body`` (renamed ``name0``, ``name1``... if ``name`` holds another body); its name."""
        return self._conv.add_rule(name, body)

    def add_schema(self, name: str, schema: Any, refs_root: Any = None) -> str:
        """The rule for JSON valid under ``schema``, named after ``name`` (``"root"``: the grammar's root); its
        ``#/...`` references resolve in ``refs_root`` (default: ``schema``), as llama.cpp's ``resolve_refs``."""
        self._conv.root_schema = schema if refs_root is None else refs_root
        self._conv.ref_targets = {}
        try:
            return self._conv.visit(schema, "" if name == "root" else name)
        except RecursionError:
            raise GrammarError("JSON schema nested too deeply") from None

    @staticmethod
    def literal(text: str) -> str:
        """``text`` as a GBNF string literal."""
        return gbnf_literal(text)

    def text(self) -> str:
        """The grammar: every rule, as ``json_schema_to_gbnf`` prints them."""
        return _gbnf(self._conv.rules)
