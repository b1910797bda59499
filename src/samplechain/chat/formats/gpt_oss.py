"""GPT-OSS's harmony messages (``common_chat_params_init_gpt_oss`` / ``common_chat_parse_gpt_oss``): channels
``<|channel|>analysis<|message|>...<|end|>`` (reasoning), ``<|channel|>final<|message|>...`` and
``<|channel|>commentary<|message|>...`` (content), and tool calls addressed ``to=functions.NAME`` in the role or the
channel header, ``<|constrain|>json<|message|>{args}``; messages follow each other after ``<|start|>assistant``."""

from __future__ import annotations

import re
from typing import ClassVar

from samplechain.chat.formats.base import Format, FormatParams, ToolSetup
from samplechain.chat.formats.scan import json_args, partial_suffix
from samplechain.chat.json_scan import Invalid
from samplechain.chat.messages import ChatMessage, ToolCall
from samplechain.chat.tools import tool_names
from samplechain.grammar.json_schema import GrammarBuilder
from samplechain.params.checks import TRIGGER_PATTERN, TRIGGER_PATTERN_FULL

GPT_OSS = "GPT-OSS"
PRESERVED = ("<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>")


class GptOss(Format):
    """The template writes ``<|channel|>``. Its output is always read by channel (reasoning included), with or
    without tools."""

    name: ClassVar[str] = GPT_OSS
    reasoning: ClassVar[tuple[str, str] | None] = None
    always_parse: ClassVar[bool] = True

    @classmethod
    def matches(cls, source: str) -> bool:
        return "<|channel|>" in source

    def params(self, setup: ToolSetup) -> FormatParams:
        return _gpt_oss(setup)

    def parse(self, text: str, final: bool) -> ChatMessage:
        return _parse_harmony(text, final)


def _gpt_oss(setup: ToolSetup) -> FormatParams:
    """A call addressed in the role (``<|start|>assistant to=functions.NAME<|channel|>commentary``) or in the channel
    (``<|channel|>commentary to=functions.NAME``); not lazy (``required``), analysis and commentary messages may
    come first."""
    b = GrammarBuilder()
    lit = b.literal
    channel = b.add_rule("channel", f'{lit("<|channel|>")} ( {lit("commentary")} | {lit("analysis")} )')
    in_role, in_channel = [], []
    for name, params in tool_names(setup.request.tools):
        args = b.add_schema(f"{name}-args", params, params)
        in_role.append(b.add_rule(f"{name}-call", f'{lit(name)} {channel} {lit(" <|constrain|>json")}? '
                                  f'{lit("<|message|>")} {args}'))
        in_channel.append(b.add_rule(f"{name}-call", f'{lit(name)} {lit(" <|constrain|>json")}? '
                                     f'{lit("<|message|>")} {args}'))
    recipient_in_channel = b.add_rule("recipient_in_channel",
                                      f'{channel} {lit(" to=functions.")} ( {" | ".join(in_channel)} )')
    lazy = not setup.required
    if lazy:
        recipient_in_role = b.add_rule("recipient_in_role", f'{lit("<|start|>assistant")}? {lit(" to=functions.")} '
                                       f'( {" | ".join(in_role)} )')
        b.add_rule("root", f"{recipient_in_role} | {recipient_in_channel}")
    else:
        not_end = b.add_rule("not-end", '[^<] | "<" [^|] | "<|" [^e] | "<|e" [^n] | "<|en" [^d] | "<|end" [^|] | '
                             '"<|end|" [^>]')
        analysis = b.add_rule("analysis", f'{lit("<|channel|>analysis<|message|>")} ( {not_end} )* {lit("<|end|>")}')
        commentary = b.add_rule("commentary",
                                f'{lit("<|channel|>commentary<|message|>")} ( {not_end} )* {lit("<|end|>")}')
        recipient_in_role = b.add_rule("recipient_in_role", f'{lit(" to=functions.")} ( {" | ".join(in_role)} )')
        start = lit("<|start|>assistant")
        b.add_rule("root", f"( {analysis} {start} )? ( {commentary} {start} )? "
                           f"( {recipient_in_role} | {recipient_in_channel} )")
    triggers = ((TRIGGER_PATTERN, r"<\|channel\|>(commentary|analysis) to"), (TRIGGER_PATTERN_FULL, "^ to"),
                (TRIGGER_PATTERN, r"<\|start\|>assistant to"))
    return FormatParams(GPT_OSS, True, b.text(), lazy, triggers, PRESERVED)


_CONSTRAINT = r"(?: (<\|constrain\|>)?([a-zA-Z0-9_-]+))"
_RECIPIENT = r"(?: to=functions\.([^<\s]+))"
_TOOL_IN_ROLE = re.compile(_RECIPIENT + r"<\|channel\|>(analysis|commentary)" + _CONSTRAINT + "?")
_TOOL_IN_CHANNEL = re.compile(r"<\|channel\|>(analysis|commentary)" + _RECIPIENT + _CONSTRAINT + "?")
_ANALYSIS = re.compile(r"<\|channel\|>analysis")
_CONTENT = re.compile(r"<\|channel\|>final" + _CONSTRAINT + r"?|<\|channel\|>commentary")
_MESSAGE, _END, _START = "<|message|>", "<|end|>", "<|start|>assistant"


def _parse_harmony(text: str, final: bool) -> ChatMessage:
    """Each message by its header: a call's JSON arguments, the analysis channel as reasoning, final and commentary
    as content (each up to ``<|end|>``); then the next ``<|start|>assistant``. Text after the last message is
    dropped, as llama.cpp drops it."""
    msg = ChatMessage()
    pos = 0
    while True:
        k = text.find(_MESSAGE, pos)
        if k < 0:
            if final:
                raise Invalid("incomplete header")
            return msg
        header, body = text[pos:k], k + len(_MESSAGE)
        tool = _TOOL_IN_ROLE.fullmatch(header) or _TOOL_IN_CHANNEL.fullmatch(header)
        if tool is not None:
            name = tool.group(1) if tool.re is _TOOL_IN_ROLE else tool.group(2)
            args, end = json_args(text, body, final)
            msg.tool_calls.append(ToolCall(name, args))
            if end is None:
                return msg
            pos = end
        elif _ANALYSIS.fullmatch(header) or _CONTENT.fullmatch(header):
            e = text.find(_END, body)
            part = text[body:e] if e >= 0 else text[body:]
            if e < 0 and not final:
                part = part[:partial_suffix(part, (_END,))]
            if _ANALYSIS.fullmatch(header):
                msg.reasoning_content += part
            else:
                msg.content += part
            if e < 0:
                return msg
            pos = e + len(_END)
        s = text.find(_START, pos)
        if s < 0:
            return msg
        pos = s + len(_START)
