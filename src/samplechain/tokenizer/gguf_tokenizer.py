"""A model's own tokenizer, built from GGUF metadata exactly as llama.cpp's ``llama-vocab.cpp`` does.

Two families:

* ``gpt2`` (byte-level BPE: Llama 3, Qwen, GPT-2, DeepSeek, StarCoder, Command-R, Falcon, MPT, SmolLM, ...): the
  text is split by the pre-tokenizer that ``tokenizer.ggml.pre`` names (llama.cpp's regexes, run with llama.cpp's
  own Unicode classes and its quirks), each word is spelled in GPT-2's byte alphabet and merged by the file's
  merge ranks (``ignore_merges`` pre-tokenizers take a word that is a token whole).
* ``llama`` (SentencePiece: Llama 2, Mistral, Phi-3, Gemma): spaces become ``▁``, a space is put before the text
  and after each special token (``add_space_prefix``), adjacent symbols are merged highest score first
  (llama.cpp's ``llm_tokenizer_spm``), and what is not a token falls back to byte tokens ``<0xXX>``.

Special tokens are cut out of the text first as llama.cpp's ``tokenizer_st_partition`` does: longest first, every
occurrence; control and unknown tokens only with ``parse_special``, user-defined tokens always. Token attributes,
BOS/EOS defaults and the end-of-generation set follow ``llama_vocab::impl::load``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from samplechain.tokenizer.bpe import BYTE_DECODE, BpeEncoder, spelled_bytes
from samplechain.tokenizer.pretokenize import PRE_REGEXES, PRE_TYPES, PreTokenizer
from samplechain.tokenizer.spm import SpmEncoder

# llama_token_type values in GGUF
TOKEN_UNDEFINED, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = range(7)

# llama_token_attr bits
ATTR_UNDEFINED, ATTR_UNKNOWN, ATTR_UNUSED, ATTR_NORMAL, ATTR_CONTROL = 0, 1 << 0, 1 << 1, 1 << 2, 1 << 3
ATTR_USER_DEFINED, ATTR_BYTE, ATTR_NORMALIZED, ATTR_LSTRIP, ATTR_RSTRIP = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
_TYPE_ATTR = {TOKEN_UNKNOWN: ATTR_UNKNOWN, TOKEN_UNUSED: ATTR_UNUSED, TOKEN_NORMAL: ATTR_NORMAL,
              TOKEN_CONTROL: ATTR_CONTROL, TOKEN_USER_DEFINED: ATTR_USER_DEFINED, TOKEN_BYTE: ATTR_BYTE}

# Token texts llama.cpp treats as end of generation (llama_vocab::impl::load's list)
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})
# Texts that make a token the EOT / EOM / FIM token when the file names none (in llama.cpp's order)
_AUTO_TEXTS = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
            "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}


def _ascii_isspace(ch: str) -> bool:
    return ch in " \t\n\v\f\r"


def _key_id(metadata: dict[str, Any], key: str, n: int, default: int | None) -> int | None:
    """A special token id as llama.cpp reads it: the file's value if in range, else the default."""
    if default is not None and not 0 <= default < n:
        default = None
    value = metadata.get(f"tokenizer.ggml.{key}")
    if value is None:
        return default
    value = int(value)
    return value if 0 <= value < n else default


def token_bytes_table(model: str, tokens: Sequence[str], types: np.ndarray) -> list[bytes]:
    """Every token's raw bytes (control and user-defined tokens as their text)."""
    out: list[bytes] = []
    if model == "gpt2":
        for text, kind in zip(tokens, types.tolist(), strict=False):
            raw = None if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED) else spelled_bytes(text)
            out.append(text.encode("utf-8", errors="surrogateescape") if raw is None else raw)
        return out
    if model == "llama":
        for text, kind in zip(tokens, types.tolist(), strict=False):
            if kind == TOKEN_BYTE and len(text) == 6 and text.startswith("<0x"):
                out.append(bytes([int(text[3:5], 16)]))
            elif kind == TOKEN_CONTROL:
                out.append(text.encode("utf-8", errors="surrogateescape"))
            else:
                out.append(text.replace("▁", " ").encode("utf-8", errors="surrogateescape"))
        return out
    raise ValueError(f"tokenizer model {model!r} is not supported (gpt2, llama)")


