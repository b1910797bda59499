"""A request's limits and the errors that answer it: ``APIError`` (llama-server's error body), the limits table,
and the checks of a parsed body against it; apart from ``request.py`` so every reader can raise them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

MAX_BODY = 100 * 1024 * 1024  # cpp-httplib's default request body limit


class APIError(Exception):
    """An error answered as llama-server's body ``{"error": {"code", "message", "type"}}`` (+ ``extra`` fields)."""

    def __init__(self, code: int, message: str, kind: str = "invalid_request_error", **extra: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.kind, self.extra = code, message, kind, extra

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "type": self.kind, **self.extra}}


def bad_request(message: str) -> APIError:
    return APIError(400, message)


def context_error(what: str, n_ctx: int, **extra: Any) -> APIError:
    """llama-server's 400 for a request that cannot fit a slot's context (``what``: its size), naming the flag that
    sets it: a slot holds ``-c`` / ``-np`` tokens."""
    return APIError(400, f"request ({what}) exceeds the available context size ({n_ctx} tokens), try increasing it "
                    "(serve -c / --ctx-size; each of the -np slots holds -c / -np)", "exceed_context_size_error",
                    **extra, n_ctx=n_ctx)


# --- limits: a request's cost is bounded before its work starts (each breach is a 400 that names the limit) ------

MAX_JSON_DEPTH = 64  # nesting of the request body (llama-server's parser has no limit; Python's recursion has)
MAX_COMPLETIONS = 256  # prompts x n of one request
MAX_STOP = 16  # stop strings per request, each of at most MAX_STOP_CHARS characters
MAX_STOP_CHARS = 256
MAX_DRY_BREAKERS = 32  # each breaker costs a pass over the vocabulary (llama.cpp truncates each to 40 bytes too)
MAX_LOGIT_BIAS = 65536  # entries of logit_bias
MAX_SCHEMA_NODES = 4096  # values (objects, arrays, scalars) in a json_schema
MAX_ENUM = 1024  # values of one enum in a json_schema
MAX_GRAMMAR_CHARS = 65536  # a grammar, given or converted from a schema
COMPILE_BUDGET = 1.5  # seconds to compile a grammar and its first mask (grammar.time_budget)
MAX_TOKENIZE_CHARS = 1 << 20  # /tokenize's content (the tokenizer holds the GIL: ~1 s here)
MAX_TRIGGERS = 16  # grammar_triggers: their patterns are searched after every token
COUNT_LIMITS = {"dry_sequence_breakers": (MAX_DRY_BREAKERS, "breakers"), "logit_bias": (MAX_LOGIT_BIAS, "entries"),
                "grammar_triggers": (MAX_TRIGGERS, "triggers")}
MAX_FIELD_TEXT = 65536  # characters of text in each of TEXT_FIELDS
TEXT_FIELDS = ("logit_bias", "grammar_triggers", "preserved_tokens", "generation_prompt", "reasoning_budget_start_tag",
               "reasoning_budget_end_tags", "reasoning_budget_message", "dry_sequence_breakers", "samplers")
MAX_MESSAGES = 4096  # chat messages per request

def parse_error(message: str) -> APIError:
    return APIError(400, f"[json.exception.parse_error] {message}")


INT_RANGE = (-(2**63), 2**64 - 1)  # JSON integers a 64-bit reader takes (larger ones would overflow floats)


def _walk(value: Any) -> Iterator[tuple[Any, int]]:
    """Every value of a parsed JSON document with its depth (an object's keys at the object's), without
    recursion."""
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        v, depth = todo.pop()
        yield v, depth
        if isinstance(v, dict):
            todo += ((k, depth) for k in v)
            todo += ((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            todo += ((x, depth + 1) for x in v)


def check_json(value: Any) -> None:
    """Depth, text and number checks of a parsed body (one pass over its values)."""
    for v, depth in _walk(value):
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise parse_error(f"invalid string: a lone UTF-16 surrogate (U+{ord(v[e.start]):04X}) "
                                       "is not Unicode text") from None
        elif isinstance(v, int) and not INT_RANGE[0] <= v <= INT_RANGE[1]:
            raise parse_error(f"the number {str(v)[:32]}... is out of range")
        elif depth >= MAX_JSON_DEPTH and isinstance(v, (dict, list)):
            raise parse_error(f"the request body is nested more than {MAX_JSON_DEPTH} levels deep")


def text_chars(value: Any) -> int:
    """The characters of the strings in a JSON value (keys included)."""
    return sum(len(v) for v, _ in _walk(value) if isinstance(v, str))


def check_schema(schema: Any) -> None:
    """At most ``MAX_SCHEMA_NODES`` values and ``MAX_GRAMMAR_CHARS`` characters of text in a JSON schema, and
    ``MAX_ENUM`` values in any one ``enum`` (the grammar it converts to grows with each)."""
    chars = 0
    for n, (v, _) in enumerate(_walk(schema), 1):
        if n > MAX_SCHEMA_NODES:
            raise bad_request(f"Field 'json_schema': the schema has more than {MAX_SCHEMA_NODES} values "
                              "(limit MAX_SCHEMA_NODES)")
        if isinstance(v, str):
            chars += len(v)
            if chars > MAX_GRAMMAR_CHARS:
                raise bad_request(f"Field 'json_schema': the schema has more than {MAX_GRAMMAR_CHARS} characters "
                                  "of text (limit MAX_GRAMMAR_CHARS)")
        elif isinstance(v, dict):
            enum = v.get("enum")
            if isinstance(enum, list) and len(enum) > MAX_ENUM:
                raise bad_request(f"Field 'json_schema': an enum has {len(enum)} values, more than {MAX_ENUM} "
                                  "(limit MAX_ENUM)")
