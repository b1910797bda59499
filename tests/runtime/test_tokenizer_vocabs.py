"""Our GGUF tokenizer against llama.cpp's, on llama.cpp's own vocab-only GGUFs (``tests/llama_tree.py``).

* every case of llama.cpp's test-tokenizer-0 (``models/ggml-vocab-<name>.gguf.inp`` / ``.out``: no BOS, special
  tokens not parsed);
* seeded random texts (mixed scripts, whitespace runs, digits, emoji, special-token texts, code) with llama.cpp's
  tokens, detokenized texts, BOS/EOS/EOG sets and pieces, stored by ``tests/fixtures/tokenizer/make_cases.py``;
* the BOS/EOS/EOT/EOG facts llama.cpp derives, stated here as values.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import pytest

from llama_tree import vocab_file
from samplechain.vocab import Vocab

CASE_VOCABS = ["llama-bpe", "llama-spm", "qwen2", "qwen35", "phi-3", "gpt-2", "deepseek-llm", "deepseek-coder",
               "starcoder", "command-r", "falcon", "mpt", "refact"]
FIXTURE = Path(__file__).parent.parent / "fixtures" / "tokenizer" / "llama_cpp_cases.json"


@functools.cache
def vocab(name: str) -> Vocab:
    return Vocab.from_gguf(vocab_file(name))


@functools.lru_cache(maxsize=1)
def fixture() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def read_cases(name: str) -> list[tuple[str, list[int]]]:
    """test-tokenizer-0's format: inputs separated by ``\\n__ggml_vocab_test__\\n``, one line of ids per input."""
    path = vocab_file(name)
    raw = Path(f"{path}.inp").read_bytes().decode("utf-8")
    texts = raw.split("\n__ggml_vocab_test__\n")
    lines = Path(f"{path}.out").read_text(encoding="utf-8").split("\n")[:len(texts)]
    assert len(lines) == len(texts)
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]


@pytest.mark.parametrize("name", CASE_VOCABS)
def test_llama_cpp_tokenizer_cases(name):
    v = vocab(name)
    cases = read_cases(name)
    assert len(cases) == (51 if name == "qwen35" else 47)
    wrong = [(text, ids, got) for text, ids in cases
             if (got := v.tokenize(text, add_special=False, parse_special=False)) != ids]
    assert wrong == []


@pytest.mark.parametrize("name", list(fixture()["vocabs"]))
def test_random_texts_match_llama_cpp(name):
    v = vocab(name)
    texts, expected = fixture()["texts"], fixture()["vocabs"][name]
    wrong = []
    for text, (plain, parsed, detok, detok_special) in zip(texts, expected["cases"], strict=True):
        ids = [int(x) for x in parsed.split()]
        got = (" ".join(map(str, v.tokenize(text, add_special=True, parse_special=False))),
               " ".join(map(str, v.tokenize(text, add_special=True, parse_special=True))),
               v.tokenizer.detokenize(ids).decode("utf-8", "backslashreplace"),
               v.tokenizer.detokenize(ids, remove_special=True, unparse_special=True).decode(
                   "utf-8", "backslashreplace"))
        if got != (plain, parsed, detok, detok_special):
            wrong.append(text)
    assert wrong == []


@pytest.mark.parametrize("name", list(fixture()["vocabs"]))
def test_vocab_facts_and_pieces_match_llama_cpp(name):
    v = vocab(name)
    expected = fixture()["vocabs"][name]
    assert (v.bos, v.eos, v.eot, v.add_bos, v.add_eos) == tuple(expected[k] for k in
                                                             ("bos", "eos", "eot", "add_bos", "add_eos"))
    assert sorted(v.eog) == expected["eog"]
    digest = hashlib.sha256()
    for special in (False, True):
        for t in range(v.n_tokens):
            piece = v.piece(t, special)
            digest.update(len(piece).to_bytes(4, "little") + piece)
    assert digest.hexdigest() == expected["pieces"]


