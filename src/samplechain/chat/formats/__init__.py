"""The chat formats, one class each, and the choice of one for a template (``detect``), in
``common_chat_templates_apply_jinja``'s order. A new format is a class in its own module, listed in ``FORMATS``."""

from __future__ import annotations

from typing import Any

from samplechain.chat.formats.base import CONTENT_ONLY, Format, FormatParams, ToolSetup
from samplechain.chat.formats.command_r7b import COMMAND_R7B, CommandR7B
from samplechain.chat.formats.deepseek_r1 import DEEPSEEK_R1, DeepSeekR1
from samplechain.chat.formats.deepseek_v3_1 import DEEPSEEK_V3_1, DeepSeekV31
from samplechain.chat.formats.firefunction_v2 import FIREFUNCTION_V2, FireFunctionV2
from samplechain.chat.formats.functionary_v3_2 import FUNCTIONARY_V3_2, FunctionaryV32
from samplechain.chat.formats.generic import GENERIC, Generic
from samplechain.chat.formats.gpt_oss import GPT_OSS, GptOss
from samplechain.chat.formats.hermes import HERMES_2_PRO, Hermes2Pro
from samplechain.chat.formats.llama3 import LLAMA_3_X, LLAMA_3_X_BUILTIN, Llama3, Llama3Builtin
from samplechain.chat.formats.mistral_nemo import MISTRAL_NEMO, MistralNemo
from samplechain.chat.formats.qwen3_coder import QWEN3_CODER_XML, Qwen3Coder
from samplechain.chat.tools import ToolRequest

__all__ = ["COMMAND_R7B", "CONTENT_ONLY", "DEEPSEEK_R1", "DEEPSEEK_V3_1", "FIREFUNCTION_V2", "FORMATS",
           "FUNCTIONARY_V3_2", "GENERIC", "GPT_OSS", "HERMES_2_PRO", "LLAMA_3_X", "LLAMA_3_X_BUILTIN", "MISTRAL_NEMO",
           "QWEN3_CODER_XML", "Format", "FormatParams", "ToolSetup", "by_name", "detect"]

# formats tried before llama.cpp's generic fallback for tools mixed with a response schema, in its order; those in
# NO_SCHEMA give way to a response schema (it checks ``json_schema.is_null()`` for them)
FIRST: tuple[type[Format], ...] = (DeepSeekV31, DeepSeekR1, CommandR7B, Qwen3Coder, Hermes2Pro, GptOss)
NO_SCHEMA: tuple[type[Format], ...] = (DeepSeekV31, DeepSeekR1, CommandR7B, Hermes2Pro)
# formats whose template implies them even without tools (their prompt and thinking block matter then too), in
# the order llama.cpp tries them after the generic fallback; then those used only with active tools
ALWAYS: tuple[type[Format], ...] = (FunctionaryV32, FireFunctionV2, Llama3Builtin, Llama3)
WITH_TOOLS: tuple[type[Format], ...] = (MistralNemo,)
FORMATS: tuple[type[Format], ...] = (Format, Generic, *FIRST, *ALWAYS, *WITH_TOOLS)
_BY_NAME = {f.name: f for f in FORMATS}


def by_name(name: str, syntax: Any = None) -> Format:
    """The format called ``name`` (``FormatParams.name``; an unknown name is content-only), reading with
    ``syntax`` (a ``ChatSyntax``: the tools' string parameters, the reasoning settings)."""
    return _BY_NAME.get(name, Format)(syntax)


def detect(source: str, request: ToolRequest | None, json_schema: Any) -> Format:
    """The chat format for a template's source and the request's tools (``common_chat_templates_apply_jinja``)."""
    for fmt in FIRST:
        if fmt.matches(source) and (json_schema is None or fmt not in NO_SCHEMA):
            return fmt()
    if request is not None and json_schema is not None:
        return Generic()  # tools mixed with a response schema
    for fmt in ALWAYS:
        if fmt.matches(source):
            return fmt()
    if request is None or request.choice == "none":
        return Format()
    for fmt in WITH_TOOLS:
        if fmt.matches(source):
            return fmt()
    return Generic()
