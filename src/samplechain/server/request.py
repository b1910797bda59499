"""Request bodies -> engine tasks: the completion fields that are not sampling parameters, prompts, chat messages
(spec/server.md §3.4-3.6, §4, §8). Sampling fields are parsed by ``sampling_fields`` from their declarations."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from samplechain.grammar import GrammarError
from samplechain.grammar.engine import time_budget
from samplechain.grammar.json_schema import server_response_schema
from samplechain.params import CommonSampler, SamplingParams, tokenize_logit_bias
from samplechain.runtime.chat import starts_with_bos
from samplechain.runtime.generation import Model
from samplechain.server.sampling_fields import FieldError, parse_sampling_fields

INT32_MAX = 2**31 - 1
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


def _parse_error(message: str) -> APIError:
    return APIError(400, f"[json.exception.parse_error] {message}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:32]} is out of range")
    return value


INT_RANGE = (-(2**63), 2**64 - 1)  # JSON integers a 64-bit reader takes (larger ones would overflow floats)


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body: a JSON object of strict JSON (no NaN or Infinity, UTF-8 text without lone surrogates),
    nested at most ``MAX_JSON_DEPTH`` deep. Anything else is a 400 with llama-server's error body (llama-server
    answers malformed JSON with a 500)."""
    if len(raw) > MAX_BODY:
        raise APIError(413, "Payload Too Large")
    try:
        body = json.loads(raw or b"{}", parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise _parse_error(f"the request body is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise _parse_error(str(e)) from None
    check_json(body)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


async def read_json(req: Any) -> dict[str, Any]:
    """A request's JSON body (``json_object``), read up to ``MAX_BODY`` bytes whatever its Content-Length says
    (a chunked upload has none); a large one is parsed off the event loop."""
    chunks, size = [], 0
    async for chunk in req.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise APIError(413, "Payload Too Large")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if len(raw) < 1 << 16:
        return json_object(raw)
    if len(raw) >= LARGE_BODY:
        req.scope[LARGE_BODY_KEY] = True  # the Gate gives the memory back once the request is done
    return await asyncio.to_thread(json_object, raw)


LARGE_BODY = 1 << 20
LARGE_BODY_KEY = "samplechain.large_body"


def release_memory() -> None:
    """Give freed heap memory back to the system (glibc's ``malloc_trim``; nothing elsewhere): a request with a
    large body leaves its freed pages in the allocator's arenas, and the server's RSS would ratchet up."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None


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
                    raise _parse_error(f"invalid string: a lone UTF-16 surrogate (U+{ord(v[e.start]):04X}) "
                                       "is not Unicode text") from None
        elif isinstance(v, int) and not INT_RANGE[0] <= v <= INT_RANGE[1]:
            raise _parse_error(f"the number {str(v)[:32]}... is out of range")
        elif depth >= MAX_JSON_DEPTH and isinstance(v, (dict, list)):
            raise _parse_error(f"the request body is nested more than {MAX_JSON_DEPTH} levels deep")


def _text_chars(value: Any) -> int:
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


@dataclass
class Options:
    """A completion request's fields that are not sampling parameters."""

    n_predict: int = -1
    n_keep: int = 0
    n_discard: int = 0
    n_cmpl: int = 1
    n_indent: int = 0
    t_max_predict_ms: float = -1.0
    cache_prompt: bool = True
    id_slot: int = -1
    stream: bool = False
    include_usage: bool = False
    stop: tuple[str, ...] = ()
    return_tokens: bool = False
    return_progress: bool = False
    timings_per_token: bool = False
    response_fields: tuple[str, ...] = ()
    verbose: bool = False


@dataclass
class Defaults:
    """What a request gets for a field it leaves out or sets to null: the server's command line."""

    params: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1
    n_keep: int = 0
    stop: tuple[str, ...] = ()
    cache_prompt: bool = True


def _get(body: Mapping[str, Any], *names: str) -> tuple[str, Any]:
    """The first of ``names`` present and not null (llama-server tries aliases in order)."""
    for name in names:
        value = body.get(name)
        if value is not None:
            return name, value
    return names[0], None


def _int(body: Mapping[str, Any], names: Sequence[str], default: int, lo: int = -INT32_MAX - 1,
         hi: int = INT32_MAX) -> int:
    name, value = _get(body, *names)
    if value is None:
        return default
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise bad_request(f"Field '{name}': expected an integer, got {json.dumps(value)}")
    if not lo <= value <= hi:
        raise bad_request(f"Field '{name}': Value must be between {lo} <= value <= {hi}, but got {value}")
    return value


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"Field '{name}': expected true or false, got {json.dumps(value)}")
    return value


def parse_options(body: Mapping[str, Any], defaults: Defaults, n_slots: int) -> Options:
    """The non-sampling fields of spec/server.md §4 (absent or null = the server default)."""
    stop = defaults.stop
    if body.get("stop") is not None:
        raw = body["stop"]
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
            raise bad_request("Field 'stop': must be a string or an array of strings")
        if len(raw) > MAX_STOP:
            raise bad_request(f"Field 'stop': at most {MAX_STOP} stop strings, got {len(raw)}")
        for word in raw:
            if not word:
                raise bad_request("Field 'stop': a stop string must not be empty")
            if len(word) > MAX_STOP_CHARS:
                raise bad_request(f"Field 'stop': a stop string has at most {MAX_STOP_CHARS} characters, "
                                  f"got {len(word)}")
        stop = tuple(raw) or defaults.stop
    fields = body.get("response_fields")
    if fields is not None and (not isinstance(fields, list) or not all(isinstance(f, str) for f in fields)):
        raise bad_request("Field 'response_fields': must be an array of strings")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, Mapping):
        raise bad_request("Field 'stream_options': must be an object")
    t_max = body.get("t_max_predict_ms")
    if t_max is not None and (isinstance(t_max, bool) or not isinstance(t_max, (int, float))):
        raise bad_request("Field 't_max_predict_ms': must be a number")
    return Options(
        n_predict=_int(body, ("n_predict", "max_completion_tokens", "max_tokens"), defaults.n_predict, -1),
        n_keep=_int(body, ("n_keep",), defaults.n_keep, -1),
        n_discard=_int(body, ("n_discard",), 0, 0),
        n_cmpl=_int(body, ("n_cmpl", "n"), 1, 1, n_slots),
        n_indent=_int(body, ("n_indent",), 0, 0),
        t_max_predict_ms=-1.0 if t_max is None else float(t_max),
        cache_prompt=_bool(body, "cache_prompt", defaults.cache_prompt),
        id_slot=_int(body, ("id_slot",), -1),
        stream=_bool(body, "stream", False),
        include_usage=bool(stream_options and _bool(stream_options, "include_usage", False)),
        stop=stop,
        return_tokens=_bool(body, "return_tokens", False),
        return_progress=_bool(body, "return_progress", False),
        timings_per_token=_bool(body, "timings_per_token", False),
        response_fields=tuple(fields or ()),
        verbose=_bool(body, "verbose", False),
    )


