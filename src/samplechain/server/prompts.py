"""A request's prompts and chat messages: read, checked against the context size before anything is
tokenized, and tokenized or rendered (llama-server's ``tokenize_input_prompts`` and ``oaicompat_chat_params_parse``,
tools/server/server-common.cpp); apart from the other fields, in ``request.py``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from samplechain import chat
from samplechain.chat import ChatOptions, ChatParams, ChatTemplate, ToolRequest
from samplechain.chat.template import starts_with_bos
from samplechain.runtime.generation import Model
from samplechain.server.limits import MAX_COMPLETIONS, MAX_MESSAGES, APIError, bad_request, check_schema, context_error


def max_prompt_chars(model: Model, n_ctx: int) -> int:
    """More characters than this cannot fit in ``n_ctx`` tokens (a token's text has at most the longest piece's
    bytes; twice that for tokenizers that normalise): a longer prompt is refused before it is tokenized."""
    return 2 * max(model.vocab.max_piece_bytes, 1) * n_ctx


# --- prompts ---------------------------------------------------------------------------------------------------


def check_length(model: Model, n_chars: int, n_ctx: int | None) -> None:
    """A text of ``n_chars`` characters too long for ``n_ctx`` tokens is refused before it is tokenized
    (``max_prompt_chars``)."""
    if n_ctx is not None and n_chars > max_prompt_chars(model, n_ctx):
        raise context_error(f"{n_chars} characters", n_ctx)


def tokenize_mixed(model: Model, prompt: Any, add_special: bool = True, n_ctx: int | None = None,
                   parse_special: bool = True) -> list[int]:
    """One prompt: a string, or an array of token ids and strings (each string tokenized, specials parsed unless
    ``parse_special`` is off). With ``n_ctx``, a prompt whose text cannot fit is refused before it is tokenized."""
    if isinstance(prompt, str):
        check_length(model, len(prompt), n_ctx)
        return model.tokenize(prompt, add_special=add_special and not starts_with_bos(model.vocab, prompt),
                              parse_special=parse_special)
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
                out += model.tokenize(part, add_special=add_special and i == 0, parse_special=parse_special)
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


def _content_text(content: Any, delimiter: str = "\n") -> str:
    """A message's text: a string, or its text parts joined by ``delimiter`` (llama.cpp joins a message's parts with
    a newline for the template, and a continued final message's with a blank line: ``render_content``)."""
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
        return delimiter.join(parts)
    raise bad_request("Expected 'content' to be a string or an array")


def _tool_calls(calls: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls``, checked as ``common_chat_msgs_parse_oaicompat`` checks them."""
    if not isinstance(calls, list):
        raise bad_request(f"messages[{i}]: 'tool_calls' must be an array")
    out = []
    for call in calls:
        if not isinstance(call, Mapping) or call.get("type", "function") != "function":
            raise bad_request(f"messages[{i}]: Unsupported tool call type: {call!r}"[:200])
        fn = call.get("function")
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise bad_request(f"messages[{i}]: a tool call needs a function with a string name")
        args = fn.get("arguments", "")
        if not isinstance(args, (str, Mapping)):
            raise bad_request(f"messages[{i}]: a tool call's arguments must be a JSON string or an object")
        out.append({"type": "function", "function": {"name": fn["name"], "arguments": args},
                    **({"id": call["id"]} if isinstance(call.get("id"), str) else {})})
    return out


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Validated messages with string contents, their tool fields (``tool_calls``, ``tool_call_id``, ``name``) and
    an assistant's ``reasoning_content`` (llama.cpp's ``common_chat_msgs_parse_oaicompat`` reads it, and templates
    such as Qwen3's render it), with llama-server's checks and messages."""
    messages = body.get("messages")
    if messages is None:
        raise bad_request("'messages' is required")
    if not isinstance(messages, list):
        raise bad_request("Expected 'messages' to be an array")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"Field 'messages': at most {MAX_MESSAGES} messages, got {len(messages)}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise bad_request("each message must be an object with a string 'role'")
        role = "system" if m["role"] == "developer" else m["role"]
        if role != "assistant" and "content" not in m:
            raise bad_request("All non-assistant messages must contain 'content'")
        if role == "assistant" and m.get("content") is None and not m.get("tool_calls"):
            raise bad_request("Assistant message must contain either 'content' or 'tool_calls'!")
        msg: dict[str, Any] = {"role": role, "content": _content_text(m.get("content"))}
        if m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], i)
        for key in ("tool_call_id", "name", "reasoning_content"):  # reasoning in the history: templates render it
            if m.get(key) is not None:
                if not isinstance(m[key], str):
                    raise bad_request(f"messages[{i}]: '{key}' must be a string")
                msg[key] = m[key]
        out.append(msg)
    if len(out) >= 2 and out[-1]["role"] == "assistant" and out[-2]["role"] == "assistant":
        raise bad_request("Cannot have 2 or more assistant messages at the end of the list.")
    if out and out[-1]["role"] == "assistant" and isinstance(messages[-1].get("content"), list):
        out[-1]["content"] = messages[-1]["content"]  # a prefill joins its parts with a blank line (chat.apply)
    return out


