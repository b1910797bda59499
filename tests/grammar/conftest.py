import json
from pathlib import Path

import pytest

from samplechain import Vocab

# llama.cpp's grammar test cases (tests/test-grammar-integration.cpp, test-grammar-parser.cpp,
# test-llama-grammar.cpp, test-json-schema-to-grammar.cpp), collected as data so the tests run anywhere
CASES = json.loads((Path(__file__).parent / "grammar_cases.json").read_text(encoding="utf-8"))


_PACKAGED: dict[str, Vocab] = {}


def packaged_vocab(name: str) -> Vocab:
    """A packaged model's vocabulary, straight from its GGUF (once per session: its token table is built once)."""
    if name not in _PACKAGED:
        from samplechain.runtime import model_path

        _PACKAGED[name] = Vocab.from_gguf(model_path(name))
    return _PACKAGED[name]


def normalise(grammar: str) -> str:
    """As llama.cpp's test-json-schema-to-grammar: trim, strip leading blanks of every line."""
    return "\n".join(line.lstrip(" \t") for line in grammar.strip().split("\n"))


def feed(matcher, item) -> bool:
    """llama.cpp's test harness: a string is fed one code point per token (id 0); segments may be whole tokens."""
    segments = [{"text": item}] if isinstance(item, str) else item
    for seg in segments:
        if "token" in seg:
            if not matcher.accept_token(seg["token"], f"<[{seg['token']}]>".encode()):
                return False
        else:
            for ch in seg["text"]:
                if not matcher.accept_token(0, ch.encode("utf-8")):
                    return False
    return matcher.is_accepting()


@pytest.fixture(scope="session")
def toy_vocab():
    """A small vocabulary with multi-character tokens, split UTF-8 characters and end-of-generation tokens."""
    texts = [
        b"<s>", b"</s>", b"{", b"}", b'"', b":", b",", b" ", b"\n", b"a", b"b", b"c", b"ab", b"abc", b'{"',
        b'":', b'",', b'"}', b"true", b"false", b"null", b"0", b"1", b"2", b"12", b"-", b".", b"e", b"[", b"]",
        b"\xc3", b"\xa9", b"\xc3\xa9", b"\xe2\x82", b"\xac", b"\xe2\x82\xac", b"caf\xc3", b" \xe2", b"x", b"xx",
        b"\x80", b"\xff", b"", b"hello", b" world", b"<tool>", b"</tool>", b"\x00a", b"a\x00b",
    ]
    return Vocab(texts, eog=[1], special=[0, 1, 45, 46], bos=0, eos=1)
