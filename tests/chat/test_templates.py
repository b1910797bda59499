# ruff: noqa: RUF001  (DeepSeek's turn markers are full-width characters)
"""Chat templates rendered as llama.cpp renders them: real templates from llama.cpp's tree (models/templates), the
template test cases of llama.cpp's tests/test-chat-template.cpp (jinja and built-in), llama.cpp's built-in templates,
the variables and workarounds of common_chat_templates_apply, and bad messages.

Expected strings: the LLAMA_CPP_CASES ones are copied from tests/test-chat-template.cpp (``expected_output`` for the
built-in path, ``expected_output_jinja`` or else ``expected_output`` for the jinja path). llama.cpp's tests have no
full-prompt strings for the real template files: those below were produced by llama.cpp's own jinja engine
(common/jinja of the llama.cpp tree llama-cpp-python 0.3.36 vendors, compiled with chat.cpp's plain-chat
workarounds: developer -> system, the system merge for templates without a system role, content parts joined) with
the same variables, and checked by hand against each template's text (the comments say what each one shows).
"""

import datetime

import pytest

from llama_tree import template_file, vocab_file
from samplechain.chat.builtin import BUILTINS, apply_builtin, builtin_template_name, detect_builtin
from samplechain.chat.messages import normalize_messages
from samplechain.chat.template import apply_template, render, template_caps, tojson
from samplechain.vocab import Vocab

NOW = datetime.datetime(2025, 3, 9, 14, 30)  # what strftime_now / date_string show
CONV = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "What is 2+2?"}]


def mini_vocab(bos: str, eos: str, *special: str, chat_template: str | None = None, add_bos: bool = True) -> Vocab:
    """A vocabulary with just the BOS/EOS texts (and other special tokens) a template reads."""
    tokens = ["x", bos, eos, *special]
    return Vocab(tokens, bos=1, eos=2, special=range(1, len(tokens)), chat_template=chat_template, add_bos=add_bos)


@pytest.fixture(scope="module")
def vocabs():
    return {
        "llama-bpe": Vocab.from_gguf(vocab_file("llama-bpe")),  # <|begin_of_text|>
        "qwen2": Vocab.from_gguf(vocab_file("qwen2")),  # <|endoftext|>
        "phi-3": Vocab.from_gguf(vocab_file("phi-3")),  # <s> / <|endoftext|>
        "gemma": mini_vocab("<bos>", "<eos>"),
        "mistral": mini_vocab("<s>", "</s>"),
        "deepseek": mini_vocab("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    }


LLAMA3 = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
          "Today Date: 09 Mar 2025\n\nYou are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>"
          "\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n")
CHATML = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
          "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
          "<|im_start|>assistant\n")

REAL = [
    # Llama 3.1 / 3.3 (the same template): llama.cpp passes date_string (today, "%d %b %Y"), so not "26 Jul 2024";
    # the system message is trimmed into the system header after the knowledge/today lines
    pytest.param("meta-llama-Llama-3.1-8B-Instruct", "llama-bpe", None, LLAMA3, id="llama-3.1"),
    # Llama 3.2: date_string is defined, so strftime_now is not even called: the same text
    pytest.param("meta-llama-Llama-3.2-3B-Instruct", "llama-bpe", None, LLAMA3, id="llama-3.2"),
    pytest.param("meta-llama-Llama-3.3-70B-Instruct", "llama-bpe", None, LLAMA3, id="llama-3.3"),
    pytest.param("Qwen-Qwen2.5-7B-Instruct", "qwen2", None, CHATML, id="qwen-2.5"),
    # Qwen 3: enable_thinking true (llama.cpp's default) adds nothing; the model opens <think> itself
    pytest.param("Qwen-Qwen3-0.6B", "qwen2", None, CHATML, id="qwen-3-thinking"),
    pytest.param("Qwen-Qwen3-0.6B", "qwen2", True, CHATML, id="qwen-3-thinking-explicit"),
    # Qwen 3 without thinking: the template closes an empty think block in the generation prompt
    pytest.param("Qwen-Qwen3-0.6B", "qwen2", False, CHATML + "<think>\n\n</think>\n\n", id="qwen-3-no-thinking"),
    # Mistral Nemo (v3-tekken): the system message goes in front of the LAST user message, after a blank line;
    # no generation prompt (the [/INST] is it)
    pytest.param("mistralai-Mistral-Nemo-Instruct-2407", "mistral", None,
                 "<s>[INST]Hello[/INST]Hi there</s>[INST]You are a helpful assistant.\n\nWhat is 2+2?[/INST]",
                 id="mistral-nemo"),
    # Devstral (v7-tekken): a [SYSTEM_PROMPT] block first
    pytest.param("unsloth-mistral-Devstral-Small-2507", "mistral", None,
                 "<s>[SYSTEM_PROMPT]You are a helpful assistant.[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>"
                 "[INST]What is 2+2?[/INST]", id="devstral"),
    # Phi-3.5: no BOS in the template (the tokenizer adds it), <|role|>\n ... <|end|>\n
    pytest.param("microsoft-Phi-3.5-mini-instruct", "phi-3", None,
                 "<|system|>\nYou are a helpful assistant.<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there"
                 "<|end|>\n<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n", id="phi-3.5"),
    # Gemma 2 raises on a system message: llama.cpp finds it never reads one and merges it into the first user
    # message with ONE newline (the built-in "gemma" uses two)
    pytest.param("google-gemma-2-2b-it", "gemma", None,
                 "<bos><start_of_turn>user\nYou are a helpful assistant.\nHello<end_of_turn>\n<start_of_turn>model\n"
                 "Hi there<end_of_turn>\n<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
                 id="gemma-2"),
    # DeepSeek-R1-Distill: the system prompt right after the BOS, the generation prompt opens <think>
    pytest.param("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "deepseek", None,
                 "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>Hello<｜Assistant｜>Hi there"
                 "<｜end▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜><think>\n", id="deepseek-r1-distill"),
]


