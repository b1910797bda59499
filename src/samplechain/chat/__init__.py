"""The chat layer, as llama.cpp's ``common/chat.*`` is one layer: chat templates (``template``: jinja and llama.cpp's
built-in ones, one probe), the chat formats (``formats``: one class each), and two verbs:

- ``apply(template, messages, tools, options) -> ChatParams``: the prompt, the generation prompt, the format's
  grammar (lazy, with triggers and preserved tokens), its stops, and how to read the answer (``ChatSyntax``);
- ``parse(text, syntax, partial) -> ChatMessage``: reasoning, content and tool calls; ``MessageStream`` does it
  incrementally for streams, as ``MessageDiff``s.

The wire protocols (OpenAI Chat, Anthropic Messages, OpenAI Responses), the CLI's conversation mode and
``ChatSession`` call it; nothing else knows a tag."""

from samplechain.chat.apply import ChatOptions, ChatParams, apply
from samplechain.chat.formats import FormatParams
from samplechain.chat.messages import ChatMessage, ToolCall, normalize_messages, tool_call_id
from samplechain.chat.parse import ChatSyntax, MessageDiff, MessageStream, parse
from samplechain.chat.template import ChatTemplate, render
from samplechain.chat.tools import ToolRequest, parse_tool_request

__all__ = ["ChatMessage", "ChatOptions", "ChatParams", "ChatSyntax", "ChatTemplate", "FormatParams", "MessageDiff",
           "MessageStream", "ToolCall", "ToolRequest", "apply", "normalize_messages", "parse", "parse_tool_request",
           "render", "tool_call_id"]
