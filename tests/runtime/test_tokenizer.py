"""Tokenization from GGUF against transformers' tokenizer of the same file; token bytes; streaming text."""

import pytest

CORPUS = [
    "Hello world!", "  leading spaces and trailing  ", "Numbers 1234567 and 3.14159, 1e-9 and 2024-11-21",
    "Ünïcödé façade naïve — “quotes” \u2018single\u2019 …", "日本語のテキストと中文文本。한국어 텍스트도 있습니다",
    "emoji 🤖🎉👩‍👩‍👧‍👦 🇫🇷 ok", "def f(x):\n\treturn x**2  # comment\n\n\n    if a != b: pass",
    "Ελληνικά, русский текст, العربية, עברית, हिन्दी", "tabs\t\tand\r\nCRLF lines\n\n",
    "x" * 50 + " " + "ab" * 30, "'s 've 're I'll don't WE'LL", "\u00a0nbsp\u200bzero width",
    '{"key": [1, 2, 3], "nested": {"a": null}}', "<|im_start|>user\nHi<|im_end|>\n",
    "<start_of_turn>user\nhello<end_of_turn>\n", "<bos>text with <unk> and <eos>",
]


@pytest.mark.parametrize("name", ["smollm2", pytest.param("gemma3-270m", marks=pytest.mark.slow)])
def test_tokenization_matches_the_reference(name, smol, gemma, reference_tokenizers):
    model = smol if name == "smollm2" else gemma
    ref = reference_tokenizers(name)
    for text in CORPUS:
        assert model.tokenize(text, add_special=False) == ref.encode(text, add_special_tokens=False), text


def test_special_tokens_are_matched_only_when_asked(smol):
    v = smol.vocab
    assert v.tokenize("<|im_start|>", parse_special=True) == [1]
    plain = v.tokenize("<|im_start|>", parse_special=False)
    assert len(plain) > 1 and 1 not in plain


def test_bos_follows_the_vocabulary(smol, gemma):
    assert not smol.vocab.add_bos and smol.tokenize("hi")[0] != smol.vocab.bos
    assert gemma.vocab.add_bos and gemma.tokenize("hi")[0] == gemma.vocab.bos == 2


def test_vocab_sets(smol, gemma):
    assert (smol.vocab.bos, smol.vocab.eos) == (1, 2)
    assert smol.vocab.eog == {0, 2, 4}  # <|endoftext|>, <|im_end|> and <reponame> (FIM repo: llama.cpp ends there)
    assert len(smol.vocab.special) == 17
    assert (gemma.vocab.bos, gemma.vocab.eos) == (2, 1)
    assert {1, 106} <= gemma.vocab.eog  # <eos>, <end_of_turn>
    assert smol.vocab.piece(1) == b"" and smol.vocab.piece(1, special=True) == b"<|im_start|>"


@pytest.mark.parametrize("name", ["smollm2", pytest.param("gemma3-270m", marks=pytest.mark.slow)])
def test_token_bytes_decode_like_the_reference(name, smol, gemma, reference_tokenizers):
    model = smol if name == "smollm2" else gemma
    ref = reference_tokenizers(name)
    text = " ".join(CORPUS[:12])
    ids = model.tokenize(text, add_special=False)
    assert model.detokenize(ids) == text
    for i in ids[:200]:
        assert model.vocab.token_bytes(i).decode("utf-8", "replace") == ref.decode([i]) or \
            len(model.vocab.token_bytes(i)) == 1  # a single byte of a multi-byte character


@pytest.mark.parametrize("name", ["smollm2", "gemma3-270m"])
def test_stream_decoder_never_emits_a_broken_character(name, smol, gemma):
    model = smol if name == "smollm2" else gemma
    text = "日本語 🤖🎉 Ελληνικά naïve"
    dec = model.vocab.stream_decoder()
    pieces = [dec.push(t) for t in model.tokenize(text, add_special=False)]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + dec.flush() == text


def test_chat_template(smol, gemma):
    prompt = smol.apply_chat_template("What is 2+2?")
    assert prompt.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    # Gemma's GGUF has no template: llama.cpp's built-in one for its turn markers
    assert gemma.apply_chat_template("hi") == "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