# (bos, eos, eot, add_bos, add_eos, eog) as llama.cpp 0.3.36 loads them
FACTS = {
    "llama-bpe": (128000, 128001, 128009, True, False, {128001, 128009}),  # add_bos: llama.cpp's default for llama3
    "llama-spm": (1, 2, None, True, False, {2}),
    "qwen2": (151643, 151643, 151645, False, False, {151643, 151645, 128247}),
    "qwen35": (151643, 151643, 151645, False, False, {151643, 151645, 128247}),
    "phi-3": (1, 32000, 32007, True, False, {2, 32000, 32007}),
    "gpt-2": (50256, 50256, 50256, False, False, {50256}),
    "deepseek-llm": (100000, 100001, 100001, True, False, {100001}),
    "deepseek-coder": (32013, 32014, 32014, True, False, {32014}),
    "starcoder": (0, 0, 0, False, False, {0, 4}),  # 4: <fim_pad>
    "command-r": (5, 255001, None, True, False, {0, 255001}),  # 0: <PAD>, taken for the FIM pad token
    "falcon": (11, 11, 11, False, False, {11}),
    "mpt": (0, 0, 0, False, False, {0}),
    "refact": (0, 0, 0, False, False, {0, 4, 18}),
    "gpt-neox": (0, 0, 0, False, False, {0}),
}


@pytest.mark.parametrize("name", list(FACTS))
def test_bos_eos_eog(name):
    v = vocab(name)
    assert (v.bos, v.eos, v.eot, v.add_bos, v.add_eos, set(v.eog)) == FACTS[name]
    ids = v.tokenize("Hi", add_special=True)
    assert (ids[0] == v.bos) == FACTS[name][3]


def test_known_differences_of_the_old_tokenizer_are_gone():
    llama3, spm = vocab("llama-bpe"), vocab("llama-spm")
    # ignore_merges: a word that is a token is taken whole
    assert llama3.tokenize("Cửa Việt", add_special=True) == [128000, 34, 91163, 101798]
    # SentencePiece merges by score: " Hello" is "▁" + "▁Hello"
    assert spm.tokenize(" Hello") == [29871, 15043]
    assert spm.tokenize(" Hello", add_special=True) == [1, 29871, 15043]
    # qwen2's own pre-tokenizer: digits one by one, letters with a leading non-letter
    assert vocab("qwen2").tokenize("1234 x") == [16, 17, 18, 19, 856]


def test_detokenize_as_llama_cpp():
    spm = vocab("llama-spm")
    ids = spm.tokenize("Hello world", add_special=True)
    assert spm.detokenize(ids) == " Hello world"  # BOS kept: its (empty) piece took the leading space's removal
    assert spm.detokenize(ids[1:]) == "Hello world"
    assert spm.detokenize(ids, special=True) == "<s> Hello world"
    gpt2 = vocab("gpt-2")  # clean_spaces: no space before . , ! ? and 's 'm 're 've
    assert gpt2.detokenize(gpt2.tokenize("I 'm here . Is it ?")) == "I'm here. Is it?"
    qwen = vocab("qwen2")  # qwen2 keeps them
    assert qwen.detokenize(qwen.tokenize("I 'm here .")) == "I 'm here ."


def test_special_tokens_and_byte_fallback():
    spm = vocab("llama-spm")
    assert spm.tokenize("<s>x", parse_special=True) == [1, 921]  # a space goes in after a special token
    assert spm.tokenize("<s>x") == [529, 29879, 29958, 29916]
    assert spm.tokenize("\u0905\U0001f916") == [29871, 31350, 243, 162, 167, 153]  # 🤖: byte tokens <0xF0>...
    assert spm.detokenize(spm.tokenize("\u0905\U0001f916")) == "\u0905\U0001f916"
    llama3 = vocab("llama-bpe")
    assert llama3.tokenize("<|eot_id|><|start_header_id|>", parse_special=True) == [128009, 128006]
    assert llama3.piece(128009) == b"" and llama3.piece(128009, special=True) == b"<|eot_id|>"