@pytest.mark.parametrize(("name", "vocab", "thinking", "expected"), REAL)
def test_real_templates_render_as_llama_cpp(vocabs, name, vocab, thinking, expected):
    template = template_file(name).read_text()
    assert render(template, vocabs[vocab], CONV, True, enable_thinking=thinking, now=NOW) == expected


def test_apply_template_uses_the_gguf_template(vocabs):
    """qwen2's vocab GGUF has a template of its own (ChatML); phi-3's writes the BOS and <|role|> turns."""
    assert apply_template(vocabs["qwen2"], CONV, now=NOW) == CHATML
    assert apply_template(vocabs["phi-3"], "Hi") == "<s><|user|>\nHi<|end|>\n<|assistant|>\n"


def test_qwen3_thinking_settings():
    qwen3 = template_file("Qwen-Qwen3-0.6B").read_text()
    v = mini_vocab("<|endoftext|>", "<|endoftext|>", add_bos=False)
    no_think = CHATML + "<think>\n\n</think>\n\n"
    # a request's chat_template_kwargs {"enable_thinking": false} does what enable_thinking=False does
    assert render(qwen3, v, CONV, True, template_kwargs={"enable_thinking": False}) == no_think
    # the keyword wins over the kwargs (llama.cpp: --reasoning off / reasoning_effort "none" set it)
    assert render(qwen3, v, CONV, True, enable_thinking=True, template_kwargs={"enable_thinking": False}) == CHATML
    # "/no_think" in a message is text for the model: the template renders it as it is
    msgs = [{"role": "user", "content": "Hi /no_think"}]
    assert render(qwen3, v, msgs, True) == "<|im_start|>user\nHi /no_think<|im_end|>\n<|im_start|>assistant\n"
    # earlier answers lose their reasoning; the one after the last user turn keeps it (reasoning_content passes)
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"},
               {"role": "user", "content": "Bye"}]
    assert render(qwen3, v, history, True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n")
    last = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "The user greets me."}]
    assert render(qwen3, v, last, False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nThe user greets me.\n</think>\n\n"
        "Hello!<|im_end|>\n")
    with pytest.raises(ValueError, match="enable_thinking must be true or false"):
        render(qwen3, v, CONV, True, template_kwargs={"enable_thinking": "no"})


def test_without_generation_prompt(vocabs):
    phi = template_file("microsoft-Phi-3.5-mini-instruct").read_text()
    # Phi-3.5 writes the EOS when there is no generation prompt
    hi = [{"role": "user", "content": "Hi"}]
    assert render(phi, vocabs["phi-3"], hi, False) == "<|user|>\nHi<|end|>\n<|endoftext|>"
    gemma2 = template_file("google-gemma-2-2b-it").read_text()
    # a lone system message that the template cannot take is dropped (llama.cpp's warning "Removing system prompt")
    lone = [{"role": "system", "content": "Sys"}]
    assert render(gemma2, vocabs["gemma"], lone, True) == "<bos><start_of_turn>model\n"


def test_template_variables():
    """The variables and globals llama.cpp gives a template (checked against llama.cpp's engine)."""
    t = ("{{ x | tojson }}|{{ tojson(x, indent=2) }}|{{ add_generation_prompt is defined }}|{{ tools is defined }}|"
         "{{ enable_thinking }}|{{ strftime_now('%Y-%m-%d') }}|{{ datetime }}|{{ date_string }}")
    x = {"b": [1, "é<&>", None, True, 1.5]}
    assert render(t, Vocab(["x"]), [{"role": "user", "content": "a"}], False, template_kwargs={"x": x}, now=NOW) == (
        '{"b": [1, "é<&>", null, true, 1.5]}|{\n  "b": [\n    1,\n    "é<&>",\n    null,\n    true,\n    1.5\n  ]\n}|'
        "False|False|True|2025-03-09|Mar 09 2025|09 Mar 2025")
    t2 = "{{ add_generation_prompt }}|{{ tools | length }}|{{ bos_token }}|{{ eos_token }}"
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert render(t2, mini_vocab("<s>", "</s>"), [], True, tools=tools) == "True|1|<s>|</s>"
    assert tojson({"a": "ü"}, ensure_ascii=True) == '{"a": "\\u00fc"}'
    assert tojson([1, 2], separators=(",", ":")) == "[1,2]"


def test_trim_and_lstrip_blocks():
    """Blocks strip like llama.cpp's lexer (trim_blocks + lstrip_blocks); the final newline goes (outputs of
    llama.cpp's engine)."""
    t = "A\n  {% if true %}\nB\n  {%- endif %}  \n{# c #}\nC{{ 'D' }}\n"
    assert render(t, Vocab(["x"]), [], False) == "A\nB  \nCD"
    t = "A\n  {% if true %}\nB\n  {% endif %}  \n  {# c #}\nC{{ 'D' }}\n  {{ 'E' }}  \n"
    assert render(t, Vocab(["x"]), [], False) == "A\nB\n  \nCD\n  E  "
    t = "{{- 'a' -}}\n\n{{ 'b' }}  {%- if true -%}  c  {%- endif %}"
    assert render(t, Vocab(["x"]), [], False) == "abc"


# --- messages ----------------------------------------------------------------------------------------------------


