"""A completion request's tasks before they are submitted: its parameters, its prompts (each checked against a
slot's context) and one sampler per task. Run off the event loop (``asyncio.to_thread``) and the engine thread:
templates, tokenizing and grammar compilation never hold up other streams or the model."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from samplechain.chat import ChatOptions, ChatParams, ToolRequest
from samplechain.grammar.json_schema import server_response_schema
from samplechain.params import SamplingParams
from samplechain.server import prompts as pr
from samplechain.server import request as rq
from samplechain.server.limits import bad_request, context_error
from samplechain.server.request import Options

if TYPE_CHECKING:
    from samplechain.server.state import ServerState


@dataclass
class Job:
    """One task of a request before it is submitted: its prompt, its parameters and its sampler."""

    tokens: list[int]
    params: SamplingParams
    sampler: Any


def choice_params(params: SamplingParams, i: int) -> SamplingParams:
    """Choice ``i`` of ``n``: its own seed when the seed is fixed, so the choices differ."""
    if i == 0 or params.seed == SamplingParams().seed:
        return params
    return replace(params, seed=(params.seed + i) & 0xFFFFFFFF)


def jobs(state: ServerState, params: SamplingParams, opts: Options, prompts: list[list[int]]) -> list[Job]:
    """Each prompt times each of the ``n`` choices, with its sampler: the grammar is compiled once, within its
    budget. Out-of-vocabulary logit-bias ids are a 400 (llama-server skips them silently: its ``logit_bias`` field,
    tools/server/server-schema.cpp)."""
    todo = [(p, choice_params(params, i)) for p in prompts for i in range(opts.n_cmpl)]
    built = rq.samplers([q for _, q in todo], state.model)
    return [Job(p, q, sampler) for (p, q), sampler in zip(todo, built, strict=True)]


def check_fits(state: ServerState, tokens: list[int]) -> None:
    """A prompt must leave a slot's context room for one token, and must not be empty."""
    n_ctx = state.running_engine.n_ctx_slot
    if len(tokens) >= n_ctx:
        raise context_error(f"{len(tokens)} tokens", n_ctx, n_prompt_tokens=len(tokens))
    if not tokens:
        raise bad_request("the prompt is empty")


def prepare(state: ServerState, body: dict[str, Any]) -> tuple[SamplingParams, Options]:
    """A request's sampling parameters and options over the server's defaults."""
    config = state.config
    params = rq.parse_sampling(body, config.defaults)
    opts = rq.parse_options(body, config.defaults, config.n_slots)
    return params, opts


def prepare_completion(state: ServerState, body: dict[str, Any]) -> tuple[SamplingParams, Options, list[Job]]:
    """A completion request's parameters and its tasks (each prompt checked against a slot's context)."""
    try:
        params, opts = prepare(state, body)
        prompts = pr.prompts(state.model, body, state.running_engine.n_ctx_slot, opts.n_cmpl)
    except ValueError as e:
        raise bad_request(str(e)) from None
    for p in prompts:
        check_fits(state, p)
    return params, opts, jobs(state, params, opts, prompts)


def prepare_chat(state: ServerState, body: dict[str, Any]) -> tuple[SamplingParams, Options, list[Job], ChatParams]:
    """An OpenAI chat request's parameters, its prompt tokens (through the chat layer) and its ``ChatParams``."""
    if not state.config.use_jinja:  # built-in templates render no tools (llama-server's messages)
        if isinstance(body.get("tools"), list) and body["tools"]:
            raise bad_request("tools param requires --jinja flag")
        if body.get("tool_choice", "auto") != "auto":
            raise bad_request("tool_choice param requires --jinja flag")
    try:
        fields = {**body, **rq.response_format(body), **rq.chat_logprobs(body)}
    except ValueError as e:
        raise bad_request(str(e)) from None
    messages = pr.chat_messages(body)
    request = pr.tool_request(body)
    if request is not None and request.choice != "none" and body.get("grammar") is not None:
        raise bad_request("Cannot use custom grammar constraints with tools.")
    schema = fields.get("json_schema")
    options = pr.chat_options(body, None if schema is None else server_response_schema(schema),
                              state.config.reasoning_format)
    return prepare_messages(state, fields, messages, request, options)


def prepare_messages(state: ServerState, fields: dict[str, Any], messages: list[dict[str, Any]],
                     request: ToolRequest | None, options: ChatOptions,
                     ) -> tuple[SamplingParams, Options, list[Job], ChatParams]:
    """A chat request of any protocol, translated to messages, tools, chat options and llama-server's sampling
    fields: its parameters, its tasks and its ``ChatParams``. The chat format's grammar (tool calls) replaces the
    request's grammar fields; its stops are added to the request's."""
    n_ctx = state.running_engine.n_ctx_slot
    if request is not None and not state.config.use_jinja:
        raise bad_request("tools param requires --jinja flag")
    chat = pr.chat_apply(state.model, messages, request, options, n_ctx)
    fmt = chat.format
    try:
        if fmt.parse_tools:
            if fields.get("stream") and fields.get("logprobs"):
                raise bad_request("logprobs is not supported with tools + stream")
            fields["json_schema"] = None  # the format's grammar holds the response schema, if any
            if fmt.stops:
                stop = fields.get("stop") or []
                fields["stop"] = [*([stop] if isinstance(stop, str) else stop), *fmt.stops]
        if chat.generation_prompt and "generation_prompt" not in fields:
            fields["generation_prompt"] = chat.generation_prompt
        params, opts = prepare(state, fields)
        if fmt.parse_tools:  # the format's grammar is the whole grammar; its size is bounded by the tools' limits
            params = replace(params, grammar=fmt.grammar, grammar_lazy=fmt.grammar_lazy,
                             grammar_triggers=tuple((k, v, None) for k, v in fmt.triggers),
                             preserved_tokens=fmt.preserved_tokens)
    except ValueError as e:
        raise bad_request(str(e)) from None
    if params.reasoning_budget_tokens >= 0 and not params.reasoning_budget_start_tag:
        # a thinking budget from the request: the thinking block's tags, as the chat format gives them
        start, end = chat.syntax.tags
        params = replace(params, reasoning_budget_start_tag=start, reasoning_budget_end_tags=(end,))
    tokens = pr.tokenize_mixed(state.model, chat.prompt, n_ctx=n_ctx)
    check_fits(state, tokens)
    return params, opts, jobs(state, params, opts, [tokens]), chat


def input_tokens(state: ServerState, messages: list[dict[str, Any]], request: ToolRequest | None,
                 options: ChatOptions) -> int:
    """The prompt tokens a chat request of any protocol would use, rendered and tokenized as its completion route
    renders it (llama.cpp's ``handle_count_tokens`` behind ``/chat/completions/input_tokens``,
    ``/v1/responses/input_tokens`` and ``/v1/messages/count_tokens``); nothing runs. Text that cannot fit in a
    slot's context is refused before it is rendered or tokenized, as the completion routes refuse it (the
    tokenizer holds the GIL: an unbounded text would stall every stream); a prompt past the context is counted."""
    if request is not None and not state.config.use_jinja:
        raise bad_request("tools param requires --jinja flag")
    n_ctx = state.running_engine.n_ctx_slot
    chat = pr.chat_apply(state.model, messages, request, options, n_ctx)
    return len(pr.tokenize_mixed(state.model, chat.prompt, n_ctx=n_ctx))
