"""Preparing a chat request: ``apply(template, messages, tools, options)`` renders the prompt and gives what the
chat format adds to it (``common_chat_templates_apply``): the generation prompt, the grammar with its lazy flag,
triggers and preserved tokens, the stop strings, and how the answer is to be read (``ChatSyntax``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from samplechain.chat.formats import Format, FormatParams, ToolSetup, detect
from samplechain.chat.messages import join_parts
from samplechain.chat.parse import ChatSyntax
from samplechain.chat.template import ChatTemplate
from samplechain.chat.tools import ToolRequest, add_system, polyfill


@dataclass(frozen=True)
class ChatOptions:
    """A request's chat options. ``add_generation_prompt`` / ``continue_final_message``: a last assistant message
    is continued (prefill) with either; ``enable_thinking``: None is the template's default; ``variables``: extra
    template variables (``chat_template_kwargs``); ``json_schema``: the response schema (the generic format folds
    it into its grammar when there are tools); ``reasoning_format``: ``none`` leaves the reasoning in the content."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    enable_thinking: bool | None = None
    variables: Mapping[str, Any] = field(default_factory=dict)
    json_schema: Any = None
    reasoning_format: str = "auto"


@dataclass(frozen=True)
class ChatParams:
    """A chat request prepared: the prompt, the generation prompt it ends with (the assistant header, or a prefilled
    message), what the format adds (``format``: grammar, triggers, preserved tokens, stops) and how to read the
    answer (``syntax``)."""

    prompt: str
    generation_prompt: str
    format: FormatParams
    syntax: ChatSyntax


def apply(template: ChatTemplate, messages: Sequence[Mapping[str, Any]], tools: ToolRequest | None = None,
          options: ChatOptions | None = None) -> ChatParams:
    """``messages`` (normalized as ``normalize_messages`` gives them) through ``template`` with ``tools``: the
    prompt and the format's parameters. A last assistant message with ``add_generation_prompt`` or
    ``continue_final_message`` is continued: the prompt ends with its text (parts joined with a blank line, as
    llama.cpp's ``render_content``). No messages render as the template has them (llama.cpp's
    ``common_chat_templates_apply`` takes an empty conversation: often the generation prompt alone). ``ValueError``
    says what is wrong."""
    options = options or ChatOptions()
    add_gen, cont = options.add_generation_prompt, options.continue_final_message
    if add_gen and cont:
        raise ValueError("Cannot set both add_generation_prompt and continue_final_message to true.")
    msgs = [dict(m) for m in messages]
    if msgs and msgs[-1]["role"] == "assistant" and (add_gen or cont):  # assistant prefill: continue the message
        if msgs[-1].get("tool_calls"):
            raise ValueError("Cannot continue an assistant message that contains tool calls.")
        head = _apply(template, msgs[:-1], tools, True, options)
        content = msgs[-1].get("content") or ""
        content = content if isinstance(content, str) else "\n\n".join(p["text"] for p in content)
        syntax = head.syntax
        syntax = replace(syntax, thinking_open=content.rstrip().endswith(syntax.tags[0]))
        return ChatParams(head.prompt + content, content, head.format, syntax)
    for m in msgs:
        if isinstance(m.get("content"), list):
            m["content"] = join_parts(m["content"])
    return _apply(template, msgs, tools, add_gen, options)


def _apply(template: ChatTemplate, messages: list[dict[str, Any]], tools: ToolRequest | None,
           add_generation_prompt: bool, options: ChatOptions) -> ChatParams:
    fmt: Format = detect(template.source, tools, options.json_schema)
    tool_list = list(tools.tools) if tools is not None and fmt.template_tools else None
    active = tools is not None and tools.choice != "none"
    caps = template.caps
    parallel = tools.parallel if tools is not None and tools.parallel is not None else caps.parallel_tool_calls
    if active and fmt.system:
        messages = add_system(messages, fmt.system)
    msgs = polyfill(messages, tool_list, caps)
    variables = {**options.variables, **fmt.variables(tools)}

    def text(add: bool) -> str:
        return template.render(msgs, add, tools=tool_list, enable_thinking=options.enable_thinking,
                               variables=variables)

    prompt, without = text(add_generation_prompt), text(False)
    generation = prompt[len(without):] if prompt.startswith(without) else ""
    prompt, thinking_open = fmt.thinking(prompt, options.enable_thinking)
    params = FormatParams()
    if active and tools is not None:
        params = fmt.params(ToolSetup(tools, tools.choice == "required", parallel, options.json_schema,
                                      thinking_open))
    parse = params.parse_tools or fmt.always_parse
    syntax = ChatSyntax(fmt.name if parse else params.name, parse, fmt.reasoning or ("<think>", "</think>"),
                        fmt.reasoning is not None and options.reasoning_format != "none", thinking_open,
                        ChatSyntax.strings_of(tools.tools) if active and tools is not None else frozenset())
    return ChatParams(prompt, generation, params, syntax)