def test_message_contents():
    v = mini_vocab("<s>", "</s>")
    chatml = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    msgs = [{"role": "developer", "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}]},
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}]
    assert render(chatml, v, msgs, False) == "<system>Be\nbrief.<user>Hi<assistant>"
    # a template that reads content parts gets them as parts
    parts = "{% for m in messages %}{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endfor %}"
    assert template_caps(parts).typed_content and not template_caps(chatml).typed_content
    assert render(parts, v, msgs[:1], False) == "[Be][brief.]"
    # tool fields pass through
    call = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f"}}]}
    assert normalize_messages([call]) == [{"role": "assistant", "content": "", "tool_calls": call["tool_calls"]}]


@pytest.mark.parametrize(("message", "error"), [
    ({"role": "user"}, "message 0: a chat message needs a string role and content"),
    ({"content": "x"}, "message 0: a chat message needs a string role and content"),
    ("hello", "message 0: a chat message must be an object"),
    ({"role": "user", "content": 3}, "message 0: content must be a string, a list of content parts or null"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {}}]}, "content part 0 has type 'image_url'"),
    ({"role": "user", "content": [{"text": "x"}]}, "content part 0 must be an object with a string 'type'"),
    ({"role": "user", "content": [{"type": "text", "text": None}]}, "content part 0 \\(text\\) needs a string 'text'"),
])
def test_bad_messages_raise_value_errors(message, error):
    with pytest.raises(ValueError, match=error):
        render(CHATML_SRC, Vocab(["x"]), [message], True)


CHATML_SRC = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


def test_template_errors_are_value_errors(vocabs):
    gemma2 = template_file("google-gemma-2-2b-it").read_text()
    alternating = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ValueError, match="chat template: Conversation roles must alternate"):
        render(gemma2, vocabs["gemma"], alternating, True)
    with pytest.raises(ValueError, match="chat template does not parse"):
        render("{% if %}", Vocab(["x"]), [], True)
    with pytest.raises(ValueError, match="chat template failed"):
        render("{{ messages[0].content + 1 }}", Vocab(["x"]), [{"role": "user", "content": "a"}], True)


# --- llama.cpp's test-chat-template.cpp ----------------------------------------------------------------------------

LLAMA_CPP_CONV = [
    {"role": "system", "content": "You are a helpful assistant"}, {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "Who are you"},
    {"role": "assistant", "content": "   I am an assistant   "}, {"role": "user", "content": "Another question"},
]

