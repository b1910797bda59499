"""Response JSON: llama-server's native shapes and OpenAI's (the ``to_json*`` methods of the
results in tools/server/server-task.cpp)."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from fastapi.responses import Response

from samplechain.chat import ChatMessage, ChatSyntax, MessageDiff, MessageStream, parse
from samplechain.chat.messages import random_id
from samplechain.params import SamplingParams
from samplechain.runtime.decoding import Rules, Timings
from samplechain.runtime.events import Error, Final, Progress, Token
from samplechain.server.limits import APIError
from samplechain.server.request import Options

BUILD_INFO = "b1-samplechain"


def json_bytes(obj: Any) -> bytes:
    """Compact JSON. JSON has no inf or NaN: the builders turn them into null, and any left (a penalty of -1e308
    makes logits infinite) become null here too, as llama-server's JSON library writes them."""
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        return json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _finite(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def reply(obj: Any, status: int = 200) -> Response:
    """A JSON response as llama-server sends it."""
    return Response(json_bytes(obj), status_code=status, media_type="application/json; charset=utf-8")


ANTHROPIC_PREFIXES = ("/v1/messages", "/messages")  # the routes that answer errors in Anthropic's shape
_ANTHROPIC_KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                    501: "api_error", 503: "overloaded_error"}


def error_body(path: str, e: APIError) -> dict[str, Any]:
    """An error's body in the API's own shape: Anthropic's (``{"type": "error", "error": {"type", "message"}}``)
    on the Messages routes, llama-server's (OpenAI's, with a numeric ``code``) elsewhere."""
    if path.startswith(ANTHROPIC_PREFIXES):
        kind = _ANTHROPIC_KINDS.get(e.code, "api_error" if e.code >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": e.message}}
    return e.body()


def error_event(ev: Error) -> APIError:
    """The engine's error event as the error it answers."""
    return APIError(ev.code, ev.message, ev.error_type)


def sse(obj: Any) -> bytes:
    """One server-sent event."""
    return b"data: " + json_bytes(obj) + b"\n\n"


def completion_id() -> str:
    """``chatcmpl-`` + 32 random alphanumerics (also for legacy completions, as llama-server does)."""
    return random_id(32, "chatcmpl-")


def settings(params: SamplingParams, opts: Options | None = None, *, full: bool = False,
             eog: tuple[int, ...] = ()) -> dict[str, Any]:
    """``generation_settings`` (``full``) or the compact ``params`` of ``/props`` and ``/slots``."""
    rules = opts.rules if opts else Rules()
    n_predict = rules.n_predict
    d: dict[str, Any] = {
        "seed": params.seed, "temperature": params.temperature, "dynatemp_range": params.dynatemp_range,
        "dynatemp_exponent": params.dynatemp_exponent, "top_k": params.top_k, "top_p": params.top_p,
        "min_p": params.min_p, "top_n_sigma": params.top_n_sigma, "xtc_probability": params.xtc_probability,
        "xtc_threshold": params.xtc_threshold, "typical_p": params.typical_p, "repeat_last_n": params.repeat_last_n,
        "repeat_penalty": params.repeat_penalty, "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty, "dry_multiplier": params.dry_multiplier,
        "dry_base": params.dry_base, "dry_allowed_length": params.dry_allowed_length,
        "dry_penalty_last_n": params.dry_penalty_last_n, "mirostat": params.mirostat,
        "mirostat_tau": params.mirostat_tau, "mirostat_eta": params.mirostat_eta,
        "adaptive_target": params.adaptive_target, "adaptive_decay": params.adaptive_decay,
        "max_tokens": n_predict, "n_predict": n_predict, "n_keep": rules.n_keep,
        "n_discard": rules.n_discard, "ignore_eos": params.ignore_eos,
        "stream": opts.stream if opts else False, "n_probs": params.n_probs, "min_keep": params.min_keep,
        "chat_format": "Content-only", "reasoning_format": "none", "reasoning_in_content": False,
        "generation_prompt": params.generation_prompt, "samplers": list(params.samplers),
        "speculative.types": [], "timings_per_token": opts.timings_per_token if opts else False,
        "post_sampling_probs": params.post_sampling_probs, "backend_sampling": params.backend_sampling, "lora": [],
    }
    if full:
        biases = [{"bias": finite(b), "token": t} for t, b in params.logit_bias]
        if params.ignore_eos:
            biases += [{"bias": None, "token": t} for t in eog]
        d.update({
            "dry_sequence_breakers": list(params.dry_sequence_breakers), "stop": list(rules.stop),
            "logit_bias": biases, "grammar": params.grammar, "grammar_lazy": params.grammar_lazy,
            "grammar_triggers": [{"type": k, "value": v} for k, v, _ in params.grammar_triggers],
            "preserved_tokens": list(params.preserved_tokens),
        })
    return d


def probs_key(post: bool) -> tuple[str, str]:
    return ("prob", "top_probs") if post else ("logprob", "top_logprobs")


def native_final(final: Final, *, model: str, prompt_text: str, params: SamplingParams, opts: Options,
                 eog: tuple[int, ...], index: int = 0, streamed: bool = False) -> dict[str, Any]:
    """The native ``/completion`` result (and the last event of its stream, with the text already sent)."""
    out: dict[str, Any] = {
        "index": index,
        "content": "" if streamed else final.content,
        "tokens": [] if streamed or not opts.return_tokens else final.tokens,
        "id_slot": final.id_slot, "stop": True, "model": model,
        "tokens_predicted": final.n_decoded, "tokens_evaluated": final.n_prompt,
        "generation_settings": settings(params, opts, full=True, eog=eog), "prompt": prompt_text,
        "has_new_line": final.has_new_line, "truncated": final.truncated, "stop_type": final.stop_type,
        "stopping_word": final.stopping_word, "tokens_cached": final.n_prompt + final.n_decoded - 1,
        "timings": final.timings,
    }
    if params.n_probs > 0 and not streamed:
        out["completion_probabilities"] = final.probs
    if opts.response_fields:
        out = project(out, opts.response_fields)
    return out


def native_event(ev: Token, params: SamplingParams, opts: Options, index: int = 0) -> dict[str, Any]:
    """A token's event of a native ``/completion`` stream."""
    out: dict[str, Any] = {"index": index, "content": ev.text, "tokens": [ev.token], "stop": False,
                           "id_slot": ev.id_slot, "tokens_predicted": ev.n_decoded, "tokens_evaluated": ev.n_prompt}
    if opts.timings_per_token:
        out["timings"] = ev.timings
    if params.n_probs > 0 and ev.probs is not None:
        out["completion_probabilities"] = [ev.probs]
    return out


def prompt_progress(ev: Progress) -> dict[str, Any]:
    """``prompt_progress`` (llama-server's ``result_prompt_progress::to_json``)."""
    return {"total": ev.total, "cache": ev.cache, "processed": ev.processed, "time_ms": ev.time_ms}


def progress_timings(ev: Progress) -> dict[str, Any]:
    """The ``timings`` of a progress event (``timings_per_token``), as llama-server's slot counts them while it reads
    the prompt: the tokens decoded so far and the time to the last prompt batch; all zeros before the first batch,
    nothing predicted yet."""
    n = ev.processed - ev.cache
    t = ev.time_ms / 1e3 if n > 0 else 0.0
    return Timings(n_reused=ev.cache, n_prompt=n, t_first=t, t_last=t).to_dict()


def native_progress(ev: Progress, opts: Options, index: int = 0) -> dict[str, Any]:
    """A ``prompt_progress`` event of a native ``/completion`` stream (with ``timings`` when asked per token)."""
    out: dict[str, Any] = {"index": index, "content": "", "tokens": [], "stop": False, "id_slot": ev.id_slot,
                           "tokens_predicted": 0, "tokens_evaluated": ev.n_prompt}
    if opts.timings_per_token:
        out["timings"] = progress_timings(ev)
    out["prompt_progress"] = prompt_progress(ev)
    return out


def project(obj: dict[str, Any], paths: tuple[str, ...]) -> dict[str, Any]:
    """``response_fields``: keep these paths; ``a/b`` is returned under the key ``"a/b"``; missing ones dropped."""
    out: dict[str, Any] = {}
    for path in paths:
        cur: Any = obj
        for part in path.split("/"):
            if not isinstance(cur, dict) or part not in cur:
                break
            cur = cur[part]
        else:
            out[path] = cur
    return out


def usage(finals: list[Final]) -> dict[str, Any]:
    prompt = finals[0].n_prompt if finals else 0
    completion = sum(f.n_decoded for f in finals)
    return {"completion_tokens": completion, "prompt_tokens": prompt, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": finals[0].n_cached if finals else 0}}


def finish_reason(final: Final, tool_calls: bool = False) -> str:
    """``stop`` (``tool_calls`` when the answer has tool calls) for an end of generation or a stop word, else
    ``length``."""
    if final.stop_type in ("eos", "word"):
        return "tool_calls" if tool_calls else "stop"
    return "length"


def oai_envelope(obj: str, cid: str, model: str, created: int | None = None) -> dict[str, Any]:
    return {"created": created or int(time.time()), "model": model, "system_fingerprint": BUILD_INFO,
            "object": obj, "id": cid}


def oai_completion(finals: list[Final], cid: str, model: str) -> dict[str, Any]:
    choices = [{"text": f.content, "index": i, "finish_reason": finish_reason(f),
                "logprobs": {"content": f.probs} if f.probs else None} for i, f in enumerate(finals)]
    return {"choices": choices, **oai_envelope("text_completion", cid, model), "usage": usage(finals),
            "timings": finals[0].timings}


def oai_completion_chunk(ev: Token | Final, index: int, env: dict[str, Any]) -> dict[str, Any] | None:
    """A ``/v1/completions`` stream's chunk for a token (None when it releases nothing) or a choice's end."""
    if isinstance(ev, Final):
        return {"choices": [{"text": "", "index": index, "logprobs": None, "finish_reason": finish_reason(ev)}],
                **env, "usage": usage([ev]), "timings": ev.timings}
    if not ev.text and ev.probs is None:
        return None
    probs = {"content": [ev.probs]} if ev.probs is not None else None
    return {"choices": [{"text": ev.text, "index": index, "logprobs": probs, "finish_reason": None}], **env}


def message_json(msg: ChatMessage) -> dict[str, Any]:
    """A parsed answer as an OpenAI message's ``content``, ``tool_calls`` and ``reasoning_content`` fields."""
    out: dict[str, Any] = {"content": msg.content}
    if msg.tool_calls:
        out["tool_calls"] = [{"type": "function", "function": {"name": tc.name, "arguments": tc.arguments},
                              "id": tc.id} for tc in msg.tool_calls]
    if msg.reasoning_content:
        out["reasoning_content"] = msg.reasoning_content
    return out


def parse_final(text: str, syntax: ChatSyntax) -> ChatMessage:
    """A whole answer through the chat layer, each tool call with an id (the model's, else a random one)."""
    msg = parse(text, syntax)
    for call in msg.tool_calls:
        call.id = call.id or syntax.new_id()
    return msg


def oai_chat(finals: list[Final], cid: str, model: str, syntax: ChatSyntax, with_logprobs: bool) -> dict[str, Any]:
    """A chat completion, each answer read by the chat layer (reasoning, content, tool calls)."""
    choices = []
    for i, f in enumerate(finals):
        msg = parse_final(f.content, syntax)
        message: dict[str, Any] = {"role": "assistant", **message_json(msg)}
        choice: dict[str, Any] = {"finish_reason": finish_reason(f, bool(msg.tool_calls)), "index": i,
                                  "message": message}
        if with_logprobs:
            choice["logprobs"] = {"content": f.probs}
        choices.append(choice)
    return {"choices": choices, **oai_envelope("chat.completion", cid, model), "usage": usage(finals),
            "timings": finals[0].timings}


def oai_deltas(diffs: list[MessageDiff], merge: bool) -> list[dict[str, Any]]:
    """The chat layer's differences as OpenAI ``delta``s (``server_chat_msg_diff_to_json_oaicompat``); ``merge``:
    reasoning and content of one update ride in one delta (an answer without tool parsing)."""
    out: list[dict[str, Any]] = []
    for d in diffs:
        if d.reasoning:
            out.append({"reasoning_content": d.reasoning})
        elif d.content:
            if merge and out and "content" not in out[-1] and "tool_calls" not in out[-1]:
                out[-1]["content"] = d.content
            else:
                out.append({"content": d.content})
        elif d.tool_index >= 0:
            entry: dict[str, Any] = {"index": d.tool_index}
            fn: dict[str, Any] = {}
            if d.header:
                entry["id"], entry["type"] = d.tool_id, "function"
                fn["name"] = d.tool_name
            if d.tool_arguments:
                fn["arguments"] = d.tool_arguments
            if fn:
                entry["function"] = fn
            out.append({"tool_calls": [entry]})
    return out


class ChatStream:
    """A streamed chat completion's chunks, event by event: each choice's role first, its reasoning, content and
    tool calls as the chat layer reads them, logprobs and timings as asked, then its finish reason; the usage at
    the end (``include_usage``)."""

    def __init__(self, cid: str, model: str, created: int, opts: Options, syntax: ChatSyntax,
                 with_logprobs: bool) -> None:
        self.cid, self.model, self.created, self.opts = cid, model, created, opts
        self.with_logprobs = with_logprobs
        self.syntax = syntax
        self.messages = [MessageStream(syntax) for _ in range(opts.n_cmpl)]
        self.role_sent = [False] * opts.n_cmpl
        self.finals: list[Final] = []
    def envelope(self) -> dict[str, Any]:
        return oai_envelope("chat.completion.chunk", self.cid, self.model, self.created)

    def chunks(self, index: int, ev: Progress | Token | Final) -> list[dict[str, Any]]:
        """The chunks of choice ``index``'s event (none when it releases nothing yet)."""
        env = self.envelope()
        if isinstance(ev, Progress):  # rides on the role chunk, then on empty deltas
            delta0: dict[str, Any] = {} if self.role_sent[index] else {"role": "assistant", "content": None}
            self.role_sent[index] = True
            timings = {"timings": progress_timings(ev)} if self.opts.timings_per_token else {}
            return [{"choices": [{"finish_reason": None, "index": index, "delta": delta0}], **env, **timings,
                     "prompt_progress": prompt_progress(ev)}]
        out: list[dict[str, Any]] = []
        if not self.role_sent[index]:
            self.role_sent[index] = True
            out.append({"choices": [{"finish_reason": None, "index": index,
                                     "delta": {"role": "assistant", "content": None}}], **env})
        token = ev if isinstance(ev, Token) else None
        diffs = self.messages[index].update("" if token is None else token.text, final=token is None)
        deltas = oai_deltas(diffs, merge=not self.syntax.parse)
        logprobs = token is not None and token.probs is not None and self.with_logprobs
        if logprobs and not deltas:
            deltas.append({})
        for k, delta in enumerate(deltas):
            chunk: dict[str, Any] = {"choices": [{"finish_reason": None, "index": index, "delta": delta}], **env}
            if logprobs and k == len(deltas) - 1:
                chunk["choices"][0]["logprobs"] = {"content": [token.probs]}
            if token is not None and self.opts.timings_per_token:
                chunk["timings"] = token.timings
            out.append(chunk)
        if isinstance(ev, Final):
            self.finals.append(ev)
            calls = bool(self.messages[index].msg.tool_calls)
            last: dict[str, Any] = {"choices": [{"finish_reason": finish_reason(ev, calls), "index": index,
                                                 "delta": {}}], **env}
            if not self.opts.include_usage:
                last["timings"] = ev.timings
            out.append(last)
        return out

    def usage_chunk(self) -> dict[str, Any] | None:
        """The last chunk, with the usage of every choice (``include_usage``), or None."""
        if not self.opts.include_usage or not self.finals:
            return None
        return {"choices": [], **self.envelope(), "usage": usage(self.finals), "timings": self.finals[-1].timings}


def finite(x: float) -> float | None:
    """JSON has no inf/nan: they serialise as null (as llama-server's JSON library writes them)."""
    return x if math.isfinite(x) else None
