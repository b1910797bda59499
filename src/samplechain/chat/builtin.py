# ruff: noqa: RUF001  (DeepSeek's turn markers are full-width characters)
"""llama.cpp's built-in chat templates (``src/llama-chat.cpp``: ``llm_chat_detect_template`` /
``llm_chat_apply_template``), for GGUFs without a jinja template and for ``--no-jinja``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from samplechain.chat.messages import join_parts, normalize_messages
from samplechain.vocab import Vocab


def detect_builtin(template: str) -> str | None:
    """The built-in template llama.cpp's ``llm_chat_detect_template`` picks for a template's name or jinja source
    (``None``: unknown). Names it detects that ``BUILTINS`` lacks are returned too (``apply_builtin`` refuses them)."""
    if template in BUILTIN_NAMES:
        return template

    def has(s: str) -> bool:
        return s in template

    if has("<|im_start|>"):
        return "phi4" if has("<|im_sep|>") else "smolvlm" if has("<end_of_utterance>") else "chatml"
    if template.startswith("mistral") or has("[INST]"):
        if has("[SYSTEM_PROMPT]"):
            return "mistral-v7"
        if has("' [INST] ' + system_message") or has("[AVAILABLE_TOOLS]"):
            if has(" [INST]"):
                return "mistral-v1"
            if has('"[INST]"'):
                return "mistral-v3-tekken"
            return "mistral-v3"
        if has("content.strip()"):
            return "llama2-sys-strip"
        if has("bos_token + '[INST]"):
            return "llama2-sys-bos"
        return "llama2-sys" if has("<<SYS>>") else "llama2"
    rules: list[tuple[Callable[[], bool], str | Callable[[], str]]] = [
        (lambda: has("<|assistant|>") and has("<|end|>"), "phi3"),
        (lambda: has("[gMASK]<sop>"), "chatglm4"),
        (lambda: has("<|assistant|>") and has("<|user|>"),
         lambda: "exaone-moe" if has("<|tool_declare|>") else "falcon3" if has("</s>") else "glmedge"),
        (lambda: has("<|{{ item['role'] }}|>") and has("<|begin_of_image|>"), "glmedge"),
        (lambda: has("<|user|>") and has("<|endoftext|>"), "zephyr"),
        (lambda: has("bos_token + message['role']"), "monarch"),
        (lambda: has("<start_of_turn>"), "gemma"),
        (lambda: has("'\\n\\nAssistant: ' + eos_token"), "orion"),
        (lambda: has("GPT4 Correct "), "openchat"),
        (lambda: has("USER: ") and has("ASSISTANT: "), lambda: "vicuna-orca" if has("SYSTEM: ") else "vicuna"),
        (lambda: has("### Instruction:") and has("<|EOT|>"), "deepseek"),
        (lambda: has("<|START_OF_TURN_TOKEN|>") and has("<|USER_TOKEN|>"), "command-r"),
        (lambda: has("<|start_header_id|>") and has("<|end_header_id|>"), "llama3"),
        (lambda: has("[gMASK]sop"), "chatglm3"),
        (lambda: has("<用户>"), "minicpm"),
        (lambda: has("'Assistant: ' + message['content'] + eos_token"), "deepseek2"),
        (lambda: has("<｜Assistant｜>") and has("<｜User｜>") and has("<｜end▁of▁sentence｜>"), "deepseek3"),
        (lambda: has("[|system|]") and has("[|assistant|]") and has("[|endofturn|]"),
         lambda: "exaone4" if has("[|tool|]") else "exaone3"),
        (lambda: has("rwkv-world") or has("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"), "rwkv-world"),
        (lambda: has("<|start_of_role|>"),
         lambda: ("granite-4.0" if has("g4_default_system_message") else "granite-4.1")
         if has("<tool_call>") or has("<tools>") else "granite"),
        (lambda: has("message['role'] + additional_special_tokens[0] + message['content'] + "
                     "additional_special_tokens[1]"), "gigachat"),
        (lambda: has("<|role_start|>"), "megrez"),
        (lambda: has(" Ассистент:"), "yandex"),
        (lambda: has("<role>ASSISTANT</role>") and has("'HUMAN'"), "bailing"),
        (lambda: has("<role>ASSISTANT</role>") and has('"HUMAN"') and has("<think>"), "bailing-think"),
        (lambda: has("<role>ASSISTANT</role>") and has("<role>HUMAN</role>") and has("<|role_end|>"), "bailing2"),
        (lambda: has("<|header_start|>") and has("<|header_end|>"), "llama4"),
        (lambda: has("<|endofuserprompt|>"), "dots1"),
        (lambda: has("<|extra_0|>") and has("<|extra_4|>"), "hunyuan-moe"),
        (lambda: has("<|start|>") and has("<|channel|>"), "gpt-oss"),
        (lambda: has("<｜hy_Assistant｜>") and has("<｜hy_begin▁of▁sentence｜>"), "hunyuan-vl"),
        (lambda: has("<｜hy_Assistant｜>") and has("<｜hy_place▁holder▁no▁3｜>"), "hunyuan-dense"),
        (lambda: has("<|im_assistant|>assistant<|im_middle|>"), "kimi-k2"),
        (lambda: has("<seed:bos>"), "seed_oss"),
        (lambda: has("'Assistant: '  + message['content'] + '<|separator|>"), "grok-2"),
        (lambda: has("[unused9]系统：[unused10]"), "pangu-embedded"),
        (lambda: has("<|begin|>") and has("<|end|>") and has("<|content|>"), "solar-open"),
    ]
    for test, name in rules:
        if test():
            return name() if callable(name) else name
    return None


def _trim(s: str) -> str:
    return s.strip(" \t\n\v\f\r")  # C isspace


def _chatml(msgs, add):
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
    return out + ("<|im_start|>assistant\n" if add else "")


def _mistral_v7(trailing_space: str):
    def apply(msgs, add):
        out = []
        for m in msgs:
            if m["role"] == "system":
                out.append(f"[SYSTEM_PROMPT]{trailing_space}{m['content']}[/SYSTEM_PROMPT]")
            elif m["role"] == "user":
                out.append(f"[INST]{trailing_space}{m['content']}[/INST]")
            else:
                out.append(f"{trailing_space}{m['content']}</s>")
        return "".join(out)
    return apply


def _mistral(name: str):
    leading = " " if name == "mistral-v1" else ""
    trailing = "" if name == "mistral-v3-tekken" else " "
    trim_assistant = name == "mistral-v3"

    def apply(msgs, add):
        out, inside = [], False
        for m in msgs:
            if not inside:
                out.append(f"{leading}[INST]{trailing}")
                inside = True
            if m["role"] == "system":
                out.append(m["content"] + "\n\n")
            elif m["role"] == "user":
                out.append(f"{m['content']}{leading}[/INST]")
            else:
                out.append(trailing + (_trim(m["content"]) if trim_assistant else m["content"]) + "</s>")
                inside = False
        return "".join(out)
    return apply


def _llama2(name: str):
    system_ok = name != "llama2"
    bos_inside = name == "llama2-sys-bos"
    strip = name == "llama2-sys-strip"

    def apply(msgs, add):
        out, inside = ["[INST] "], True
        for m in msgs:
            content = _trim(m["content"]) if strip else m["content"]
            if not inside:
                inside = True
                out.append("<s>[INST] " if bos_inside else "[INST] ")
            if m["role"] == "system":
                out.append(f"<<SYS>>\n{content}\n<</SYS>>\n\n" if system_ok else content + "\n")
            elif m["role"] == "user":
                out.append(content + " [/INST]")
            else:
                out.append(content + "</s>")
                inside = False
        return "".join(out)
    return apply


def _simple(turn: Callable[[str, str], str], generation: str):
    """A template that writes each message on its own and ends with a generation prompt."""
    def apply(msgs, add):
        return "".join(turn(m["role"], m["content"]) for m in msgs) + (generation if add else "")
    return apply


def _gemma(msgs, add):
    out, system = [], ""
    for m in msgs:
        if m["role"] == "system":
            system += _trim(m["content"])
            continue
        role = "model" if m["role"] == "assistant" else m["role"]
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(_trim(m["content"]) + "<end_of_turn>\n")
    return "".join(out) + ("<start_of_turn>model\n" if add else "")


def _monarch(msgs, add):
    out = "".join(("" if i == 0 else "<s>") + f"{m['role']}\n{m['content']}</s>\n" for i, m in enumerate(msgs))
    return out + ("<s>assistant\n" if add else "")


def _orion(msgs, add):
    out, system = [], ""
    for m in msgs:
        if m["role"] == "system":
            system += m["content"]
        elif m["role"] == "user":
            out.append("Human: " + (system + "\n\n" if system else "") + m["content"] + "\n\nAssistant: </s>")
            system = ""
        else:
            out.append(m["content"] + "</s>")
    return "".join(out)


def _openchat(msgs, add):
    out = []
    for m in msgs:
        if m["role"] == "system":
            out.append(m["content"] + "<|end_of_turn|>")
        else:
            role = m["role"][:1].upper() + m["role"][1:]
            out.append(f"GPT4 Correct {role}: {m['content']}<|end_of_turn|>")
    return "".join(out) + ("GPT4 Correct Assistant:" if add else "")


def _vicuna(orca: bool):
    def turn(role, content):
        if role == "system":
            return f"SYSTEM: {content}\n" if orca else content + "\n\n"
        if role == "user":
            return f"USER: {content}\n"
        return f"ASSISTANT: {content}</s>\n" if role == "assistant" else ""
    return _simple(turn, "ASSISTANT:")


def _by_role(system: Callable[[str], str], user: Callable[[str], str], assistant: Callable[[str], str],
             generation: str):
    table = {"system": system, "user": user, "assistant": assistant}
    return _simple(lambda role, content: table[role](content) if role in table else "", generation)


def _minicpm(msgs, add):
    return "".join(f"<用户>{_trim(m['content'])}<AI>" if m["role"] == "user" else _trim(m["content"]) for m in msgs)


def _rwkv_world(msgs, add):
    out = []
    for i, m in enumerate(msgs):
        if m["role"] == "system":
            out.append(f"System: {_trim(m['content'])}\n\n")
        elif m["role"] == "user":
            out.append(f"User: {_trim(m['content'])}\n\n" + ("Assistant:" if i == len(msgs) - 1 else ""))
        elif m["role"] == "assistant":
            out.append(f"Assistant: {_trim(m['content'])}\n\n")
    return "".join(out)


def _granite(name: str):
    def turn(role, content):
        if role == "assistant_tool_call":
            head = ("<|start_of_role|>assistant_tool_call<|end_of_role|><|tool_call|>" if name == "granite"
                    else "<|start_of_role|>assistant<|end_of_role|><|tool_call|>")
        else:
            head = f"<|start_of_role|>{role}<|end_of_role|>"
        return f"{head}{content}<|end_of_text|>\n"
    return _simple(turn, "<|start_of_role|>assistant<|end_of_role|>")


# name -> (messages with string contents, add_generation_prompt) -> prompt; llm_chat_apply_template's branches
BUILTINS: dict[str, Callable[[list[dict[str, Any]], bool], str]] = {
    "chatml": _chatml,
    "llama2": _llama2("llama2"),
    "llama2-sys": _llama2("llama2-sys"),
    "llama2-sys-bos": _llama2("llama2-sys-bos"),
    "llama2-sys-strip": _llama2("llama2-sys-strip"),
    "mistral-v1": _mistral("mistral-v1"),
    "mistral-v3": _mistral("mistral-v3"),
    "mistral-v3-tekken": _mistral("mistral-v3-tekken"),
    "mistral-v7": _mistral_v7(" "),
    "mistral-v7-tekken": _mistral_v7(""),
    "phi3": _simple(lambda r, c: f"<|{r}|>\n{c}<|end|>\n", "<|assistant|>\n"),
    "phi4": _simple(lambda r, c: f"<|im_start|>{r}<|im_sep|>{c}<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
    "falcon3": _simple(lambda r, c: f"<|{r}|>\n{c}\n", "<|assistant|>\n"),
    "zephyr": _simple(lambda r, c: f"<|{r}|>\n{c}<|endoftext|>\n", "<|assistant|>\n"),
    "monarch": _monarch,
    "gemma": _gemma,
    "orion": _orion,
    "openchat": _openchat,
    "vicuna": _vicuna(False),
    "vicuna-orca": _vicuna(True),
    "deepseek": _by_role(lambda c: c, lambda c: f"### Instruction:\n{c}\n", lambda c: f"### Response:\n{c}\n<|EOT|>\n",
                         "### Response:\n"),
    "command-r": _by_role(lambda c: f"<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{_trim(c)}<|END_OF_TURN_TOKEN|>",
                          lambda c: f"<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{_trim(c)}<|END_OF_TURN_TOKEN|>",
                          lambda c: f"<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{_trim(c)}<|END_OF_TURN_TOKEN|>",
                          "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    "llama3": _simple(lambda r, c: f"<|start_header_id|>{r}<|end_header_id|>\n\n{_trim(c)}<|eot_id|>",
                      "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "chatglm3": lambda msgs, add: "[gMASK]sop" + _simple(lambda r, c: f"<|{r}|>\n {c}", "<|assistant|>")(msgs, add),
    "chatglm4": lambda msgs, add: "[gMASK]<sop>" + _simple(lambda r, c: f"<|{r}|>\n{c}", "<|assistant|>\n")(msgs,
                                                                                                            add),
    "glmedge": _simple(lambda r, c: f"<|{r}|>\n{c}", "<|assistant|>"),
    "minicpm": _minicpm,
    "deepseek2": _by_role(lambda c: c + "\n\n", lambda c: f"User: {c}\n\n",
                          lambda c: f"Assistant: {c}<｜end▁of▁sentence｜>", "Assistant:"),
    "deepseek3": _by_role(lambda c: c + "\n\n", lambda c: f"<｜User｜>{c}",
                          lambda c: f"<｜Assistant｜>{c}<｜end▁of▁sentence｜>", "<｜Assistant｜>"),
    "exaone3": _by_role(lambda c: f"[|system|]{_trim(c)}[|endofturn|]\n", lambda c: f"[|user|]{_trim(c)}\n",
                        lambda c: f"[|assistant|]{_trim(c)}[|endofturn|]\n", "[|assistant|]"),
    "rwkv-world": _rwkv_world,
    "granite": _granite("granite"),
    "granite-4.0": _granite("granite-4.0"),
    "granite-4.1": _granite("granite-4.1"),
}

# every name llama.cpp's LLM_CHAT_TEMPLATES knows (llama_chat_builtin_templates); BUILTINS implements a subset
BUILTIN_NAMES = frozenset({
    "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1", "mistral-v3",
    "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4", "falcon3", "zephyr", "monarch", "gemma",
    "orion", "openchat", "vicuna", "vicuna-orca", "deepseek", "deepseek2", "deepseek3", "deepseek-ocr", "command-r",
    "llama3", "chatglm3", "chatglm4", "glmedge", "minicpm", "exaone3", "exaone4", "exaone-moe", "rwkv-world", "dots1",
    "granite", "granite-4.0", "granite-4.1", "gigachat", "megrez", "yandex", "bailing", "bailing-think", "bailing2",
    "llama4", "smolvlm", "hunyuan-moe", "gpt-oss", "hunyuan-dense", "hunyuan-vl", "kimi-k2", "seed_oss", "grok-2",
    "pangu-embedded", "solar-open",
})


def apply_builtin(name: str, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
    """llama.cpp's built-in template ``name`` (``llm_chat_apply_template``: no BOS, no jinja) applied to
    ``messages``; content parts are joined with newlines as llama.cpp's legacy path joins them."""
    if name not in BUILTINS:
        known = "not implemented here" if name in BUILTIN_NAMES else "unknown"
        raise ValueError(f"built-in chat template {name!r} is {known}; available: {', '.join(sorted(BUILTINS))}")
    msgs = [{"role": m["role"], "content": join_parts(m["content"])} for m in normalize_messages(messages)]
    return BUILTINS[name](msgs, add_generation_prompt)


def builtin_template_name(vocab: Vocab) -> str:
    """The built-in template for a vocabulary without a chat template, by the turn markers it has as special
    tokens: Gemma's, Llama 3's, Mistral's (``[SYSTEM_PROMPT]``: v7, ``[INST]``: v3; ``-tekken`` for a Tekken
    vocabulary), Phi-3's, else ChatML, llama.cpp's default for a GGUF without a template."""
    texts = {vocab.token_bytes(i) for i in vocab.special}
    if {b"<start_of_turn>", b"<end_of_turn>"} <= texts:
        return "gemma"
    if {b"<|start_header_id|>", b"<|end_header_id|>", b"<|eot_id|>"} <= texts:
        return "llama3"
    if {b"[INST]", b"[/INST]"} <= texts:
        tekken = getattr(vocab.tokenizer, "pre", None) == "tekken"
        if b"[SYSTEM_PROMPT]" in texts:
            return "mistral-v7-tekken" if tekken else "mistral-v7"
        return "mistral-v3-tekken" if tekken else "mistral-v3"
    if {b"<|user|>", b"<|assistant|>", b"<|end|>"} <= texts:
        return "phi3"
    return "chatml"