LLAMA_CPP_CASES = [
    pytest.param(
        "teknium/OpenHermes-2.5-Mistral-7B",
        ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_e"
         "nd|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
        ("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_sta"
         "rt|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   "
         "I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n"),
        ("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_sta"
         "rt|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   "
         "I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n"),
        "",
        "",
    ),
    pytest.param(
        "mistralai/Mistral-7B-Instruct-v0.2 (NOTE: Old pre-v1 without a system prompt)",
        ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0"
         ") %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% end"
         "if %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif messag"
         "e['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user "
         "and assistant roles are supported!') }}{% endif %}{% endfor %}"),
        ("[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assi"
         "stant   </s>[INST] Another question [/INST]"),
        ("[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assi"
         "stant   </s>[INST] Another question [/INST]"),
        "",
        "</s>",
    ),
    pytest.param(
        "TheBloke/FusionNet_34Bx2_MoE-AWQ",
        ("{%- for idx in range(0, messages|length) -%}\n{%- if messages[idx]['role'] == 'user' -%}\n{%- if idx >"
         " 1 -%}\n{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}\n{%- else -%}\n{{- messa"
         "ges[idx]['content'] + ' [/INST]' -}}\n{%- endif -%}\n{% elif messages[idx]['role'] == 'system' %}\n{{-"
         " '[INST] <<SYS>>\\n' + messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}\n{%- elif messages[idx]['rol"
         "e'] == 'assistant' -%}\n{{- ' '  + messages[idx]['content'] + ' ' + eos_token -}}\n{% endif %}\n{% end"
         "for %}"),
        ("[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] Who are yo"
         "u [/INST]   I am an assistant   </s><s>[INST] Another question [/INST]"),
        ("[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s><s>[INST] Who are "
         "you [/INST]    I am an assistant    </s><s>[INST] Another question [/INST]"),
        "<s>",
        "</s>",
    ),
    pytest.param(
        "bofenghuang/vigogne-2-70b-chat",
        ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set sy"
         "stem_message = messages[0]['content'] %}{% elif true == true and not '<<SYS>>' in messages[0]['content"
         "'] %}{% set loop_messages = messages %}{% set system_message = 'Vous êtes Vigogne, un assistant IA cré"
         "é par Zaion Lab. Vous suivez extrêmement bien les instructions. Aidez autant que vous le pouvez.' %}{%"
         " else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in"
         " loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Con"
         "versation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0"
         " and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
         "message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] "
         "== 'user' %}{{ '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'system' %}{{ '<<"
         "SYS>>\\n' + content.strip() + '\\n<</SYS>>\\n\\n' }}{% elif message['role'] == 'assistant' %}{{ ' '  +"
         " content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"),
        ("[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you ["
         "/INST]I am an assistant</s>[INST] Another question [/INST]"),
        ("[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s>[INST] Who are you"
         " [/INST] I am an assistant </s>[INST] Another question [/INST]"),
        "",
        "</s>",
    ),
    pytest.param(
        "mlabonne/AlphaMonarch-7B",
        ("{% for message in messages %}{{bos_token + message['role'] + '\\n' + message['content'] + eos_token + "
         "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ bos_token + 'assistant\\n' }}{% endif %}"),
        ("system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\nHi there</s>\n<s>user\nWho "
         "are you</s>\n<s>assistant\n   I am an assistant   </s>\n<s>user\nAnother question</s>\n<s>assistant\n"),
        ("<s>system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\nHi there</s>\n<s>user\nW"
         "ho are you</s>\n<s>assistant\n   I am an assistant   </s>\n<s>user\nAnother question</s>\n<s>assistant"
         "\n"),
        "<s>",
        "</s>",
    ),
    pytest.param(
        "google/gemma-7b-it",
        ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{"
         "% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exc"
         "eption('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (mess"
         "age['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% end"
         "if %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor "
         "%}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"),
        ("<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there"
         "<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<"
         "end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n"),
        ("<start_of_turn>user\nYou are a helpful assistant\nHello<end_of_turn>\n<start_of_turn>model\nHi there<e"
         "nd_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<en"
         "d_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n"),
        "",
        "",
    ),
    pytest.param(
        "OrionStarAI/Orion-14B-Chat",
        ("{% for message in messages %}{% if loop.first %}{{ bos_token }}{% endif %}{% if message['role'] == 'us"
         "er' %}{{ 'Human: ' + message['content'] + '\\n\\nAssistant: ' + eos_token }}{% elif message['role'] =="
         " 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"),
        ("Human: You are a helpful assistant\n\nHello\n\nAssistant: </s>Hi there</s>Human: Who are you\n\nAssist"
         "ant: </s>   I am an assistant   </s>Human: Another question\n\nAssistant: </s>"),
        ("Human: You are a helpful assistant\nHello\n\nAssistant: </s>Hi there</s>Human: Who are you\n\nAssistan"
         "t: </s>   I am an assistant   </s>Human: Another question\n\nAssistant: </s>"),
        "",
        "</s>",
    ),
    pytest.param(
        "openchat/openchat-3.5-0106",
        ("{{ bos_token }}{% for message in messages %}{{ 'GPT4 Correct ' + message['role'].title() + ': ' + mess"
         "age['content'] + '<|end_of_turn|>'}}{% endfor %}{% if add_generation_prompt %}{{ 'GPT4 Correct Assista"
         "nt:' }}{% endif %}"),
        ("You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>GPT4 Correct Assistan"
         "t: Hi there<|end_of_turn|>GPT4 Correct User: Who are you<|end_of_turn|>GPT4 Correct Assistant:    I am"
         " an assistant   <|end_of_turn|>GPT4 Correct User: Another question<|end_of_turn|>GPT4 Correct Assistan"
         "t:"),
        ("GPT4 Correct System: You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>"
         "GPT4 Correct Assistant: Hi there<|end_of_turn|>GPT4 Correct User: Who are you<|end_of_turn|>GPT4 Corre"
         "ct Assistant:    I am an assistant   <|end_of_turn|>GPT4 Correct User: Another question<|end_of_turn|>"
         "GPT4 Correct Assistant:"),
        "",
        "",
    ),
    pytest.param(
        "deepseek-ai/deepseek-coder-33b-instruct",
        ("{% if not add_generation_prompt is defined %}\n{% set add_generation_prompt = false %}\n{% endif %}\n{"
         "%- set ns = namespace(found=false) -%}\n{%- for message in messages -%}\n    {%- if message['role'] =="
         " 'system' -%}\n        {%- set ns.found = true -%}\n    {%- endif -%}\n{%- endfor -%}\n{{bos_token}}{%"
         "- if not ns.found -%}\n{{'You are an AI programming assistant, utilizing the Deepseek Coder model, dev"
         "eloped by Deepseek Company, and you only answer questions related to computer science. For politically"
         " sensitive questions, security and privacy issues, and other non-computer science questions, you will "
         "refuse to answer\\n'}}\n{%- endif %}\n{%- for message in messages %}\n    {%- if message['role'] == 's"
         "ystem' %}\n{{ message['content'] }}\n    {%- else %}\n        {%- if message['role'] == 'user' %}\n{{'"
         "### Instruction:\\n' + message['content'] + '\\n'}}\n        {%- else %}\n{{'### Response:\\n' + messa"
         "ge['content'] + '\\n<|EOT|>\\n'}}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{% if add_ge"
         "neration_prompt %}\n{{'### Response:'}}\n{% endif %}"),
        ("You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n### Instruction:"
         "\nWho are you\n### Response:\n   I am an assistant   \n<|EOT|>\n### Instruction:\nAnother question\n##"
         "# Response:\n"),
        ("You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n### Instruction:"
         "\nWho are you\n### Response:\n   I am an assistant   \n<|EOT|>\n### Instruction:\nAnother question\n##"
         "# Response:\n"),
        "",
        "",
    ),
    pytest.param(
        "eachadea/vicuna-13b-1.1",
        ("{%- for message in messages %}{%- if message['role'] == 'system' -%}{{- '' + message['content'] + '\n"
         "\n' -}}{%- else -%}{%- if message['role'] == 'user' -%}{{-'USER: ' + message['content'] + '\n'-}}{%- e"
         "lse -%}{{-'ASSISTANT: ' + message['content'] + '</s>\n' -}}{%- endif -%}{%- endif -%}{%- endfor -%}{%-"
         " if add_generation_prompt -%}{{-'ASSISTANT:'-}}{%- endif -%}"),
        ("You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    "
         "I am an assistant   </s>\nUSER: Another question\nASSISTANT:"),
        ("You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    "
         "I am an assistant   </s>\nUSER: Another question\nASSISTANT:"),
        "",
        "",
    ),
    pytest.param(
        "Orca-Vicuna",
        ("{%- for message in messages %}{%- if message['role'] == 'system' -%}{{-'SYSTEM: ' + message['content']"
         " + '\n' -}}{%- else -%}{%- if message['role'] == 'user' -%}{{-'USER: ' + message['content'] + '\n'-}}{"
         "%- else -%}{{-'ASSISTANT: ' + message['content'] + '</s>\n' -}}{%- endif -%}{%- endif -%}{%- endfor -%"
         "}{%- if add_generation_prompt -%}{{-'ASSISTANT:'-}}{%- endif -%}"),
        ("SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTAN"
         "T:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:"),
        ("SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTAN"
         "T:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:"),
        "",
        "",
    ),
    pytest.param(
        "CohereForAI/c4ai-command-r-plus",
        ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set sy"
         "stem_message = messages[0]['content'] %}{% elif false == true %}{% set loop_messages = messages %}{% s"
         "et system_message = 'You are Command-R, a brilliant, sophisticated, AI-assistant trained to assist hum"
         "an users by providing thorough responses. You are trained by Cohere.' %}{% else %}{% set loop_messages"
         " = messages %}{% set system_message = false %}{% endif %}{% if system_message != false %}{{ '<|START_O"
         "F_TURN_TOKEN|><|SYSTEM_TOKEN|>' + system_message + '<|END_OF_TURN_TOKEN|>' }}{% endif %}{% for message"
         " in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('"
         "Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% set content = me"
         "ssage['content'] %}{% if message['role'] == 'user' %}{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + cont"
         "ent.strip() + '<|END_OF_TURN_TOKEN|>' }}{% elif message['role'] == 'assistant' %}{{ '<|START_OF_TURN_T"
         "OKEN|><|CHATBOT_TOKEN|>'  + content.strip() + '<|END_OF_TURN_TOKEN|>' }}{% endif %}{% endfor %}{% if a"
         "dd_generation_prompt %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}"),
        ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN"
         "_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_"
         "OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|><|START_OF_TURN_TO"
         "KEN|><|CHATBOT_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Anoth"
         "er question<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
        ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN"
         "_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_"
         "OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|><|START_OF_TURN_TO"
         "KEN|><|CHATBOT_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Anoth"
         "er question<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
        "",
        "",
    ),
    pytest.param(
        "Llama-3",
        ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_i"
         "d|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loo"
         "p.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{{ '<|start"
         "_header_id|>assistant<|end_header_id|>\n\n' }}"),
        ("<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>"
         "user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot"
         "_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|en"
         "d_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother questi"
         "on<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
        ("<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>"
         "user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot"
         "_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|en"
         "d_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother questi"
         "on<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
        "",
        "",
    ),
    pytest.param(
        "Phi-3-mini",
        ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + "
         "message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif (message['role'] == 'assistant"
         "') %}{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}"),
        ("<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>"
         "\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother quest"
         "ion<|end|>\n<|assistant|>\n"),
        ("<|user|>\nYou are a helpful assistant\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|user|>\nWho are"
         " you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assis"
         "tant|>\n"),
        "",
        "",
    ),
    pytest.param(
        "DeepSeek-V2",
        ("{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{{ bos_"
         "token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ 'User: ' + message['content'"
         "] + '\n\n' }}{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_toke"
         "n }}{% elif message['role'] == 'system' %}{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}{% i"
         "f add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"),
        ("You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there<｜end▁of▁sentence｜>User: Who are you"
         "\n\nAssistant:    I am an assistant   <｜end▁of▁sentence｜>User: Another question\n\nAssistant:"),
        ("You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there<｜end▁of▁sentence｜>User: Who are you"
         "\n\nAssistant:    I am an assistant   <｜end▁of▁sentence｜>User: Another question\n\nAssistant:"),
        "",
        "<｜end▁of▁sentence｜>",
    ),
    pytest.param(
        "ibm-granite/granite-3.0-8b-instruct",
        ("{%- if tools %}\n    {{- '<|start_of_role|>available_tools<|end_of_role|>\n' }}\n    {%- for tool in t"
         "ools %}\n    {{- tool | tojson(indent=4) }}\n    {%- if not loop.last %}\n        {{- '\n\n' }}\n    {"
         "%- endif %}\n    {%- endfor %}\n    {{- '<|end_of_text|>\n' }}\n{%- endif %}\n{%- for message in messa"
         "ges %}\n    {%- if message['role'] == 'system' %}\n    {{- '<|start_of_role|>system<|end_of_role|>' + "
         "message['content'] + '<|end_of_text|>\n' }}\n    {%- elif message['role'] == 'user' %}\n    {{- '<|sta"
         "rt_of_role|>user<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' }}\n    {%- elif message['"
         "role'] == 'assistant' %}\n    {{- '<|start_of_role|>assistant<|end_of_role|>'  + message['content'] + "
         "'<|end_of_text|>\n' }}\n    {%- elif message['role'] == 'assistant_tool_call' %}\n    {{- '<|start_of_"
         "role|>assistant<|end_of_role|><|tool_call|>' + message['content'] + '<|end_of_text|>\n' }}\n    {%- el"
         "if message['role'] == 'tool_response' %}\n    {{- '<|start_of_role|>tool_response<|end_of_role|>' + me"
         "ssage['content'] + '<|end_of_text|>\n' }}\n    {%- endif %}\n    {%- if loop.last and add_generation_p"
         "rompt %}\n    {{- '<|start_of_role|>assistant<|end_of_role|>' }}\n    {%- endif %}\n{%- endfor %}"),
        ("<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n<|start_of_role|>use"
         "r<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there<|end_of_text|>"
         "\n<|start_of_role|>user<|end_of_role|>Who are you<|end_of_text|>\n<|start_of_role|>assistant<|end_of_r"
         "ole|>   I am an assistant   <|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question<|end"
         "_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"),
        ("<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n<|start_of_role|>use"
         "r<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there<|end_of_text|>"
         "\n<|start_of_role|>user<|end_of_role|>Who are you<|end_of_text|>\n<|start_of_role|>assistant<|end_of_r"
         "ole|>   I am an assistant   <|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question<|end"
         "_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"),
        "",
        "",
    ),
    pytest.param(
        "mistralai/Mistral-7B-Instruct-v0.2 (mistralai 'v1' template with a system prompt)",
        ("{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n   "
         " {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- en"
         "dif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user'"
         ") != (loop.index0 % 2 == 0) %}\n        {{- raise_exception('After the optional system message, conver"
         "sation roles must alternate user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if messa"
         "ge['role'] == 'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- '"
         " [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n     "
         "       {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message"
         "['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n     "
         "   {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial "
         "optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n"),
        (" [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am a"
         "n assistant   </s> [INST] Another question [/INST]"),
        (" [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am a"
         "n assistant   </s> [INST] Another question [/INST]"),
        "",
        "</s>",
    ),
    pytest.param(
        "Mistral-Large-Instruct-2407 (mistralai 'v3' template; modified to have system prompt at start)",
        ("{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = messages[0][\"content\"] %"
         "}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n"
         "{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n{%- set user_"
         "messages = loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list %}\n\n{#- This block che"
         "cks for alternating user/assistant messages, skipping tool calling messages #}\n{%- set ns = namespace"
         "() %}\n{%- set ns.index = 0 %}\n{%- for message in loop_messages %}\n    {%- if not (message.role == "
         "\"tool\" or message.role == \"tool_results\" or (message.tool_calls is defined and message.tool_calls "
         "is not none)) %}\n        {%- if (message[\"role\"] == \"user\") != (ns.index % 2 == 0) %}\n          "
         "  {{- raise_exception(\"After the optional system message, conversation roles must alternate user/assi"
         "stant/user/assistant/...\") }}\n        {%- endif %}\n        {%- set ns.index = ns.index + 1 %}\n    "
         "{%- endif %}\n{%- endfor %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if messa"
         "ge[\"role\"] == \"user\" %}\n        {%- if tools is not none and (message == user_messages[-1]) %}\n "
         "           {{- \"[AVAILABLE_TOOLS] [\" }}\n            {%- for tool in tools %}\n                {%- s"
         "et tool = tool.function %}\n                {{- '{\"type\": \"function\", \"function\": {' }}\n       "
         "         {%- for key, val in tool.items() if key != \"return\" %}\n                    {%- if val is s"
         "tring %}\n                        {{- '\"' + key + '\": \"' + val + '\"' }}\n                    {%- e"
         "lse %}\n                        {{- '\"' + key + '\": ' + val|tojson }}\n                    {%- endif"
         " %}\n                    {%- if not loop.last %}\n                        {{- \", \" }}\n             "
         "       {%- endif %}\n                {%- endfor %}\n                {{- \"}}\" }}\n                {%-"
         " if not loop.last %}\n                    {{- \", \" }}\n                {%- else %}\n                "
         "    {{- \"]\" }}\n                {%- endif %}\n            {%- endfor %}\n            {{- \"[/AVAILAB"
         "LE_TOOLS]\" }}\n            {%- endif %}\n        {%- if loop.last and system_message is defined %}\n "
         "           {{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n    "
         "    {%- else %}\n            {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n        {%- endi"
         "f %}\n    {%- elif message.tool_calls is defined and message.tool_calls is not none %}\n        {{- \""
         "[TOOL_CALLS] [\" }}\n        {%- for tool_call in message.tool_calls %}\n            {%- set out = too"
         "l_call.function|tojson %}\n            {{- out[:-1] }}\n            {%- if not tool_call.id is defined"
         " or tool_call.id|length != 9 %}\n                {{- raise_exception(\"Tool call IDs should be alphanu"
         "meric strings with length 9!\") }}\n            {%- endif %}\n            {{- ', \"id\": \"' + tool_ca"
         "ll.id + '\"}' }}\n            {%- if not loop.last %}\n                {{- \", \" }}\n            {%- "
         "else %}\n                {{- \"]\" + eos_token }}\n            {%- endif %}\n        {%- endfor %}\n  "
         "  {%- elif message[\"role\"] == \"assistant\" %}\n        {{- \" \" + message[\"content\"]|trim + eos_"
         "token}}\n    {%- elif message[\"role\"] == \"tool_results\" or message[\"role\"] == \"tool\" %}\n     "
         "   {%- if message.content is defined and message.content.content is defined %}\n            {%- set co"
         "ntent = message.content.content %}\n        {%- else %}\n            {%- set content = message.content"
         " %}\n        {%- endif %}\n        {{- '[TOOL_RESULTS] {\"content\": ' + content|string + \", \" }}\n "
         "       {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n            "
         "{{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n        {%- e"
         "ndif %}\n        {{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}\n    {%- else "
         "%}\n        {{- raise_exception(\"Only user and assistant roles are supported, with the exception of a"
         "n initial optional system message!\") }}\n    {%- endif %}\n{%- endfor %}\n"),
        ("[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assis"
         "tant</s>[INST] Another question[/INST]"),
        ("[INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>[INST] You are a helpfu"
         "l assistant\n\nAnother question[/INST]"),
        "",
        "</s>",
    ),
    pytest.param(
        "Mistral-Nemo-Instruct-2407 (mistralai 'v3-tekken' template; modified to have system prompt at start)",
        ("{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = messages[0][\"content\"] %"
         "}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n"
         "{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n{%- set user_"
         "messages = loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list %}\n\n{#- This block che"
         "cks for alternating user/assistant messages, skipping tool calling messages #}\n{%- set ns = namespace"
         "() %}\n{%- set ns.index = 0 %}\n{%- for message in loop_messages %}\n    {%- if not (message.role == "
         "\"tool\" or message.role == \"tool_results\" or (message.tool_calls is defined and message.tool_calls "
         "is not none)) %}\n        {%- if (message[\"role\"] == \"user\") != (ns.index % 2 == 0) %}\n          "
         "  {{- raise_exception(\"After the optional system message, conversation roles must alternate user/assi"
         "stant/user/assistant/...\") }}\n        {%- endif %}\n        {%- set ns.index = ns.index + 1 %}\n    "
         "{%- endif %}\n{%- endfor %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if messa"
         "ge[\"role\"] == \"user\" %}\n        {%- if tools is not none and (message == user_messages[-1]) %}\n "
         "           {{- \"[AVAILABLE_TOOLS][\" }}\n            {%- for tool in tools %}\n                {%- se"
         "t tool = tool.function %}\n                {{- '{\"type\": \"function\", \"function\": {' }}\n        "
         "        {%- for key, val in tool.items() if key != \"return\" %}\n                    {%- if val is st"
         "ring %}\n                        {{- '\"' + key + '\": \"' + val + '\"' }}\n                    {%- el"
         "se %}\n                        {{- '\"' + key + '\": ' + val|tojson }}\n                    {%- endif "
         "%}\n                    {%- if not loop.last %}\n                        {{- \", \" }}\n              "
         "      {%- endif %}\n                {%- endfor %}\n                {{- \"}}\" }}\n                {%- "
         "if not loop.last %}\n                    {{- \", \" }}\n                {%- else %}\n                 "
         "   {{- \"]\" }}\n                {%- endif %}\n            {%- endfor %}\n            {{- \"[/AVAILABL"
         "E_TOOLS]\" }}\n            {%- endif %}\n        {%- if loop.last and system_message is defined %}\n  "
         "          {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n      "
         "  {%- else %}\n            {{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %"
         "}\n    {%- elif (message.tool_calls is defined and message.tool_calls is not none) %}\n        {{- \"["
         "TOOL_CALLS][\" }}\n        {%- for tool_call in message.tool_calls %}\n            {%- set out = tool_"
         "call.function|tojson %}\n            {{- out[:-1] }}\n            {%- if not tool_call.id is defined o"
         "r tool_call.id|length != 9 %}\n                {{- raise_exception(\"Tool call IDs should be alphanume"
         "ric strings with length 9!\") }}\n            {%- endif %}\n            {{- ', \"id\": \"' + tool_call"
         ".id + '\"}' }}\n            {%- if not loop.last %}\n                {{- \", \" }}\n            {%- el"
         "se %}\n                {{- \"]\" + eos_token }}\n            {%- endif %}\n        {%- endfor %}\n    "
         "{%- elif message[\"role\"] == \"assistant\" %}\n        {{- message[\"content\"] + eos_token}}\n    {%"
         "- elif message[\"role\"] == \"tool_results\" or message[\"role\"] == \"tool\" %}\n        {%- if messa"
         "ge.content is defined and message.content.content is defined %}\n            {%- set content = message"
         ".content.content %}\n        {%- else %}\n            {%- set content = message.content %}\n        {%"
         "- endif %}\n        {{- '[TOOL_RESULTS]{\"content\": ' + content|string + \", \" }}\n        {%- if no"
         "t message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n            {{- raise_except"
         "ion(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n        {%- endif %}\n       "
         " {{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}\n    {%- else %}\n        {{- "
         "raise_exception(\"Only user and assistant roles are supported, with the exception of an initial option"
         "al system message!\") }}\n    {%- endif %}\n{%- endfor %}\n"),
        ("[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assist"
         "ant   </s>[INST]Another question[/INST]"),
        ("[INST]Hello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   </s>[INST]You are a helpf"
         "ul assistant\n\nAnother question[/INST]"),
        "",
        "</s>",
    ),
    pytest.param(
        "mistralai/Mistral-Large-Instruct-2411 (mistralai 'v7' template)",
        ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['"
         "content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + message['content"
         "'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_t"
         "oken }}{% else %}{{ raise_exception('Only user, system and assistant roles are supported!') }}{% endif"
         " %}{% endfor %}"),
        ("[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who "
         "are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]"),
        ("[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who "
         "are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]"),
        "",
        "</s>",
    ),
    pytest.param(
        "phi-4",
        ("{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
         "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>"
         "' + message['content'] + '<|im_end|><|im_start|>assistant<|im_sep|>'}}{% elif (message['role'] == 'ass"
         "istant') %}{{message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}"),
        ("<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_e"
         "nd|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|><|"
         "im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another questi"
         "on<|im_end|><|im_start|>assistant<|im_sep|>"),
        ("<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_e"
         "nd|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|><|"
         "im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another questi"
         "on<|im_end|><|im_start|>assistant<|im_sep|>"),
        "",
        "",
    ),
]


