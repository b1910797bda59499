# ruff: noqa: RUF001, RUF002  (DeepSeek's markers are full-width characters)
"""DeepSeek V3.1's tool calls (``common_chat_params_init_deepseek_v3_1`` / ``common_chat_parse_deepseek_v3_1``):
``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>``;
thinking ends with ``</think>`` (the generation prompt opens it with ``<think>`` when thinking is on)."""

from __future__ import annotations

import re
from typing import ClassVar

from samplechain.chat.formats.base import Format, FormatParams, ToolSetup
from samplechain.chat.formats.deepseek_r1 import block_params, parse_block
from samplechain.chat.messages import ChatMessage

DEEPSEEK_V3_1 = "DeepSeek V3.1"


class DeepSeekV31(Format):
    """The template reads ``message['prefix']`` with ``thinking`` (its ``thinking`` defaults to llama.cpp's
    ``enable_thinking``, which the renderer passes). A generation prompt ending in ``<think>`` leaves the thinking
    block open."""

    name: ClassVar[str] = DEEPSEEK_V3_1

    @classmethod
    def matches(cls, source: str) -> bool:
        return "message['prefix'] is defined and message['prefix'] and thinking" in source

    closes: ClassVar[str] = "<think>"

    def params(self, setup: ToolSetup) -> FormatParams:
        return block_params(self.name, setup, lambda name: f"{name}<｜tool▁sep｜>", "<｜tool▁call▁end｜>")

    def parse(self, text: str, final: bool) -> ChatMessage:
        return parse_block(text, final, _FUNCTION, _CLOSE)


_FUNCTION = re.compile(r"(?:<｜tool▁call▁begin｜>)?([^\n<]+)(?:<｜tool▁sep｜>)")
_CLOSE = re.compile(r"(?:[\s]*)?<｜tool▁call▁end｜>")