def parse_sampling(body: Mapping[str, Any], defaults: Defaults, n_vocab: int | None = None) -> SamplingParams:
    """The sampling fields, with ``json_schema`` read as the server reads it (``{}`` = any object)."""
    if body.get("json_schema") is not None and body.get("grammar") is not None:
        raise bad_request("Cannot use both json_schema and grammar")
    if body.get("json_schema") is not None:
        check_schema(body["json_schema"])
        body = {**body, "json_schema": server_response_schema(body["json_schema"])}
    grammar = body.get("grammar")
    if isinstance(grammar, str) and len(grammar) > MAX_GRAMMAR_CHARS:
        raise bad_request(f"Field 'grammar': at most {MAX_GRAMMAR_CHARS} characters, got {len(grammar)} "
                          "(limit MAX_GRAMMAR_CHARS)")
    for name, (limit, what) in COUNT_LIMITS.items():
        value = body.get(name)
        if isinstance(value, (list, dict)) and len(value) > limit:
            raise bad_request(f"Field '{name}': at most {limit} {what}, got {len(value)}")
    for name in TEXT_FIELDS:  # texts each sampler tokenizes or matches
        n = _text_chars(body.get(name))
        if n > MAX_FIELD_TEXT:
            raise bad_request(f"Field '{name}': at most {MAX_FIELD_TEXT} characters of text, got {n}")
    try:
        params = parse_sampling_fields(body, defaults.params, n_vocab=n_vocab)
    except FieldError as e:
        raise bad_request(str(e)) from None
    except ValueError as e:
        raise bad_request(str(e)) from None
    return params


