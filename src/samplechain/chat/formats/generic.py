"""llama.cpp's generic tool format (``common_chat_params_init_generic``), for any template without a format of its
own: the system prompt asks for JSON, and the grammar (not lazy) allows only ``{"tool_call": {...}}``
(``{"tool_calls": [...]}`` with parallel calls) or ``{"response": "..."}``."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from samplechain.chat.formats.base import Format, FormatParams, ToolSetup
from samplechain.chat.formats.scan import any_of
from samplechain.chat.json_scan import Invalid, call_object, items, members, partial_string, skip_ws
from samplechain.chat.messages import ChatMessage
from samplechain.chat.tools import dump2, tool_parameters
from samplechain.grammar.json_schema import GrammarBuilder

GENERIC = "Generic"


class Generic(Format):
    """The generic JSON format."""

    name: ClassVar[str] = GENERIC
    system: ClassVar[str] = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with "
                             "`response` reply to the user's request")

    def params(self, setup: ToolSetup) -> FormatParams:
        return _generic(setup.request.tools, setup.required, setup.parallel, setup.json_schema)

    def parse(self, text: str, final: bool) -> ChatMessage:
        return _parse_generic(text, final)


def _generic(tools: Any, required: bool, parallel: bool, json_schema: Any) -> FormatParams:
    """``{"tool_call": {...}}`` / ``{"tool_calls": [...]}`` or ``{"response": ...}``: the whole answer is JSON."""
    schemas = []
    for tool in tools:
        fn = tool["function"]
        schema: dict[str, Any] = {"type": "object", "properties": {
            "name": {"type": "string", "const": fn["name"]}, "arguments": tool_parameters(tool)},
            "required": ["name", "arguments"]}
        if "description" in fn:
            schema["description"] = fn["description"]
        if parallel:
            schema["properties"]["id"] = {"type": "string", "minLength": 4}
            schema["required"].append("id")
        schemas.append(schema)
    one = any_of(schemas)
    call = ({"type": "object", "properties": {"tool_calls": {"type": "array", "items": one, "minItems": 1}},
             "required": ["tool_calls"]} if parallel else
            {"type": "object", "properties": {"tool_call": one}, "required": ["tool_call"]})
    if not required:
        response = {"type": "string"} if json_schema is None else json_schema
        call = {"anyOf": [call, {"type": "object", "properties": {"response": response}, "required": ["response"]}]}
    b = GrammarBuilder()
    b.add_schema("root", call)
    return FormatParams(GENERIC, True, b.text())


def _parse_generic(text: str, final: bool) -> ChatMessage:
    start = skip_ws(text, 0)
    if start >= len(text):
        if final:
            raise Invalid("expected a JSON object")
        return ChatMessage()
    found, end = members(text, start, final)
    if end is not None:
        json.loads(text[start:end])
    elif final:
        raise Invalid("incomplete JSON")
    msg = ChatMessage()
    for key, a, b in found:
        if key == "tool_calls" and text[a:a + 1] == "[":
            calls, _ = items(text, a, final)
            for i, _ in calls:
                call, _ = call_object(text, i, final)
                if call is not None:
                    msg.tool_calls.append(call)
            return msg
        if key == "tool_call" and text[a:a + 1] == "{":
            call, _ = call_object(text, a, final)
            if call is not None:
                msg.tool_calls.append(call)
            return msg
        if key == "response":
            if text[a:a + 1] == '"':
                msg.content = partial_string(text, a, b)
            elif b is not None:
                msg.content = dump2(json.loads(text[a:b]))
            return msg
    if final:
        raise Invalid("expected 'tool_call', 'tool_calls' or 'response' in JSON")
    return msg
