"""Request bodies -> engine tasks: the body read as JSON, the completion fields that are not sampling parameters,
the samplers (llama-server's: tools/server/server-schema.cpp for the fields, ``oaicompat_chat_params_parse`` in
tools/server/server-common.cpp for OpenAI's bodies). Sampling fields are parsed by ``sampling_fields`` from their
declarations; the limits and errors are in ``limits.py``, prompts and chat messages in ``prompts.py``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from samplechain.grammar import GrammarError
from samplechain.grammar.engine import time_budget
from samplechain.grammar.json_schema import server_response_schema
from samplechain.params import CommonSampler, SamplingParams, tokenize_logit_bias
from samplechain.runtime.decoding import Rules
from samplechain.runtime.generation import Model
from samplechain.server import limits
from samplechain.server.config import Defaults
from samplechain.server.limits import (
    COUNT_LIMITS,
    MAX_FIELD_TEXT,
    MAX_GRAMMAR_CHARS,
    MAX_JSON_DEPTH,
    MAX_STOP,
    MAX_STOP_CHARS,
    TEXT_FIELDS,
    APIError,
    bad_request,
    check_json,
    check_schema,
    parse_error,
    text_chars,
)
from samplechain.server.sampling_fields import FieldError, parse_sampling_fields
from samplechain.validate import INT32_MAX, body_bool, body_int


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:32]} is out of range")
    return value


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body: a JSON object of strict JSON (no NaN or Infinity, UTF-8 text without lone surrogates),
    nested at most ``MAX_JSON_DEPTH`` deep. Anything else is a 400 with llama-server's error body (llama-server
    answers malformed JSON with a 500)."""
    if len(raw) > limits.MAX_BODY:
        raise APIError(413, "Payload Too Large")
    try:
        body = json.loads(raw or b"{}", parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise parse_error(f"the request body is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise parse_error(str(e)) from None
    check_json(body)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


async def read_json(req: Any) -> dict[str, Any]:
    """A request's JSON body (``json_object``), read up to ``limits.MAX_BODY`` bytes whatever its Content-Length says
    (a chunked upload has none); a large one is parsed off the event loop."""
    chunks, size = [], 0
    async for chunk in req.stream():
        size += len(chunk)
        if size > limits.MAX_BODY:
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

@dataclass
class Options:
    """A completion request's fields that are not sampling parameters: its stop and limit rules (``Rules``, the one
    home of n_predict, n_keep, n_discard, stop, n_indent and t_max_predict_ms; the engine fills in what depends on
    the slot) and how the request is run and answered."""

    rules: Rules = field(default_factory=Rules)
    n_cmpl: int = 1
    cache_prompt: bool = True
    id_slot: int = -1
    stream: bool = False
    include_usage: bool = False
    return_tokens: bool = False
    return_progress: bool = False
    timings_per_token: bool = False
    response_fields: tuple[str, ...] = ()
    verbose: bool = False


def int_field(body: Mapping[str, Any], names: Sequence[str], default: int, lo: int = -INT32_MAX - 1,
              hi: int = INT32_MAX) -> int:
    """``validate.body_int``, a bad value a 400."""
    try:
        return body_int(body, names, default, lo, hi)
    except ValueError as e:
        raise bad_request(str(e)) from None


def bool_field(body: Mapping[str, Any], name: str, default: bool) -> bool:
    """``validate.body_bool``, a bad value a 400."""
    try:
        return body_bool(body, name, default)
    except ValueError as e:
        raise bad_request(str(e)) from None


def parse_options(body: Mapping[str, Any], defaults: Defaults, n_slots: int) -> Options:
    """The non-sampling fields of a completion request (llama-server's ``make_llama_cmpl_schema``; absent or
    null = the server default)."""
    stop = defaults.rules.stop
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
        stop = tuple(raw) or defaults.rules.stop
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
        rules=Rules(n_predict=int_field(body, ("n_predict", "max_completion_tokens", "max_tokens"),
                                        defaults.rules.n_predict, -1),
                    n_keep=int_field(body, ("n_keep",), defaults.rules.n_keep, -1),
                    n_discard=int_field(body, ("n_discard",), 0, 0),
                    stop=stop,
                    n_indent=int_field(body, ("n_indent",), 0, 0),
                    t_max_predict_ms=-1.0 if t_max is None else float(t_max)),
        n_cmpl=int_field(body, ("n_cmpl", "n"), 1, 1, n_slots),
        cache_prompt=bool_field(body, "cache_prompt", defaults.cache_prompt),
        id_slot=int_field(body, ("id_slot",), -1),
        stream=bool_field(body, "stream", False),
        include_usage=bool(stream_options and bool_field(stream_options, "include_usage", False)),
        return_tokens=bool_field(body, "return_tokens", False),
        return_progress=bool_field(body, "return_progress", False),
        timings_per_token=bool_field(body, "timings_per_token", False),
        response_fields=tuple(fields or ()),
        verbose=bool_field(body, "verbose", defaults.verbose),
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
        n = text_chars(body.get(name))
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
    thread: the grammar is compiled once, with its first mask, within ``limits.COMPILE_BUDGET`` seconds, and every
    other task gets a clone (they share its mask cache). A sampler that cannot be built (a bad grammar or
    schema, a logit bias outside the vocabulary) is a 400 before the task starts, as llama-server fails at
    sampler init."""
    vocab, n_vocab = model.vocab, model.config.n_vocab
    if any(isinstance(token, str) for token, _ in params[0].logit_bias):  # tokenized once, not once per task
        bias = tuple(tokenize_logit_bias(params[0].logit_bias, vocab))
        params = [dataclasses.replace(p, logit_bias=bias) for p in params]
    try:
        with time_budget(limits.COMPILE_BUDGET):
            first = CommonSampler(params[0], vocab, n_vocab=n_vocab)
            if first.grammar is not None:
                first.grammar.mask()
    except (GrammarError, ValueError, RecursionError) as e:
        raise bad_request(f"Failed to initialize samplers: {e}") from None
    grammar = first.grammar
    return [first, *(CommonSampler(p, vocab, n_vocab=n_vocab, grammar=None if grammar is None else grammar.clone())
                     for p in params[1:])]


def response_format(body: Mapping[str, Any]) -> dict[str, Any]:
    """``response_format`` as sampling fields (as llama-server's ``oaicompat_chat_params_parse`` reads it)."""
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
