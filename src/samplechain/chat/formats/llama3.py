"""Llama 3.x tool calls (``common_chat_params_init_llama_3_x``): ``{"name": ..., "parameters": {...}}`` at the
start of the answer, and with ``<|python_tag|>`` in the template the built-in tools
(``<|python_tag|>name.call(key=value, ...)``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from samplechain.chat.formats.base import Format, FormatParams, ToolSetup
from samplechain.chat.json_scan import Invalid, held_back, raw, skip_ws, value_end
from samplechain.chat.messages import ChatMessage, ToolCall
from samplechain.chat.tools import ToolRequest, tool_names
from samplechain.grammar.json_schema import GrammarBuilder
from samplechain.params.checks import TRIGGER_PATTERN_FULL, TRIGGER_WORD

LLAMA_3_X = "Llama 3.x"
LLAMA_3_X_BUILTIN = "Llama 3.x with builtin tools"


class Llama3(Format):
    """The template has an ``ipython`` turn."""

    name: ClassVar[str] = LLAMA_3_X
    builtin: ClassVar[bool] = False

    @classmethod
    def matches(cls, source: str) -> bool:
        return "<|start_header_id|>ipython<|end_header_id|>" in source

    def variables(self, request: ToolRequest | None) -> dict[str, Any]:
        if request is None or not request.tools:
            return {}
        names = [n for n, _ in tool_names(request.tools) if self.builtin and n in _BUILTIN_ARGS]
        return {"tools_in_user_message": False, **({"builtin_tools": names} if names else {})}

    def params(self, setup: ToolSetup) -> FormatParams:
        return _llama_3_x(setup.request.tools, setup.required, self.builtin)[0]

    def parse(self, text: str, final: bool) -> ChatMessage:
        return _parse_llama(text, final, self.builtin)


class Llama3Builtin(Llama3):
    """An ``ipython`` turn and ``<|python_tag|>``: the built-in tools too."""

    name: ClassVar[str] = LLAMA_3_X_BUILTIN
    builtin: ClassVar[bool] = True

    @classmethod
    def matches(cls, source: str) -> bool:
        return super().matches(source) and "<|python_tag|>" in source


_BUILTIN_ARGS = {"wolfram_alpha": ("query",), "web_search": ("query",), "brave_search": ("query",),
                 "python": ("code",), "code_interpreter": ("code",)}


def _expect_parameters(name: str, params: Mapping[str, Any], expected: tuple[str, ...]) -> None:
    props, req = params.get("properties"), params.get("required")
    if params.get("type") != "object" or not isinstance(props, Mapping) or not isinstance(req, list):
        raise ValueError(f"Parameters of tool {name} must be an object w/ required properties")
    for prop in expected:
        if prop not in props:
            raise ValueError(f"Parameters of tool {name} is missing property: {prop}")
        if prop not in req:
            raise ValueError(f"Parameters of tool {name} must have property marked as required: {prop}")
    if len(props) != len(expected):
        raise ValueError(f"Parameters of tool {name} must only have these properties:{', '.join(expected)}")


def _llama_3_x(tools: Sequence[Mapping[str, Any]], required: bool, allow_builtin: bool,
               ) -> tuple[FormatParams, list[str]]:
    """``{"name": ..., "parameters": {...}}`` (optionally ``"type": "function"`` first), and the built-in tools as
    ``<|python_tag|>name.call(key=value, ...)`` when the template has them."""
    b = GrammarBuilder()
    lit = b.literal
    rules, builtin = [], []
    for name, params in tool_names(tools):
        if allow_builtin and name in _BUILTIN_ARGS:
            _expect_parameters(name, params, _BUILTIN_ARGS[name])
            kvs = [f"{lit(key + '=')} {b.add_schema(f'{name}-args-{key}', value, params)}"
                   for key, value in params["properties"].items()]
            rules.append(b.add_rule(f"{name}-call", f'{lit(f"<|python_tag|>{name}.call(")} '
                                    + f' {lit(", ")} '.join(kvs) + f' {lit(")")}'))
            builtin.append(name)
        args = b.add_schema(f"{name}-args", params, params)
        rules.append(b.add_rule(
            f"{name}-call",
            f'{lit("{")} space ( {lit(chr(34) + "type" + chr(34))} space {lit(":")} space '
            f'{lit(chr(34) + "function" + chr(34))} space {lit(",")} space )? '
            f'{lit(chr(34) + "name" + chr(34))} space {lit(":")} space {lit(json.dumps(name))} space {lit(",")} '
            f'space {lit(chr(34) + "parameters" + chr(34))} space {lit(":")} space {args} {lit("}")} space'))
    b.add_rule("root", " | ".join(rules))
    triggers = [(TRIGGER_PATTERN_FULL, r'(\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*")[\s\S]*')]
    preserved = []
    if builtin:
        triggers.append((TRIGGER_WORD, "<|python_tag|>"))
        preserved.append("<|python_tag|>")
    name = LLAMA_3_X_BUILTIN if builtin else LLAMA_3_X
    return FormatParams(name, True, b.text(), not required, tuple(triggers), tuple(preserved), ("<|eom_id|>",)), builtin


# llama.cpp's regex wants a space after "parameters": but its own grammar lets the model leave it out (then the call
# is lost as content): any whitespace here
_LLAMA_CALL = re.compile(r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*"([^"]+)"\s*,\s*"parameters"\s*:\s*')
_LLAMA_BUILTIN_CALL = re.compile(r"\s*(\w+)\s*\.\s*call\(")
_LLAMA_ARG = re.compile(r"\s*(\w+)\s*=\s*")


def _parse_llama(text: str, final: bool, builtin: bool) -> ChatMessage:
    if builtin:
        at = text.find("<|python_tag|>")
        if at >= 0:
            return _parse_python_tag(text, at, final)
    m = _LLAMA_CALL.match(text)
    if m is None:
        if not final and (not text.strip() or text.lstrip().startswith("{")):
            return ChatMessage()  # maybe a call, still coming
        rest = text if final else text[:held_back(text, ("<|python_tag|>",) if builtin else ())]
        return ChatMessage(rest)
    start = skip_ws(text, m.end())
    end = value_end(text, start, final)
    if end is not None:
        json.loads(text[start:end])
    call = ToolCall(m.group(1), raw(text, start, end) if start < len(text) else "")
    if end is None:
        if final:
            raise Invalid("incomplete tool call")
        return ChatMessage("", [call])
    close = re.compile(r"\}\s*").match(text, end)
    if close is None:
        if final or text[end:].strip():
            raise Invalid("expected '}'")
        return ChatMessage("", [call])
    return ChatMessage(text[skip_ws(text, close.end()):], [call])


def _parse_python_tag(text: str, at: int, final: bool) -> ChatMessage:
    """``<|python_tag|>name.call(key=value, ...)``: arguments as a JSON object (a call is whole or not at all)."""
    msg = ChatMessage(text[:at])
    pos = at + len("<|python_tag|>")
    try:
        m = _LLAMA_BUILTIN_CALL.match(text, pos)
        if m is None:
            raise Invalid("expected name.call(")
        pos, args = m.end(), {}
        while (arg := _LLAMA_ARG.match(text, pos)) is not None:
            end = value_end(text, arg.end(), True)
            if end is None:
                raise Invalid("incomplete argument")
            args[arg.group(1)] = json.loads(text[arg.end():end])
            pos = skip_ws(text, end)
            if not text.startswith(",", pos):
                break
            pos += 1
        if not text.startswith(")", pos):
            raise Invalid("expected ')'")
    except (Invalid, ValueError):
        if final:
            raise
        return msg
    msg.tool_calls.append(ToolCall(m.group(1), json.dumps(args, ensure_ascii=False, separators=(",", ":"))))
    return msg
