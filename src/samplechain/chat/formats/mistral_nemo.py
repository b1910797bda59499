"""Mistral Nemo's tool calls (``common_chat_params_init_mistral_nemo``): ``[TOOL_CALLS]`` then an array of
``{"name", "arguments", "id"}`` with 9-character ids."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from samplechain.chat.formats.base import Format, FormatParams, ToolSetup
from samplechain.chat.formats.scan import calls_array, read_calls
from samplechain.chat.json_scan import held_back, skip_ws
from samplechain.chat.messages import ChatMessage, random_id
from samplechain.chat.tools import tool_names
from samplechain.grammar.json_schema import GrammarBuilder
from samplechain.params.checks import TRIGGER_WORD

MISTRAL_NEMO = "Mistral Nemo"


class MistralNemo(Format):
    """``[TOOL_CALLS][...]``: the template writes ``[TOOL_CALLS]``."""

    name: ClassVar[str] = MISTRAL_NEMO

    @classmethod
    def matches(cls, source: str) -> bool:
        return "[TOOL_CALLS]" in source

    def new_id(self) -> str:
        """9 alphanumerics: Mistral's templates refuse other ids when the call comes back in the history (a stream
        fixes a call's id before the model writes its own, which comes after the arguments)."""
        return random_id(9)

    def params(self, setup: ToolSetup) -> FormatParams:
        return _mistral_nemo(setup.request.tools, setup.required, setup.parallel)

    def parse(self, text: str, final: bool) -> ChatMessage:
        return _parse_nemo(text, final)


def _mistral_nemo(tools: Sequence[Mapping[str, Any]], required: bool, parallel: bool) -> FormatParams:
    """``[TOOL_CALLS]`` then an array of calls with 9-character ids."""
    schemas = [{"type": "object", "properties": {
        "name": {"type": "string", "const": name}, "arguments": params,
        "id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}}, "required": ["name", "arguments", "id"]}
        for name, params in tool_names(tools)]
    b = GrammarBuilder()
    b.add_rule("root", f'{b.literal("[TOOL_CALLS]")} {b.add_schema("tool_calls", calls_array(schemas, parallel))}')
    return FormatParams(MISTRAL_NEMO, True, b.text(), not required, ((TRIGGER_WORD, "[TOOL_CALLS]"),),
                      ("[TOOL_CALLS]",))


def _parse_nemo(text: str, final: bool) -> ChatMessage:
    at = text.find("[TOOL_CALLS]")
    if at < 0:
        return ChatMessage(text if final else text[:held_back(text, ("[TOOL_CALLS]",))])
    msg = ChatMessage(text[:at])
    end = read_calls(text, at + len("[TOOL_CALLS]"), final, msg)
    if end is not None:
        msg.content += text[skip_ws(text, end):]
    return msg
