"""Reading a chat answer: ``parse(text, syntax, partial)`` gives its reasoning, content and tool calls
(``common_chat_parse``); ``MessageStream`` does it as the text streams in and gives the differences since the last
update (``common_chat_msg_diff``), which each wire protocol turns into its own events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from samplechain.chat.formats import CONTENT_ONLY, by_name
from samplechain.chat.messages import ChatMessage, ToolCall
from samplechain.chat.reasoning import ReasoningSplitter
from samplechain.chat.tools import tool_names


@dataclass(frozen=True)
class ChatSyntax:
    """How an answer is read: its format (by name), whether the format parses it (tool calls, channels), the
    thinking block's tags, whether the reasoning is split off the content (``reasoning_format`` other than
    ``none``) and whether the prompt left the thinking block open."""

    format: str = CONTENT_ONLY
    parse: bool = False
    tags: tuple[str, str] = ("<think>", "</think>")
    extract_reasoning: bool = True
    thinking_open: bool = False
    string_args: frozenset[tuple[str, str]] = frozenset()  # (tool, parameter) pairs whose schema type is string

    @staticmethod
    def strings_of(tools: Any) -> frozenset[tuple[str, str]]:
        """The (tool, parameter) pairs of ``tools`` (a ``ToolRequest``'s) whose schema says ``"type": "string"``:
        formats that write parameters as text read those as strings, the others as JSON (Qwen3-Coder's XML)."""
        out = set()
        for name, params in tool_names(tools):
            for key, schema in (params.get("properties") or {}).items():
                if isinstance(schema, dict) and schema.get("type") == "string":
                    out.add((name, key))
        return frozenset(out)

    def new_id(self) -> str:
        """A tool call's id, in the format's shape, for a call the model wrote none for."""
        return by_name(self.format).new_id()

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.extract_reasoning, self.thinking_open, self.tags)


def parse_content(syntax: ChatSyntax, text: str, partial: bool = False) -> ChatMessage:
    """``text`` (the answer with its reasoning split off) as content and tool calls in the syntax's format. A final
    text that does not have the format's shape is all content, without calls; a partial one gives nothing yet."""
    msg = _parsed(syntax, text, partial)
    if msg is None:
        return ChatMessage() if partial else ChatMessage(text)
    return msg


def _parsed(syntax: ChatSyntax, text: str, partial: bool) -> ChatMessage | None:
    """The format's reading of ``text``, or None where the text does not have its shape."""
    if not syntax.parse:
        return ChatMessage(text)
    try:
        return by_name(syntax.format, syntax).parse(text, not partial)
    except (ValueError, RecursionError):  # json_scan.Invalid, JSON that does not decode, or nests past Python's stack
        return None


def parse(text: str, syntax: ChatSyntax, partial: bool = False) -> ChatMessage:
    """The whole answer ``text`` as reasoning, content and tool calls (``partial``: the text so far of a stream;
    what may still be a tag or a call is held back)."""
    splitter = syntax.splitter()
    thought, content = splitter.push(text, final=not partial)
    if not partial and splitter.state == "think":
        calls = _unclosed_calls(syntax, thought)
        if calls is not None:
            return calls
    msg = parse_content(syntax, content, partial)
    msg.reasoning_content = thought + msg.reasoning_content
    return msg


def _unclosed_calls(syntax: ChatSyntax, thought: str) -> ChatMessage | None:
    """An answer the prompt opened the thinking block for, that never closed it but is tool calls in the format
    (its grammar lets the end tag out, and a small model does): the calls, not a reasoning that holds them (llama.cpp
    keeps an unclosed block as reasoning; its DeepSeek V3.1 parser reads it as content)."""
    if not syntax.parse:
        return None
    msg = _parsed(syntax, thought, False)
    return msg if msg is not None and msg.tool_calls else None


@dataclass
class MessageDiff:
    """What one update added to a streamed answer: reasoning text, content text, or a tool call's piece (its index;
    id and name on the call's first piece, ``header``; then argument text)."""

    reasoning: str = ""
    content: str = ""
    tool_index: int = -1
    tool_id: str = ""
    tool_name: str = ""
    tool_arguments: str = ""
    header: bool = False


class MessageStream:
    """One answer as it streams: ``update(text)`` gives the ``MessageDiff``s since the last update, and ``msg`` is
    the answer so far. Ids are fixed when a call first appears (the model's, else a random one), so the stream's
    ids are the final message's (``task_result_state::update_chat_msg``)."""

    def __init__(self, syntax: ChatSyntax) -> None:
        self.syntax = syntax
        self.splitter = syntax.splitter()
        self.content = ""  # the answer's text after the reasoning block
        self.thought = ""
        self.msg = ChatMessage()
        self.ids: list[str] = []

    def update(self, text: str, final: bool = False) -> list[MessageDiff]:
        """The differences after ``text`` more of the answer (``final``: the answer is complete)."""
        thought, content = self.splitter.push(text, final=final)
        self.thought += thought
        prev = self.msg
        if not self.syntax.parse:
            new = ChatMessage(prev.content + content, reasoning_content=self.thought)
        else:
            self.content += content
            parsed = _parsed(self.syntax, self.content, not final)
            if parsed is None and final and prev.tool_calls:
                # cut inside a call (max_tokens): what was streamed stands; the raw text is not sent again as content
                parsed = ChatMessage(prev.content, prev.tool_calls, reasoning_content="")
            new = parsed if parsed is not None else ChatMessage() if not final else ChatMessage(self.content)
            new.reasoning_content = self.thought + new.reasoning_content
        if final and self.syntax.parse and self.splitter.state == "think" and not prev.tool_calls:
            calls = _unclosed_calls(self.syntax, self.thought)
            if calls is not None:  # the reasoning streamed stands; the calls follow it
                new = ChatMessage("", calls.tool_calls, reasoning_content=self.thought)
        out = []
        if new.reasoning_content != prev.reasoning_content and new.reasoning_content.startswith(
                prev.reasoning_content):
            out.append(MessageDiff(reasoning=new.reasoning_content[len(prev.reasoning_content):]))
            prev.reasoning_content = new.reasoning_content
        if not final and (not new.content.startswith(prev.content) or len(new.tool_calls) < len(prev.tool_calls)):
            return out  # undecided: wait for more text
        for i, tc in enumerate(new.tool_calls):
            if i == len(self.ids):
                self.ids.append(tc.id or self.syntax.new_id())
            tc.id = self.ids[i]
        self.msg = new
        if new.content != prev.content and new.content.startswith(prev.content):
            out.append(MessageDiff(content=new.content[len(prev.content):]))
        if prev.tool_calls and len(new.tool_calls) >= len(prev.tool_calls):
            i = len(prev.tool_calls) - 1
            a, b = prev.tool_calls[i], new.tool_calls[i]
            grown = b.arguments[len(a.arguments):] if b.arguments.startswith(a.arguments) else ""
            if grown or a.name != b.name:
                out.append(_call_diff(i, b, grown, header=a.name != b.name))
        for i in range(len(prev.tool_calls), len(new.tool_calls)):
            out.append(_call_diff(i, new.tool_calls[i], new.tool_calls[i].arguments, header=True))
        return out


def _call_diff(index: int, call: ToolCall, arguments: str, header: bool) -> MessageDiff:
    return MessageDiff(tool_index=index, tool_id=call.id if header else "", tool_name=call.name if header else "",
                       tool_arguments=arguments, header=header)
