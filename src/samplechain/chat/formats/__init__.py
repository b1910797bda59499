"""The chat formats, one class each, and the choice of one for a template (``detect``), in
``common_chat_templates_apply_jinja``'s order. A new format is a class in its own module, listed in ``FORMATS``."""

from __future__ import annotations

from typing import Any

from samplechain.chat.formats.base import CONTENT_ONLY, Format, FormatParams, ToolSetup
from samplechain.chat.formats.generic import GENERIC, Generic
from samplechain.chat.formats.hermes import HERMES_2_PRO, Hermes2Pro
from samplechain.chat.formats.llama3 import LLAMA_3_X, LLAMA_3_X_BUILTIN, Llama3, Llama3Builtin
from samplechain.chat.formats.mistral_nemo import MISTRAL_NEMO, MistralNemo
from samplechain.chat.tools import ToolRequest

__all__ = ["CONTENT_ONLY", "FORMATS", "GENERIC", "HERMES_2_PRO", "LLAMA_3_X", "LLAMA_3_X_BUILTIN", "MISTRAL_NEMO",
           "Format", "FormatParams", "ToolSetup", "by_name", "detect"]

# formats whose template implies them even without tools (their prompt and thinking block matter then too), in
# the order llama.cpp tries them; then those used only with active tools
ALWAYS: tuple[type[Format], ...] = (Llama3Builtin, Llama3)
WITH_TOOLS: tuple[type[Format], ...] = (MistralNemo,)
FORMATS: tuple[type[Format], ...] = (Format, Generic, Hermes2Pro, *ALWAYS, *WITH_TOOLS)
_BY_NAME = {f.name: f for f in FORMATS}


def by_name(name: str) -> Format:
    """The format called ``name`` (``FormatParams.name``); an unknown name is content-only."""
    return _BY_NAME.get(name, Format)()


def detect(source: str, request: ToolRequest | None, json_schema: Any) -> Format:
    """The chat format for a template's source and the request's tools (``common_chat_templates_apply_jinja``)."""
    if Hermes2Pro.matches(source) and json_schema is None:
        return Hermes2Pro()
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
