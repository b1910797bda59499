"""FireFunction v2's tool calls (``common_chat_params_init_firefunction_v2`` / ``common_chat_parse_firefunction_v2``):
`` functools[{"name": ..., "arguments": {...}}, ...]``. The template gets the tools as ``functions`` (JSON, indent
2) and the time as ``datetime``, not as ``tools``."""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any, ClassVar

from samplechain.chat.formats.base import Format, FormatParams, ToolSetup
from samplechain.chat.formats.scan import calls_array, partial_suffix, read_calls
from samplechain.chat.json_scan import skip_ws
from samplechain.chat.messages import ChatMessage
from samplechain.chat.tools import ToolRequest, tool_names
from samplechain.grammar.json_schema import GrammarBuilder
from samplechain.params.checks import TRIGGER_WORD

FIREFUNCTION_V2 = "FireFunction v2"
PREFIX = " functools["


class FireFunctionV2(Format):
    """The template writes `` functools[``; it needs ``datetime`` and ``functions`` even without tools."""

    name: ClassVar[str] = FIREFUNCTION_V2
    template_tools: ClassVar[bool] = False

    @classmethod
    def matches(cls, source: str) -> bool:
        return PREFIX in source

    def variables(self, request: ToolRequest | None) -> dict[str, Any]:
        tools = list(request.tools) if request is not None else []
        return {"datetime": _dt.datetime.now().strftime("%b %d %Y %H:%M:%S GMT"),
                "functions": json.dumps(tools, indent=2, ensure_ascii=False) if tools else ""}

    def params(self, setup: ToolSetup) -> FormatParams:
        return _firefunction_v2(setup)

    def parse(self, text: str, final: bool) -> ChatMessage:
        return _parse_firefunction(text, final)


def _firefunction_v2(setup: ToolSetup) -> FormatParams:
    """`` functools`` (optional) then an array of ``{"name", "arguments"}`` calls (one unless parallel)."""
    schemas: list[dict[str, Any]] = [{"type": "object", "properties": {
        "name": {"type": "string", "const": name}, "arguments": params}, "required": ["name", "arguments"]}
        for name, params in tool_names(setup.request.tools)]
    b = GrammarBuilder()
    b.add_rule("root", f'{b.literal(" functools")}? {b.add_schema("tool_calls", calls_array(schemas, setup.parallel))}')
    return FormatParams(FIREFUNCTION_V2, True, b.text(), not setup.required, ((TRIGGER_WORD, PREFIX),), (PREFIX,))


def _parse_firefunction(text: str, final: bool) -> ChatMessage:
    """Content, then `` functools`` and the array of calls (``parse_prefixed_json_tool_call_array``)."""
    at = text.find(PREFIX)
    if at < 0:
        return ChatMessage(text if final else text[:partial_suffix(text, (PREFIX,))])
    msg = ChatMessage(text[:at])
    end = read_calls(text, at + len(PREFIX) - 1, final, msg)  # from the prefix's "["
    if end is None:
        return msg
    msg.content += text[skip_ws(text, end):]
    return msg