def tool_request(body: Mapping[str, Any]) -> ToolRequest | None:
    """A request's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` (OpenAI's shapes; the other protocols
    translate theirs to them), checked and with their schemas within the schema limits."""
    try:
        request = chat.parse_tool_request(body)
    except ValueError as e:
        raise bad_request(str(e)) from None
    if request is not None:
        try:
            check_schema([t["function"]["parameters"] for t in request.tools])
        except APIError as e:
            raise bad_request(e.message.replace("Field 'json_schema': the schema", "Field 'tools': the schemas")
                              ) from None
    return request


def chat_options(body: Mapping[str, Any], json_schema: Any = None, reasoning_format: str = "auto") -> ChatOptions:
    """A chat request's options: ``add_generation_prompt``, ``continue_final_message``, ``chat_template_kwargs``
    (``enable_thinking`` among them; ``reasoning_effort: none`` turns thinking off) and ``reasoning_format``."""
    add_gen = body.get("add_generation_prompt", True)
    cont = body.get("continue_final_message", False)
    if not isinstance(add_gen, bool) or not isinstance(cont, bool):
        raise bad_request("add_generation_prompt and continue_final_message must be true or false")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise bad_request("'chat_template_kwargs' must be an object")
    thinking = kwargs.get("enable_thinking", False if body.get("reasoning_effort") == "none" else None)
    if thinking is not None and not isinstance(thinking, bool):
        raise bad_request(f'invalid type for "enable_thinking" (expected boolean, got {type(thinking).__name__})')
    fmt = body.get("reasoning_format", reasoning_format)
    if not isinstance(fmt, str):
        raise bad_request("'reasoning_format' must be a string")
    return ChatOptions(add_gen, cont, thinking, {k: v for k, v in kwargs.items() if k != "enable_thinking"},
                       json_schema, fmt)


def chat_apply(model: Model, messages: list[dict[str, Any]], tools: ToolRequest | None, options: ChatOptions,
               n_ctx: int | None = None) -> ChatParams:
    """The chat layer's ``apply`` over the model's template; with ``n_ctx``, messages whose text cannot fit are
    refused before the template renders them. Its ``ValueError``s are 400s."""
    check_length(model, sum(len(_content_text(m.get("content"))) for m in messages), n_ctx)
    default = getattr(model, "enable_thinking", None)  # --reasoning on / off (state.served_model)
    if default is not None and options.enable_thinking is None:
        options = replace(options, enable_thinking=default)
    try:
        return chat.apply(ChatTemplate.of(model.vocab), messages, tools, options)
    except ValueError as e:
        raise bad_request(str(e)) from None


def chat_setup(model: Model, body: Mapping[str, Any], n_ctx: int | None = None, json_schema: Any = None,
               reasoning_format: str = "auto") -> ChatParams:
    """An OpenAI chat request's ``ChatParams``: its prompt, the generation prompt it ends with (the assistant
    header, or a prefilled message) and its chat format (tools, their grammar and parser). ``json_schema``: the
    request's response schema, which the generic format folds into its grammar when there are tools."""
    messages = chat_messages(body)
    request = tool_request(body)
    if request is not None and request.choice != "none" and body.get("grammar") is not None:
        raise bad_request("Cannot use custom grammar constraints with tools.")
    return chat_apply(model, messages, request, chat_options(body, json_schema, reasoning_format), n_ctx)


def chat_prompt(model: Model, body: Mapping[str, Any], n_ctx: int | None = None) -> tuple[str, str]:
    """The rendered prompt and the generation prompt it ends with (``chat_setup``)."""
    setup = chat_setup(model, body, n_ctx)
    return setup.prompt, setup.generation_prompt
