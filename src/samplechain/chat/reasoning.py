"""The reasoning block of a thinking model's answer, split off as text streams in."""

from __future__ import annotations


class ReasoningSplitter:
    """Splits a thinking model's ``<think> ... </think>`` block (its format's tags) off the answer, as text
    streams in (llama.cpp's ``try_parse_reasoning``).

    ``started`` says the prompt already opened the block (a generation prompt ending in the start tag)."""

    def __init__(self, enabled: bool, started: bool = False, tags: tuple[str, str] = ("<think>", "</think>")) -> None:
        self.START, self.END = tags
        self.enabled = enabled
        self.state = "think" if enabled and started else ("start" if enabled else "content")
        self.pending = ""

    def push(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning, content) released by this text; text that may be a partial tag is held back."""
        if self.state == "content":
            return "", text
        self.pending += text
        thought, content = "", ""
        while True:
            if self.state == "start":
                stripped = self.pending.lstrip()
                if stripped.startswith(self.START):
                    self.pending = stripped[len(self.START):]
                    self.state = "think"
                    continue
                if not final and self.START.startswith(stripped):
                    return thought, content  # maybe the start tag, still coming
                self.state, content, self.pending = "content", content + self.pending, ""
                return thought, content
            if self.state == "think":
                at = self.pending.find(self.END)
                if at >= 0:
                    thought += self.pending[:at]
                    self.pending = self.pending[at + len(self.END):].lstrip("\n")
                    self.state = "content"
                    content += self.pending
                    self.pending = ""
                    return thought, content
                keep = 0 if final else _partial_suffix(self.pending, self.END)
                thought += self.pending[:len(self.pending) - keep]
                self.pending = self.pending[len(self.pending) - keep:]
                return thought, content
            return thought, content + self.pending


def _partial_suffix(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