def samplers(params: Sequence[SamplingParams], model: Model) -> list[CommonSampler]:
    """A request's samplers, one per task (``params``, which differ only in their seeds), built off the engine
    thread: the grammar is compiled once, with its first mask, within ``COMPILE_BUDGET`` seconds, and every
    other task gets a clone (they share its mask cache). A sampler that cannot be built (a bad grammar or
    schema, a logit bias outside the vocabulary) is a 400 before the task starts, as llama-server fails at
    sampler init."""
    vocab, n_vocab = model.vocab, model.config.n_vocab
    if any(isinstance(token, str) for token, _ in params[0].logit_bias):  # tokenized once, not once per task
        bias = tuple(tokenize_logit_bias(params[0].logit_bias, vocab))
        params = [dataclasses.replace(p, logit_bias=bias) for p in params]
    try:
        with time_budget(COMPILE_BUDGET):
            first = CommonSampler(params[0], vocab, n_vocab=n_vocab)
            if first.grammar is not None:
                first.grammar.mask()
    except (GrammarError, ValueError, RecursionError) as e:
        raise bad_request(f"Failed to initialize samplers: {e}") from None
    grammar = first.grammar
    return [first, *(CommonSampler(p, vocab, n_vocab=n_vocab, grammar=None if grammar is None else grammar.clone())
                     for p in params[1:])]


def max_prompt_chars(model: Model, n_ctx: int) -> int:
    """More characters than this cannot fit in ``n_ctx`` tokens (a token's text has at most the longest piece's
    bytes; twice that for tokenizers that normalise): a longer prompt is refused before it is tokenized."""
    return 2 * max(model.vocab.max_piece_bytes, 1) * n_ctx


# --- prompts ---------------------------------------------------------------------------------------------------


def check_length(model: Model, n_chars: int, n_ctx: int | None) -> None:
    """A text of ``n_chars`` characters too long for ``n_ctx`` tokens is refused before it is tokenized
    (``max_prompt_chars``)."""
    if n_ctx is not None and n_chars > max_prompt_chars(model, n_ctx):
        raise APIError(400, f"request ({n_chars} characters) exceeds the available context size ({n_ctx} tokens), "
                       "try increasing it", "exceed_context_size_error", n_ctx=n_ctx)


def tokenize_mixed(model: Model, prompt: Any, add_special: bool = True, n_ctx: int | None = None) -> list[int]:
    """One prompt: a string, or an array of token ids and strings (each string tokenized, specials parsed).
    With ``n_ctx``, a prompt whose text cannot fit is refused before it is tokenized."""
    if isinstance(prompt, str):
        check_length(model, len(prompt), n_ctx)
        return model.tokenize(prompt, add_special=add_special and not starts_with_bos(model.vocab, prompt))
    if isinstance(prompt, list):
        check_length(model, sum(len(p) for p in prompt if isinstance(p, str)), n_ctx)
        out: list[int] = []
        for i, part in enumerate(prompt):
            if isinstance(part, bool):
                raise bad_request("prompt token ids must be integers")
            if isinstance(part, int):
                if not 0 <= part < model.config.n_vocab:
                    raise bad_request(f"prompt token id {part} is out of range [0, {model.config.n_vocab})")
                out.append(part)
            elif isinstance(part, str):
                out += model.tokenize(part, add_special=add_special and i == 0)
            else:
                raise bad_request("a prompt array holds token ids and strings")
        return out
    raise bad_request("\"prompt\" must be a string, an array of tokens, or an array of prompts")


def prompts(model: Model, body: Mapping[str, Any], n_ctx: int | None = None, n_each: int = 1) -> list[list[int]]:
    """The prompts of a native or legacy completion: one, or several (an array of strings / token arrays). At
    most ``MAX_COMPLETIONS`` tasks (prompts x ``n_each``), counted before anything is tokenized."""
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_request("\"prompt\" is required")
    if isinstance(prompt, Mapping):  # {"prompt_string": ..., "multimodal_data": ...}
        if prompt.get("multimodal_data"):
            raise bad_request("multimodal data is not supported by this model")
        prompt = prompt.get("prompt_string", "")
    several = isinstance(prompt, list) and prompt and (
        any(isinstance(p, (list, Mapping)) for p in prompt) or (all(isinstance(p, str) for p in prompt)
                                                                and len(prompt) > 1))
    parts = prompt if several else [prompt]
    if len(parts) * n_each > MAX_COMPLETIONS:
        raise bad_request(f"Field 'prompt': a request may start at most {MAX_COMPLETIONS} completions (prompts x n), "
                          f"got {len(parts)} x {n_each}")
    return [tokenize_mixed(model, p.get("prompt_string", "") if isinstance(p, Mapping) else p, n_ctx=n_ctx)
            for p in parts]


