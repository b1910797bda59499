"""Multi-turn chat sessions: llama-cli's conversation mode.

A ``ChatSession`` keeps the history in the KV cache, and each user turn decodes only what the template adds for it
(llama.cpp's ``common_chat_format_single``: the template applied to the history with and without the new message,
the difference appended). A context shift keeps the system prompt and the chat header. Templates live in
``samplechain.chat``; each answer is a ``Decoder`` over the session's ``Sequence``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from samplechain import chat
from samplechain.chat import ChatOptions, ChatTemplate
from samplechain.chat.template import (  # noqa: F401  (the chat API's names, importable from here)
    BUILTIN_TEMPLATES,
    builtin_template_name,
    header_text,
    header_tokens,
    render,
    starts_with_bos,
)
from samplechain.params import CommonSampler, SamplingParams
from samplechain.runtime.decoding import Decoder, Rules, Timings, device_sampler, stream_text
from samplechain.runtime.sequence import Sequence as CacheSequence

if TYPE_CHECKING:
    from samplechain.runtime.context import Context
    from samplechain.runtime.generation import Model
    from samplechain.runtime.speculation import Speculation


class ChatSession:
    """A conversation with a model: ``send(text)`` streams the answer; the history lives in the KV cache."""

    def __init__(self, model: Model, params: SamplingParams | None = None, *, system_prompt: str | None = None,
                 n_ctx: int | None = None, n_predict: int = -1, context_shift: bool = True,
                 reverse_prompts: Sequence[str] = (), context: Context | None = None, template: bool = True,
                 speculation: Speculation | None = None) -> None:
        if n_predict < -1:
            raise ValueError(f"n_predict must be -1 or more, got {n_predict}")
        self.model, self.n_predict, self.context_shift = model, n_predict, context_shift
        self.reverse_prompts = tuple(r for r in reverse_prompts if r)
        self.params = params or SamplingParams()
        self.sampler = CommonSampler(self.params, model.vocab, n_vocab=model.config.n_vocab)
        self.ctx = context or model.new_context(n_ctx)
        self.ctx.clear()
        self.seq = CacheSequence(self.ctx)
        self.template = template  # False: plain text turns (llama-cli's interactive mode without a chat template)
        self.chat_template = ChatTemplate.of(model.vocab)
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.n_keep = header_tokens(model, system_prompt) if template else int(model.vocab.add_bos)
        self.pending: list[int] = []  # sampled and accepted, not yet in the cache
        self.speculation = speculation  # drafts verified by sample-and-compare: the same answers as without
        self.timings = Timings(load_ms=model.load_ms, kernel=model.transformer.kernel)

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        """The conversation's prompt through the chat layer (``chat.apply``) and the model's template."""
        options = ChatOptions(add_generation_prompt=add_generation_prompt)
        return chat.apply(self.chat_template, messages, None, options).prompt

    @property
    def n_past(self) -> int:
        return self.seq.n_past

    @property
    def history(self) -> list[int]:
        """The tokens in the cache, position by position."""
        return self.seq.tokens

    def send(self, text: str) -> Iterator[str]:
        """Add a user turn and stream the assistant's answer (which joins the history)."""
        m = self.model
        user = {"role": "user", "content": text}
        if not self.template:
            tokens = self.pending + m.tokenize(text, add_special=self.n_past == 0 and not self.pending)
        elif any(msg["role"] != "system" for msg in self.messages):
            new = self.render([*self.messages, user], True)
            past = self.render(self.messages, False)
            delta = ("\n" if past.endswith("\n") else "") + new[len(past):]  # as common_chat_format_single
            tokens = self.pending + m.tokenize(delta, add_special=False)
        else:
            new = self.render([*self.messages, user], True)
            tokens = m.tokenize(new, add_special=not starts_with_bos(m.vocab, new))
        if not tokens:
            raise ValueError("nothing to send: the turn is empty")
        self.messages.append(user)
        for tok in tokens[len(self.pending):]:
            self.sampler.accept(tok, is_generated=False)
        self.pending = []
        answer: list[str] = []
        for piece in self._answer(tokens):
            answer.append(piece)
            yield piece
        self.messages.append({"role": "assistant", "content": "".join(answer)})

    def _answer(self, tokens: list[int]) -> Iterator[str]:
        m, seq, t = self.model, self.seq, self.timings
        if len(tokens) + self.n_keep >= seq.n_ctx - 4:
            raise ValueError(f"this turn is {len(tokens)} tokens: it does not fit a context of {seq.n_ctx}")
        while not seq.has_room(len(tokens)):
            if not self.context_shift:
                raise ValueError("the context is full and context shift is off")
            if not seq.shift(self.n_keep):
                raise ValueError(f"cannot shift a context of {seq.n_past} tokens keeping {self.n_keep}: "
                                 "nothing to discard")
            m.context_shifts += 1
        start = time.perf_counter()
        rows = seq.decode(tokens)
        t.prompt_ms += (time.perf_counter() - start) * 1e3
        t.n_prompt += len(tokens)
        spec = self.speculation
        device = None if spec is not None else device_sampler(self.sampler, m.transformer.device)
        decoder = Decoder(seq, self.sampler, m.vocab,
                          Rules(self.n_predict, self.n_keep, context_shift=self.context_shift,
                                stop=self.reverse_prompts, rewind=True),
                          n_prompt=len(tokens), speculation=spec, device=device, timings=t, on_token=m.on_token)
        try:
            yield from stream_text(decoder, rows)
        finally:
            m.context_shifts += decoder.n_shifts
            self.sampler, self.pending = decoder.sampler, decoder.pending
