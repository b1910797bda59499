"""Chat templates (the GGUF's, or a built-in one detected from the vocabulary) and multi-turn chat sessions.

A ``ChatSession`` is llama-cli's conversation mode: the history stays in the KV cache, and each user turn decodes
only what the template adds for it (llama.cpp's ``common_chat_format_single``: the template applied to the history
with and without the new message, the difference appended). A context shift keeps the system prompt and the chat
header.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from samplechain.params import CommonSampler, SamplingParams
from samplechain.vocab import Vocab

if TYPE_CHECKING:
    from samplechain.runtime.context import Context
    from samplechain.runtime.generation import Model, Timings
    from samplechain.runtime.speculation import Speculation

# llama.cpp's built-in templates for models whose GGUF has none, chosen by the turn markers the vocabulary has
BUILTIN_TEMPLATES = {
    # Gemma: no system role; a system message is prepended to the first user turn; the assistant is "model"
    "gemma": (
        "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}"
        "{% set first = messages[0]['content'] + '\n\n' %}{% set rest = messages[1:] %}"
        "{% else %}{% set first = '' %}{% set rest = messages %}{% endif %}"
        "{% for message in rest %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{ '<start_of_turn>' + role + '\n' + (first if loop.first else '') + message['content'] | trim"
        " + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
    ),
    # ChatML, llama.cpp's default
    "chatml": (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
        " + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
}


def builtin_template_name(vocab: Vocab) -> str:
    """The built-in template for a vocabulary without one: Gemma's turn markers, else ChatML (llama.cpp's default)."""
    texts = {vocab.token_bytes(i) for i in vocab.special}
    if b"<start_of_turn>" in texts and b"<end_of_turn>" in texts:
        return "gemma"
    return "chatml"


def render(template: str, vocab: Vocab, messages: Sequence[dict[str, str]], add_generation_prompt: bool) -> str:
    """A chat template (jinja2, sandboxed) applied to ``messages``."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(f"chat template: {message}")

    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"a chat message needs a string role and content, got {m!r}")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt,
            bos_token=vocab.token_bytes(vocab.bos).decode() if vocab.bos is not None else "",
            eos_token=vocab.token_bytes(vocab.eos).decode() if vocab.eos is not None else "")
    except TemplateError as e:
        raise ValueError(f"chat template failed: {e}") from e


def header_text(model: Model, system: str | None) -> str:
    """The text every conversation with this system prompt starts with: the system turn and the chat header (the
    common prefix of two different first user turns). A context shift keeps it."""
    msgs = [{"role": "system", "content": system}] if system else []
    a = model.apply_chat_template([*msgs, {"role": "user", "content": "A"}])
    b = model.apply_chat_template([*msgs, {"role": "user", "content": "B"}])
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def header_tokens(model: Model, system: str | None) -> int:
    """How many cache positions ``header_text`` takes at the start of a conversation (BOS included)."""
    text = header_text(model, system)
    return len(model.tokenize(text, add_special=not starts_with_bos(model.vocab, text)))


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
        self.template = template  # False: plain text turns (llama-cli's interactive mode without a chat template)
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.n_keep = header_tokens(model, system_prompt) if template else int(model.vocab.add_bos)
        self.n_past = 0
        self.pending: list[int] = []  # sampled and accepted, not yet in the cache
        self.history: list[int] = []  # the tokens in the cache, position by position (kept for the drafters)
        self.speculation = speculation  # drafts verified by sample-and-compare: the same answers as without
        self.timings: Timings = model.timings.__class__(load_ms=model.load_ms, kernel=model.transformer.kernel)

    def send(self, text: str) -> Iterator[str]:
        """Add a user turn and stream the assistant's answer (which joins the history)."""
        m = self.model
        user = {"role": "user", "content": text}
        if not self.template:
            tokens = self.pending + m.tokenize(text, add_special=self.n_past == 0 and not self.pending)
        elif any(msg["role"] != "system" for msg in self.messages):
            new = m.apply_chat_template([*self.messages, user])
            past = m.apply_chat_template(self.messages, add_generation_prompt=False)
            delta = ("\n" if past.endswith("\n") else "") + new[len(past):]  # as common_chat_format_single
            tokens = self.pending + m.tokenize(delta, add_special=False)
        else:
            new = m.apply_chat_template([*self.messages, user])
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
        m, ctx, t = self.model, self.ctx, self.timings
        if len(tokens) + self.n_keep >= ctx.n_ctx - 4:
            raise ValueError(f"this turn is {len(tokens)} tokens: it does not fit a context of {ctx.n_ctx}")
        while self.n_past + len(tokens) >= ctx.n_ctx:
            if not self.context_shift:
                raise ValueError("the context is full and context shift is off")
            n_past = ctx.context_shift(self.n_past, self.n_keep)
            del self.history[self.n_keep:self.n_keep + self.n_past - n_past]
            self.n_past = n_past
            m.context_shifts += 1
        start = time.perf_counter()
        logits = ctx.decode(tokens, positions=range(self.n_past, self.n_past + len(tokens)))[-1]
        t.prompt_ms += (time.perf_counter() - start) * 1e3
        t.n_prompt += len(tokens)
        self.n_past += len(tokens)
        self.history += tokens
        if self.speculation is not None:
            self.speculation.begin(self.history)
            state = yield from m._speculative_loop(ctx, self.sampler, logits, self.history, self.n_keep,
                                                   self.n_predict, self.context_shift, t, self.speculation,
                                                   self.reverse_prompts, rewind=True)
            self.n_past, self.pending, self.sampler = state
            return
        device_sampler = m._device_sampler(self.sampler)
        state = yield from m._decode_loop(ctx, self.sampler, device_sampler, logits, self.n_past, self.n_keep,
                                          self.n_predict, self.context_shift, t, self.reverse_prompts)
        self.n_past, self.pending = state


def starts_with_bos(vocab: Vocab, text: str) -> bool:
    return vocab.bos is not None and text.startswith(vocab.token_bytes(vocab.bos).decode("utf-8", "replace"))