# --- chat ------------------------------------------------------------------------------------------------------


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or "type" not in part:
                raise bad_request("a content part must be an object with a type")
            if part["type"] != "text":
                raise bad_request(f"content parts of type {part['type']!r} need a multimodal model")
            if not isinstance(part.get("text"), str):
                raise bad_request("a text content part needs a string 'text'")
            parts.append(part["text"])
        return "\n".join(parts)
    raise bad_request("Expected 'content' to be a string or an array")


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    """Validated messages with string contents (llama-server's checks and messages)."""
    messages = body.get("messages")
    if messages is None:
        raise bad_request("'messages' is required")
    if not isinstance(messages, list):
        raise bad_request("Expected 'messages' to be an array")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"Field 'messages': at most {MAX_MESSAGES} messages, got {len(messages)}")
    out = []
    for m in messages:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise bad_request("each message must be an object with a string 'role'")
        role = "system" if m["role"] == "developer" else m["role"]
        if role != "assistant" and "content" not in m:
            raise bad_request("All non-assistant messages must contain 'content'")
        if role == "assistant" and m.get("content") is None and not m.get("tool_calls"):
            raise bad_request("Assistant message must contain either 'content' or 'tool_calls'!")
        out.append({"role": role, "content": _content_text(m.get("content"))})
    if len(out) >= 2 and out[-1]["role"] == "assistant" and out[-2]["role"] == "assistant":
        raise bad_request("Cannot have 2 or more assistant messages at the end of the list.")
    return out


def chat_prompt(model: Model, body: Mapping[str, Any], n_ctx: int | None = None) -> tuple[str, str]:
    """The rendered prompt and the generation prompt it ends with (the assistant header, or a prefilled message).
    With ``n_ctx``, messages whose text cannot fit are refused before the template renders them."""
    messages = chat_messages(body)
    check_length(model, sum(len(m["content"]) for m in messages), n_ctx)
    add_gen = body.get("add_generation_prompt", True)
    cont = body.get("continue_final_message", False)
    if not isinstance(add_gen, bool) or not isinstance(cont, bool):
        raise bad_request("add_generation_prompt and continue_final_message must be true or false")
    if add_gen and cont:
        raise bad_request("Cannot set both add_generation_prompt and continue_final_message to true.")
    if body.get("tools") and body.get("tool_choice", "auto") != "none":
        raise bad_request("tools are not supported by this server's chat formats yet")
    prefill = messages and messages[-1]["role"] == "assistant" and (add_gen or cont)
    if prefill:  # assistant prefill: continue the last message
        head = model.apply_chat_template(messages[:-1], add_generation_prompt=True)
        return head + messages[-1]["content"], messages[-1]["content"]
    if not messages:
        raise bad_request("'messages' must not be empty")
    text = model.apply_chat_template(messages, add_generation_prompt=add_gen)
    without = model.apply_chat_template(messages, add_generation_prompt=False)
    return text, text[len(without):] if text.startswith(without) else ""


def response_format(body: Mapping[str, Any]) -> dict[str, Any]:
    """``response_format`` as sampling fields (spec/server.md §3.6, §8.2)."""
    fmt = body.get("response_format")
    if fmt is None:
        return {}
    if not isinstance(fmt, Mapping):
        raise bad_request("response_format must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_schema": fmt.get("schema", {"type": "object"})}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, Mapping):
            raise bad_request("response_format.json_schema must be an object")
        return {"json_schema": spec.get("schema", {})}
    raise bad_request(f'response_format type must be one of "text" or "json_object", but got: {kind}')


def chat_logprobs(body: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI ``logprobs``/``top_logprobs`` as ``n_probs`` (20 when only ``logprobs: true``)."""
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if logprobs is None or logprobs is False:
        if top is not None:
            raise bad_request("top_logprobs requires logprobs to be set to true")
        return {}
    if not isinstance(logprobs, bool):
        raise bad_request("Field 'logprobs': must be true or false")
    if top is None:
        return {"n_probs": 20}
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
        raise bad_request("Field 'top_logprobs': must be an integer in [0, 20]")
    return {"n_probs": max(top, 1)}


def finite(x: float) -> float | None:
    """JSON has no inf/nan: they serialise as null (spec/server.md §2.3)."""
    return x if math.isfinite(x) else None