@pytest.mark.parametrize(("name", "template", "builtin_expected", "jinja_expected", "bos", "eos"), LLAMA_CPP_CASES)
def test_llama_cpp_template_cases(name, template, builtin_expected, jinja_expected, bos, eos):
    """Each case twice, as llama.cpp's test does: the jinja path (common_chat_templates_apply) and the built-in the
    template is detected as (llama_chat_apply_template)."""
    vocab = Vocab(["x", bos or "<bos>", eos or "<eos>"], bos=1 if bos else None, eos=2 if eos else None)
    assert render(template, vocab, LLAMA_CPP_CONV, True) == jinja_expected
    assert apply_builtin(detect_builtin(template), LLAMA_CPP_CONV, True) == builtin_expected


def test_granite_tool_call_roles():
    """test-chat-template.cpp's granite case: extra roles, written as they are."""
    conv = [*LLAMA_CPP_CONV, {"role": "user", "content": "What is the weather?"},
            {"role": "assistant_tool_call", "content": '[{"name": "get_weather", "arguments": {"location": "NYC"}}]'},
            {"role": "tool_response", "content": '{"temperature": 72}'}]
    assert apply_builtin("granite", conv, True).endswith(
        "<|start_of_role|>user<|end_of_role|>What is the weather?<|end_of_text|>\n"
        "<|start_of_role|>assistant_tool_call<|end_of_role|><|tool_call|>[{\"name\": \"get_weather\", \"arguments\": "
        "{\"location\": \"NYC\"}}]<|end_of_text|>\n<|start_of_role|>tool_response<|end_of_role|>{\"temperature\": 72}"
        "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>")


