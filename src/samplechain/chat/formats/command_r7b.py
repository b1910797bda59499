"""Command R7B's answers (``common_chat_params_init_command_r7b`` / ``common_chat_parse_command_r7b``):
``<|START_THINKING|>...<|END_THINKING|>`` (reasoning), then ``<|START_ACTION|>[{"tool_call_id": "0", "tool_name":
..., "parameters": {...}}]<|END_ACTION|>`` or ``<|START_RESPONSE|>...<|END_RESPONSE|>``."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from samplechain.chat.formats.base import Format, FormatParams, ToolSetup
from samplechain.chat.formats.scan import calls_array, expect, partial_suffix, read_calls
from samplechain.chat.json_scan import Invalid, held_back, members, raw, skip_ws, string_member
from samplechain.chat.messages import ChatMessage, ToolCall
from samplechain.chat.tools import tool_names
from samplechain.grammar.json_schema import GrammarBuilder
from samplechain.params.checks import TRIGGER_PATTERN_FULL

COMMAND_R7B = "Command R7B"
START_THINKING, END_THINKING = "<|START_THINKING|>", "<|END_THINKING|>"
START_ACTION, END_ACTION = "<|START_ACTION|>", "<|END_ACTION|>"
START_RESPONSE, END_RESPONSE = "<|START_RESPONSE|>", "<|END_RESPONSE|>"
PRESERVED = (START_ACTION, END_ACTION, START_RESPONSE, END_RESPONSE, START_THINKING, END_THINKING)


class CommandR7B(Format):
    """The template writes ``<|END_THINKING|><|START_ACTION|>``. Its answers are read with or without tools (the
    response markers come off); a generation prompt ending in ``<|START_THINKING|>`` leaves the thinking open, and
    with thinking off the thinking block is closed (or written empty after ``<|CHATBOT_TOKEN|>``)."""

    name: ClassVar[str] = COMMAND_R7B
    reasoning: ClassVar[tuple[str, str] | None] = (START_THINKING, END_THINKING)
    always_parse: ClassVar[bool] = True

    @classmethod
    def matches(cls, source: str) -> bool:
        return "<|END_THINKING|><|START_ACTION|>" in source

    def thinking(self, prompt: str, enable_thinking: bool | None) -> tuple[str, bool]:
        if prompt.endswith(START_THINKING):
            return (prompt + END_THINKING, False) if enable_thinking is False else (prompt, True)
        if enable_thinking is False and prompt.endswith("<|CHATBOT_TOKEN|>"):
            return prompt + START_THINKING + END_THINKING, False
        return prompt, False

    def params(self, setup: ToolSetup) -> FormatParams:
        return _command_r7b(setup)

    def parse(self, text: str, final: bool) -> ChatMessage:
        return _parse_r7b(text, final)


def _command_r7b(setup: ToolSetup) -> FormatParams:
    """``<|START_ACTION|>`` then an array of calls with integer-string ids, ``<|END_ACTION|>``."""
    schemas: list[dict[str, Any]] = [{"type": "object", "properties": {
        "tool_call_id": {"type": "string", "pattern": "^[0-9]{1,10}$"},
        "tool_name": {"type": "string", "const": name}, "parameters": params},
        "required": ["tool_call_id", "tool_name", "parameters"]} for name, params in tool_names(setup.request.tools)]
    b = GrammarBuilder()
    lit = b.literal
    calls = b.add_schema("tool_calls", calls_array(schemas, setup.parallel))
    b.add_rule("root", (f"( {lit(END_THINKING)} space )? " if setup.thinking_open else "")
               + f"{lit(START_ACTION)} {calls} {lit(END_ACTION)}")
    think = (r"[\s\S]*?(<\|END_THINKING\|>\s*)" if setup.thinking_open
             else r"(?:<\|START_THINKING\|>[\s\S]*?<\|END_THINKING\|>\s*)?")
    return FormatParams(COMMAND_R7B, True, b.text(), not setup.required,
                        ((TRIGGER_PATTERN_FULL, think + r"(<\|START_ACTION\|>)[\s\S]*"),), PRESERVED)


def _call(text: str, a: int, final: bool) -> tuple[ToolCall | None, int | None]:
    """The call written as ``{"tool_call_id", "tool_name", "parameters"}`` at ``text[a]`` (None while its name is
    incomplete; its id as soon as it is there) and where the object ends."""
    found, obj_end = members(text, a, final)
    if obj_end is not None:
        json.loads(text[a:obj_end])
    spans = {k: (s, e) for k, s, e in found}
    name = string_member(text, spans, "tool_name")
    if name is None:
        if obj_end is not None:
            raise Invalid("a tool call needs a tool_name")
        return None, obj_end  # the text ends inside the array's last call
    args = raw(text, *spans["parameters"]) if "parameters" in spans else ""
    if obj_end is not None and "parameters" not in spans:
        raise Invalid("a tool call needs parameters")
    return ToolCall(name, args, string_member(text, spans, "tool_call_id") or ""), obj_end


def _parse_r7b(text: str, final: bool) -> ChatMessage:
    """The answer after its thinking block: an action (calls), a response, or plain content."""
    at = text.find(START_ACTION)
    if at >= 0:
        msg = ChatMessage(text[:at])
        end = read_calls(text, at + len(START_ACTION), final, msg, _call)
        if end is None:
            return msg
        after = expect(text, end, END_ACTION, final)
        if after is not None:
            msg.content += text[skip_ws(text, after):]
        return msg
    at = text.find(START_RESPONSE)
    if at < 0:
        return ChatMessage(text if final else text[:held_back(text, (START_ACTION, START_RESPONSE))])
    body = at + len(START_RESPONSE)
    e = text.find(END_RESPONSE, body)
    if e < 0:
        rest = text[body:]
        return ChatMessage(text[:at] + (rest if final else rest[:partial_suffix(rest, (END_RESPONSE,))]))
    return ChatMessage(text[:at] + text[body:e] + text[e + len(END_RESPONSE):])
