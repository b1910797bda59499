"""What a chat format is: one class that says when a template uses it (``matches``), what it adds to a request
(``params``: the grammar with its triggers and preserved tokens, stops, template variables) and how its output is
read (``parse``), as llama.cpp's ``common/chat.cpp`` has one ``common_chat_params_init_*`` and one parser per format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from samplechain.chat.messages import ChatMessage, tool_call_id
from samplechain.chat.tools import ToolRequest

CONTENT_ONLY = "Content-only"


@dataclass(frozen=True)
class FormatParams:
    """What a chat format adds to a request: its grammar (lazy or not) with triggers and preserved tokens, extra
    stop strings, and whether the output is parsed for tool calls (``common_chat_params``)."""

    name: str = CONTENT_ONLY
    parse_tools: bool = False
    grammar: str = ""
    grammar_lazy: bool = False
    triggers: tuple[tuple[int, str], ...] = ()  # (TRIGGER_*, value)
    preserved_tokens: tuple[str, ...] = ()
    stops: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolSetup:
    """A request's active tools as a format's ``params`` sees them: the tools, whether a call is required (the
    grammar applies from the first token), whether several calls may follow each other, the response schema (the
    generic format folds it in) and whether the prompt leaves the thinking block open."""

    request: ToolRequest
    required: bool
    parallel: bool
    json_schema: Any = None
    thinking_open: bool = False


class Format:
    """A chat format. Subclasses set ``name`` and override what differs; the base is llama.cpp's content-only
    format: no grammar, the answer is content (after the reasoning block, when there is one)."""

    name: ClassVar[str] = CONTENT_ONLY
    reasoning: ClassVar[tuple[str, str] | None] = ("<think>", "</think>")  # the thinking block's tags
    system: ClassVar[str] = ""  # a line the format adds to the system prompt when tools are active
    closes: ClassVar[str] = ""  # the prompt's end that the format closes when thinking is off (e.g. "<think>\n")
    always_parse: ClassVar[bool] = False  # its output is parsed even without tools (e.g. harmony's channels)
    template_tools: ClassVar[bool] = True  # the template gets the tools (FireFunction's gets them as a variable)

    def __init__(self, syntax: Any = None) -> None:
        self.syntax = syntax  # the ChatSyntax a parse reads with (None when only preparing a request)

    @classmethod
    def matches(cls, source: str) -> bool:
        """Whether a template's source implies this format."""
        return False

    def variables(self, request: ToolRequest | None) -> dict[str, Any]:
        """Extra template variables (with or without active tools)."""
        return {}

    def thinking(self, prompt: str, enable_thinking: bool | None) -> tuple[str, bool]:
        """The prompt and whether it leaves the thinking block open (the generation prompt ends with its start
        tag, whitespace aside); with thinking off, a prompt ending exactly in ``closes`` gets the end tag (the
        template opened the block whatever ``enable_thinking`` said)."""
        if self.reasoning is None:
            return prompt, False
        start, end = self.reasoning
        if self.closes and enable_thinking is False and prompt.endswith(self.closes):
            return prompt + end, False
        return prompt, prompt.rstrip().endswith(start)

    def new_id(self) -> str:
        """A tool call's id when the model writes none (llama-server's ``gen_tool_call_id``)."""
        return tool_call_id()

    def params(self, setup: ToolSetup) -> FormatParams:
        """The grammar, triggers, preserved tokens and stops for active tools."""
        return FormatParams(self.name)

    def parse(self, text: str, final: bool) -> ChatMessage:
        """The answer (its reasoning already split off) as content and tool calls; ``final`` False: the text so far
        of a stream, where text that may still become a call is held back. Raises ``ValueError`` when a final text
        does not have the format's shape (the caller keeps it all as content)."""
        return ChatMessage(text)