# --- built-in templates --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "builtin"), [
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3"), ("meta-llama-Llama-3.2-3B-Instruct", "llama3"),
    ("Qwen-Qwen2.5-7B-Instruct", "chatml"), ("Qwen-Qwen3-0.6B", "chatml"),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral-v3-tekken"),
    ("unsloth-mistral-Devstral-Small-2507", "mistral-v7"),
    ("microsoft-Phi-3.5-mini-instruct", "phi3"), ("google-gemma-2-2b-it", "gemma"),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "deepseek3"), ("ibm-granite-granite-4.0", "granite-4.0"),
    ("llama-cpp-rwkv-world", "rwkv-world"), ("openai-gpt-oss-120b", "gpt-oss"),
])
def test_detect_builtin_on_real_templates(name, builtin):
    """llm_chat_detect_template's answer for each file (checked against llama.cpp's own function)."""
    assert detect_builtin(template_file(name).read_text()) == builtin


SHORT = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": " Hello. "}, {"role": "user", "content": "Bye"}]


@pytest.mark.parametrize(("name", "expected"), [
    # these are llama.cpp's llm_chat_apply_template outputs for SHORT (its function, compiled, gave the same)
    ("chatml", "<|im_start|>system\n Be brief. <|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
               "<|im_start|>assistant\n Hello. <|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"),
    ("llama3", "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
               "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant"
               "<|end_header_id|>\n\n"),
    ("phi3", "<|system|>\n Be brief. <|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n Hello. <|end|>\n<|user|>\nBye"
             "<|end|>\n<|assistant|>\n"),
    ("gemma", "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
              "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"),
    ("llama2", "[INST]  Be brief. \nHi [/INST] Hello. </s>[INST] Bye [/INST]"),
    ("llama2-sys", "[INST] <<SYS>>\n Be brief. \n<</SYS>>\n\nHi [/INST] Hello. </s>[INST] Bye [/INST]"),
    ("mistral-v1", " [INST]  Be brief. \n\nHi [/INST]  Hello. </s> [INST] Bye [/INST]"),
    ("mistral-v3", "[INST]  Be brief. \n\nHi[/INST] Hello.</s>[INST] Bye[/INST]"),
    ("mistral-v3-tekken", "[INST] Be brief. \n\nHi[/INST] Hello. </s>[INST]Bye[/INST]"),
    ("mistral-v7", "[SYSTEM_PROMPT]  Be brief. [/SYSTEM_PROMPT][INST] Hi[/INST]  Hello. </s>[INST] Bye[/INST]"),
    ("mistral-v7-tekken", "[SYSTEM_PROMPT] Be brief. [/SYSTEM_PROMPT][INST]Hi[/INST] Hello. </s>[INST]Bye[/INST]"),
])
def test_builtins(name, expected):
    assert apply_builtin(name, SHORT, True) == expected
    assert render(name, Vocab(["x"]), SHORT, True) == expected  # a built-in's name works as a template