class GGUFTokenizer:
    """Text <-> token ids for one GGUF vocabulary, as llama.cpp's ``llama_vocab``.

    Besides :meth:`encode`, it holds what ``llama_vocab::impl::load`` derives from the file: ``bos``/``eos``/
    ``eot``/``eom``/``unk``/``pad``/``fim_*`` ids, ``add_bos``/``add_eos``/``add_space_prefix``/``clean_spaces``,
    each token's attributes (``attrs``, llama.cpp's ``LLAMA_TOKEN_ATTR_*`` bits) and the end-of-generation set
    (``eog``); :meth:`piece` and :meth:`detokenize` are llama.cpp's ``token_to_piece`` and ``detokenize``.
    """

    def __init__(self, metadata: dict[str, Any]) -> None:
        self.model = str(metadata.get("tokenizer.ggml.model", ""))
        if self.model not in ("gpt2", "llama"):
            raise ValueError(f"tokenizer model {self.model!r} is not supported (gpt2, llama)")
        self.tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
        n = len(self.tokens)
        types = metadata.get("tokenizer.ggml.token_type")
        self.types = np.asarray(types if types is not None else np.full(n, TOKEN_NORMAL), dtype=np.int32)
        scores = metadata.get("tokenizer.ggml.scores")
        self.scores: list[float] = (np.asarray(scores, dtype=np.float32).tolist() if scores is not None
                                    else [0.0] * n)
        self.pre = str(metadata.get("tokenizer.ggml.pre", "") or "default")
        texts = self.tokens if all(self.tokens) else [t if t else f"[EMPTY_{i}]" for i, t in enumerate(self.tokens)]
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(texts)}  # the last of equal texts wins

        # vocabulary type and pre-tokenizer defaults (llama_vocab::impl::load)
        self.ignore_merges = False
        bos_default: int | None
        if self.model == "llama":
            bos_default, eos_default, unk_default = 1, 2, 0
            space_prefix, self.clean_spaces, add_bos = True, False, True
            self.exact = True
        else:
            bos_default, eos_default, unk_default = 11, 11, None
            space_prefix, add_bos = False, False
            self.exact = self.pre in PRE_TYPES  # unknown to us: GPT-2's rules
            regexes, self.ignore_merges, self.clean_spaces, pre_bos, no_bos = PRE_TYPES.get(
                self.pre, ("gpt2", False, True, None, False))
            add_bos = bool(pre_bos)
            if no_bos:
                bos_default = None
            self._bpe = BpeEncoder(self.token_to_id, metadata.get("tokenizer.ggml.merges"), self.ignore_merges,
                                   PreTokenizer(PRE_REGEXES[regexes]))
        self.add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", space_prefix))
        self.remove_extra_whitespaces = bool(metadata.get("tokenizer.ggml.remove_extra_whitespaces", False))

        ids = {
            "bos": _key_id(metadata, "bos_token_id", n, bos_default),
            "eos": _key_id(metadata, "eos_token_id", n, eos_default),
            "eot": _key_id(metadata, "eot_token_id", n, None),
            "eom": _key_id(metadata, "eom_token_id", n, None),
            "unk": _key_id(metadata, "unknown_token_id", n, unk_default),
            "sep": _key_id(metadata, "seperator_token_id", n, None),
            "pad": _key_id(metadata, "padding_token_id", n, None),
            "mask": _key_id(metadata, "mask_token_id", n, None),
        }
        for kind, key, old in (("fim_pre", "fim_pre_token_id", "prefix_token_id"),
                               ("fim_suf", "fim_suf_token_id", "suffix_token_id"),
                               ("fim_mid", "fim_mid_token_id", "middle_token_id"),
                               ("fim_pad", "fim_pad_token_id", None), ("fim_rep", "fim_rep_token_id", None),
                               ("fim_sep", "fim_sep_token_id", None)):
            ids[kind] = _key_id(metadata, key, n, None)
            if old is not None:
                ids[kind] = _key_id(metadata, old, n, ids[kind])
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos))
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))

        # token attributes from the types, then llama.cpp's fix-ups by token text
        if types is None:
            attrs = [ATTR_NORMAL] * n
        else:
            attrs = [_TYPE_ATTR.get(t, ATTR_UNDEFINED) for t in self.types.tolist()]
        by_text = self.token_to_id
        for kind, candidates in _AUTO_TEXTS.items():
            if ids[kind] is None:
                # llama.cpp takes the first hit in its hash map's order; the highest id is what it gives for the
                # vocabularies we know (Qwen's <|im_end|>, Llama 3's <|eot_id|>, Phi-3's <|end|>)
                found = [by_text[t] for t in candidates if t in by_text]
                if found:
                    ids[kind] = max(found)
                    attrs[ids[kind]] |= ATTR_CONTROL
        for text, i in by_text.items():
            if attrs[i] & ATTR_CONTROL and "unused" in text:
                attrs[i] |= ATTR_UNUSED
        eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
        for text, i in by_text.items():
            if text in EOG_TEXTS:
                eog.add(i)
                attrs[i] |= ATTR_CONTROL
        for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            if text in by_text:
                attrs[by_text[text]] = ATTR_USER_DEFINED
        eog |= {ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None}
        eog_texts = {self.tokens[i]: i for i in eog}
        if "<|end|>" in eog_texts and (("<|return|>" in eog_texts and ("<|call|>" in eog_texts or
                                                                        "<|calls|>" in eog_texts))
                                       or ({"<|calls|>", "<|flush|>"} <= eog_texts.keys()) or
                                       ("<|call|>" in eog_texts and "<|flush|>" in eog_texts)):
            eog.discard(eog_texts["<|end|>"])
            attrs[eog_texts["<|end|>"]] = ATTR_USER_DEFINED
        if "</s>" in eog_texts and ({"<|tool_response>", "<|plamo:eos|>"} & eog_texts.keys()):
            eog.discard(eog_texts["</s>"])
            attrs[eog_texts["</s>"]] = ATTR_NORMAL
        self.eog = frozenset(eog)
        for kind, value in ids.items():
            setattr(self, kind, value)

        special_mask = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
        self._special_order = sorted((i for i in range(n) if attrs[i] & special_mask),
                                     key=lambda i: (-len(texts[i].encode("utf-8", "surrogatepass")), i))
        self.pieces = [self._piece(texts[i], attrs[i]) for i in range(n)]
        name = str(metadata.get("general.name", "")).lower()
        if "phi-3" in name or "phi3" in name:
            for i in self._special_order:
                attrs[i] |= ATTR_RSTRIP
            for text, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                if text in by_text:
                    attrs[by_text[text]] = attrs[by_text[text]] | ATTR_RSTRIP if on else \
                        attrs[by_text[text]] & ~ATTR_RSTRIP
        elif "modern-bert" in name and "[MASK]" in by_text:
            attrs[by_text["[MASK]"]] |= ATTR_LSTRIP
        self.attrs = attrs
        self._texts = texts
        self._special_re: dict[bool, re.Pattern[str] | None] = {}
        self._spm = SpmEncoder(self.token_to_id, self.scores, self.unk) if self.model == "llama" else None

    # --- pieces

    def _piece(self, text: str, attr: int) -> bytes:
        """llama.cpp's token_to_piece with ``special`` on (its cache)."""
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            return text.encode("utf-8", "surrogatepass")
        if attr & ATTR_NORMAL:
            if self.model == "llama":
                return text.replace("\u2581", " ").encode("utf-8", "surrogatepass")
            raw = spelled_bytes(text)
            if raw is not None:
                return raw
            decode = BYTE_DECODE
            out = bytearray()
            for ch in text:
                if ch in decode:
                    out.append(decode[ch])
                else:
                    utf8 = ch.encode("utf-8", "surrogatepass")
                    out += b"[UNK_BYTE_0x" + utf8.hex().encode() + text.encode("utf-8", "surrogatepass") + b"]"
            return bytes(out)
        if attr & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def piece(self, token: int, special: bool = False) -> bytes:
        """llama.cpp's ``token_to_piece``: control and unknown tokens are empty unless ``special``."""
        if not special and self.attrs[token] & (ATTR_UNKNOWN | ATTR_CONTROL):
            return b""
        return self.pieces[token]

    def detokenize(self, ids: Sequence[int], remove_special: bool = False, unparse_special: bool = False) -> bytes:
        """llama.cpp's ``llama_detokenize``: the pieces joined, the leading space of SentencePiece text taken off,
        and (``clean_spaces`` vocabularies) the spaces before punctuation and contractions removed."""
        ids = [int(t) for t in ids]
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos:
            ids = ids[:-1]
        parts = []
        for t in ids:
            p = self.piece(t, unparse_special)
            if remove_space and p.startswith(b" "):
                p = p[1:]
            remove_space = False
            parts.append(p)
        text = b"".join(parts)
        return _clean_spaces(text) if self.clean_spaces else text

    # --- tokenization

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS); with ``parse_special`` control tokens written in the text match whole
        (user-defined tokens always do)."""
        out: list[int] = []
        if not text:
            return out
        fragments = self._partition(text, parse_special)
        if self.model == "llama":
            prev_special = True
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                else:
                    if self.add_space_prefix and prev_special:
                        frag = " " + frag
                    out += self._spm.encode(frag.replace(" ", "\u2581"))
                    prev_special = False
            return out
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
            else:
                out += self._bpe.encode(frag)
        return out

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """llama.cpp's ``llama_tokenize``: with ``add_special`` BOS/EOS as the vocabulary asks."""
        ids = self.encode(text, parse_special)
        if add_special and self.add_bos and self.bos is not None:
            ids.insert(0, self.bos)
        if add_special and self.add_eos and self.eos is not None:
            ids.append(self.eos)
        return ids

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """tokenizer_st_partition: special tokens cut out of the text, longest first, each at every occurrence."""
        pattern = self._special_re.get(parse_special, False)
        if pattern is False:
            order = [i for i in self._special_order
                     if parse_special or not self.attrs[i] & (ATTR_CONTROL | ATTR_UNKNOWN)]
            pattern = re.compile("|".join(re.escape(self._texts[i]) for i in order)) if order else None
            self._special_re[parse_special] = pattern
        if pattern is None or pattern.search(text) is None:
            return [text]
        fragments: list[str | int] = [text]
        for i in self._special_order:
            attr = self.attrs[i]
            if not parse_special and attr & (ATTR_CONTROL | ATTR_UNKNOWN):
                continue
            special = self._texts[i]
            if special not in text:
                continue
            out: list[str | int] = []
            for frag in fragments:
                if isinstance(frag, int) or special not in frag:
                    out.append(frag)
                    continue
                pos = 0
                while True:
                    at = frag.find(special, pos)
                    if at < 0:
                        break
                    if at > pos:
                        left = frag[pos:at]
                        if attr & ATTR_LSTRIP:
                            left = left.rstrip(" \t\n\v\f\r")
                        if left:
                            out.append(left)
                    out.append(i)
                    pos = at + len(special)
                    if attr & ATTR_RSTRIP:
                        while pos < len(frag) and _ascii_isspace(frag[pos]):
                            pos += 1
                if pos < len(frag):
                    out.append(frag[pos:])
            fragments = out
        return fragments


def _clean_spaces(data: bytes) -> bytes:
    """llama_detokenize's clean-up of spaces (three passes over the bytes, as written there)."""
    text = bytearray(data)
    total = len(text)
    # " ?", " !", " .", " ,"
    n1, total = total, 1 if total else 0
    for i in range(1, n1):
        x = text[i]
        if text[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        text[total] = x
        total += 1
    # " ' " -> "'"
    n2, total = total, 1 if total else 0
    i = 1
    while i < n2:
        x = text[i]
        if x == 0x27 and i + 1 < n2 and text[i - 1] == 0x20 and text[i + 1] == 0x20:
            total -= 1
            i += 1
            text[i] = 0
        text[total] = x
        total += 1
        i += 1
    # " 's", " 'm", " 're", " 've"
    n3, total = total, 1 if total else 0
    for i in range(1, n3):
        x = text[i]
        if text[i - 1] == 0x20 and x == 0x27 and i + 1 < n3:
            x1 = text[i + 1]
            if x1 in b"sm" or (i + 2 < n3 and x1 in b"rv" and text[i + 2] == 0x65 and x1 not in b"td"):
                total -= 1
        text[total] = x
        total += 1
    return bytes(text[:total])
