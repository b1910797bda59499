"""Chat templates: the GGUF's own (jinja2, sandboxed), or llama.cpp's built-in one for the vocabulary's turn markers,
and the conversation header a context shift keeps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from samplechain.vocab import Vocab


class Templating(Protocol):
    """What the header helpers need of a model."""

    vocab: Vocab

    def apply_chat_template(self, messages: Sequence[dict[str, str]] | str,
                            add_generation_prompt: bool = True) -> str: ...

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]: ...


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


def header_text(model: Templating, system: str | None) -> str:
    """The text every conversation with this system prompt starts with: the system turn and the chat header (the
    common prefix of two different first user turns). A context shift keeps it."""
    msgs = [{"role": "system", "content": system}] if system else []
    a = model.apply_chat_template([*msgs, {"role": "user", "content": "A"}])
    b = model.apply_chat_template([*msgs, {"role": "user", "content": "B"}])
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def header_tokens(model: Templating, system: str | None) -> int:
    """How many cache positions ``header_text`` takes at the start of a conversation (BOS included)."""
    text = header_text(model, system)
    return len(model.tokenize(text, add_special=not starts_with_bos(model.vocab, text)))


def apply_template(vocab: Vocab, messages: Sequence[dict[str, str]] | str, add_generation_prompt: bool = True) -> str:
    """The vocabulary's chat template (jinja2, sandboxed) applied to ``messages`` (or one user message). A GGUF
    without a template gets llama.cpp's built-in one for its turn markers (Gemma's, else ChatML)."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    template = vocab.chat_template or BUILTIN_TEMPLATES[builtin_template_name(vocab)]
    return render(template, vocab, messages, add_generation_prompt)


def starts_with_bos(vocab: Vocab, text: str) -> bool:
    return vocab.bos is not None and text.startswith(vocab.token_bytes(vocab.bos).decode("utf-8", "replace"))
