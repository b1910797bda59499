"""``Vocab``: token byte strings, special and end-of-generation sets, and incremental UTF-8 decoding.

This is the part of the vocabulary the samplers need (DRY breakers, infill pieces). Without a model's
tokenizer, :meth:`Vocab.tokenize` uses greedy longest-match over the token bytes; ``Vocab.from_gguf`` (the
runtime) brings the model's own tokenizer.
"""

from __future__ import annotations

import codecs
import functools
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from samplechain.gguf import GGUFFile


class StreamDecoder:
    """Turns tokens into text incrementally; never emits part of a multi-byte character."""

    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(self._vocab.token_bytes(token))

    def flush(self) -> str:
        """Whatever is pending, with an incomplete trailing sequence replaced by U+FFFD."""
        return self._decoder.decode(b"", final=True)


class Vocab:
    """A vocabulary: each token's raw bytes, its special/end-of-generation status, and BOS/EOS/EOT ids."""

    def __init__(
        self,
        tokens: Sequence[bytes],
        *,
        eog: Iterable[int] = (),
        special: Iterable[int] = (),
        bos: int | None = None,
        eos: int | None = None,
        eot: int | None = None,
        add_bos: bool | None = None,
        add_eos: bool = False,
        tokenizer: Any = None,
        chat_template: str | None = None,
        pieces: Sequence[bytes] | None = None,
    ) -> None:
        self._tokens = [self._check_token(i, t) for i, t in enumerate(tokens)]
        if not self._tokens:
            raise ValueError("a vocabulary needs at least one token")
        n = len(self._tokens)
        self.bos = self._check_id("bos", bos)
        self.eos = self._check_id("eos", eos)
        self.eot = self._check_id("eot", eot)
        self.eog = frozenset(self._check_id("eog token", t) for t in eog)
        if self.eos is not None or self.eot is not None:
            self.eog |= {t for t in (self.eos, self.eot) if t is not None}
        self.special = frozenset(self._check_id("special token", t) for t in special)
        self._lookup: dict[bytes, int] | None = None
        self._max_len = max(len(t) for t in self._tokens)
        # tables built once per vocabulary by their users: the DRY sampler's processed breaker sets, by breaker list
        # (samplers.dry.process_breakers, most recently used last), and the grammar's token table (TokenTable.of)
        self.dry_breakers: dict = {}
        self.grammar_tokens: Any = None
        self.add_bos = (self.bos is not None) if add_bos is None else bool(add_bos)
        self.add_eos = bool(add_eos)
        self.tokenizer = tokenizer  # the model's own tokenizer (``GGUFTokenizer``); None: longest match
        self.chat_template = chat_template
        # llama.cpp's token_to_piece with ``special`` on (None: the token bytes); unused tokens are empty there
        self._pieces = None if pieces is None else [self._check_token(i, t) for i, t in enumerate(pieces)]
        if self._pieces is not None and len(self._pieces) != n:
            raise ValueError(f"{len(self._pieces)} pieces for {n} tokens")
        assert n == self.n_tokens

    @classmethod
    def from_gguf(cls, source: str | os.PathLike[str] | GGUFFile) -> Vocab:
        """The vocabulary of a GGUF model: token bytes, special/EOG sets, the model's tokenizer, chat template."""
        from samplechain.gguf import GGUFFile
        from samplechain.tokenizer.gguf_tokenizer import ATTR_CONTROL, ATTR_UNKNOWN, GGUFTokenizer, token_bytes_table

        gguf = source if isinstance(source, GGUFFile) else GGUFFile(source)
        meta = gguf.metadata
        tok = GGUFTokenizer(meta)
        tokens = token_bytes_table(tok.model, tok.tokens, tok.types)
        # one object where a token's piece is its bytes (most are): ~6 MiB less for a 152k-token vocabulary
        tok.pieces = [t if p == t else p for t, p in zip(tokens, tok.pieces, strict=True)]
        vocab = cls(
            tokens,
            eog=tok.eog,
            special=[i for i, a in enumerate(tok.attrs) if a & (ATTR_CONTROL | ATTR_UNKNOWN)],
            bos=tok.bos, eos=tok.eos, eot=tok.eot,
            add_bos=tok.add_bos,
            add_eos=tok.add_eos,
            tokenizer=tok,
            chat_template=meta.get("tokenizer.chat_template"),
            pieces=tok.pieces,
        )
        vocab.eog = tok.eog  # exactly llama.cpp's set (it may leave out an EOT it found, as for gpt-oss's <|end|>)
        return vocab

    @staticmethod
    def _check_token(i: int, t: object) -> bytes:
        if isinstance(t, str):
            return t.encode("utf-8")
        if not isinstance(t, (bytes, bytearray)):
            raise ValueError(f"token {i} must be bytes or str, got {type(t).__name__}")
        return bytes(t)

    def _check_id(self, what: str, token: int | None) -> int | None:
        if token is None:
            return None
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < len(self._tokens):
            raise ValueError(f"{what} {token!r} is not a token id in [0, {len(self._tokens)})")
        return token

    @property
    def n_tokens(self) -> int:
        return len(self._tokens)

    @functools.cached_property
    def max_piece_bytes(self) -> int:
        """The longest token's length in bytes: a text of ``n`` bytes has at least ``n / max_piece_bytes`` tokens."""
        return max((len(t) for t in self._tokens), default=1)

    def token_bytes(self, token: int) -> bytes:
        """The token's raw bytes (special tokens rendered as their text)."""
        return self._tokens[token]

    def piece(self, token: int, special: bool = False) -> bytes:
        """The token's bytes as llama.cpp's ``token_to_piece``: special tokens are empty unless ``special``."""
        if not special and token in self.special:
            return b""
        return self._tokens[token] if self._pieces is None else self._pieces[token]

    def is_eog(self, token: int) -> bool:
        return token in self.eog

    @property
    def control(self) -> frozenset[int]:
        """Control tokens: special but not end-of-generation. Grammars match them by id only, never as text."""
        return self.special - self.eog

    def tokenize_bytes(self, data: bytes) -> list[int]:
        """Greedy longest-match tokenization over the non-special tokens (the fallback tokenizer)."""
        if self._lookup is None:
            self._lookup = {}
            for i, t in enumerate(self._tokens):
                if t and i not in self.special:
                    self._lookup.setdefault(t, i)
        out: list[int] = []
        pos = 0
        while pos < len(data):
            for length in range(min(self._max_len, len(data) - pos), 0, -1):
                token = self._lookup.get(data[pos : pos + length])
                if token is not None:
                    out.append(token)
                    pos += length
                    break
            else:
                raise ValueError(f"cannot tokenize byte {data[pos]:#04x} at offset {pos}: no token covers it")
        return out

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, as llama.cpp's ``llama_tokenize``: ``add_special`` adds BOS (and EOS) when the
        vocabulary asks for them; ``parse_special`` matches control tokens written in the text."""
        if self.tokenizer is not None:
            ids = self.tokenizer.encode(text, parse_special=parse_special)
        elif parse_special and self.special:
            ids = self._tokenize_with_special(text)
        else:
            ids = self.tokenize_bytes(text.encode("utf-8"))
        if add_special and self.add_bos and self.bos is not None:
            ids.insert(0, self.bos)
        if add_special and self.add_eos and self.eos is not None:
            ids.append(self.eos)
        return ids

    def _tokenize_with_special(self, text: str) -> list[int]:
        """Fallback tokenization where special tokens written in the text are matched whole (longest first)."""
        specials = sorted(((self._tokens[t], t) for t in self.special if self._tokens[t]), key=lambda x: -len(x[0]))
        data = text.encode("utf-8")
        out: list[int] = []
        start = pos = 0
        while pos < len(data):
            hit = next(((b, t) for b, t in specials if data.startswith(b, pos)), None)
            if hit is None:
                pos += 1
                continue
            out += self.tokenize_bytes(data[start:pos])
            out.append(hit[1])
            pos = start = pos + len(hit[0])
        return out + self.tokenize_bytes(data[start:])

    def detokenize(self, ids: Iterable[int], special: bool = False, remove_special: bool = False) -> str:
        """Text of ``ids`` as llama.cpp's ``llama_detokenize(remove_special, unparse_special=special)``: with the
        model's tokenizer, a SentencePiece text's leading space comes off and ``clean_spaces`` vocabularies drop
        the spaces before punctuation; special tokens render only with ``special``."""
        if self.tokenizer is not None and hasattr(self.tokenizer, "detokenize"):
            data = self.tokenizer.detokenize(list(ids), remove_special=remove_special, unparse_special=special)
        else:
            data = b"".join(self.piece(int(t), special) for t in ids)
        return data.decode("utf-8", errors="replace")

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self)