def test_builtin_errors():
    with pytest.raises(ValueError, match="'gpt-oss' is not implemented here"):
        apply_builtin("gpt-oss", SHORT, True)
    with pytest.raises(ValueError, match="'nope' is unknown"):
        apply_builtin("nope", SHORT, True)
    assert "llama3" in BUILTINS and detect_builtin("no markers at all") is None


@pytest.mark.parametrize(("special", "name"), [
    (("<start_of_turn>", "<end_of_turn>"), "gemma"),
    (("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), "llama3"),
    (("[INST]", "[/INST]"), "mistral-v3"),
    (("[INST]", "[/INST]", "[SYSTEM_PROMPT]"), "mistral-v7"),
    (("<|user|>", "<|assistant|>", "<|end|>"), "phi3"),
    (("<|im_start|>", "<|im_end|>"), "chatml"),
    ((), "chatml"),
])
def test_builtin_for_a_vocabulary_without_template(special, name):
    vocab = mini_vocab("<s>", "</s>", *special)
    assert builtin_template_name(vocab) == name
    # the built-in's text after the BOS the vocabulary adds (the tokens llama.cpp's tokenizer gives)
    assert apply_template(vocab, SHORT) == "<s>" + apply_builtin(name, SHORT, True)
    assert apply_template(mini_vocab("<s>", "</s>", *special, add_bos=False), SHORT) == apply_builtin(name, SHORT, True)


def test_llama3_vocab_without_template_gets_llama3(vocabs):
    v = vocabs["llama-bpe"]
    assert not v.chat_template and builtin_template_name(v) == "llama3"
    assert v.add_bos  # llama.cpp's default for a llama-bpe vocabulary: the built-in's text follows the BOS
    assert apply_template(v, "Hi") == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                                       "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_one_probe_gives_what_a_template_does_with_messages_and_tools():
    # Qwen 2.5 renders tools, calls (their arguments through tojson: objects only), several calls and results, and
    # a system role
    qwen = template_caps(template_file("Qwen-Qwen2.5-7B-Instruct").read_text())
    assert qwen.to_json() == {"supports_object_arguments": True, "supports_parallel_tool_calls": True,
                              "supports_string_content": True, "supports_system_role": True,
                              "supports_tool_calls": True, "supports_tool_responses": True, "supports_tools": True,
                              "supports_typed_content": False}
    # Gemma 2's template refuses a system role and renders no tools: the polyfill's example call is probed too
    gemma = template_caps(template_file("google-gemma-2-2b-it").read_text())
    assert (gemma.system_role, gemma.tools, gemma.tool_calls) == (False, False, False)
    assert '"name": "tool_name"' in gemma.example
