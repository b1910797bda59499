"""The pre-tokenizers: llm_tokenizer_bpe's regex lists, per pre-tokenizer type (``tokenizer.ggml.pre``), run as
llama.cpp's unicode_regex_split runs them (its own Unicode classes, its hand-written splitters, its quirks)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from samplechain.tokenizer.unicode import ACCENT_MARK, LETTER, NUMBER, unicode

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LLM_LETTERS = (
    "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-"
    "\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57"
    "\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-"
    "\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-"
    "\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-"
    "\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-"
    "\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)
_DIGITS_THEN_GPT2 = (r"\p{N}", _GPT2)
PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN35,),
    "gpt2": (_GPT2,),
    "digits": _DIGITS_THEN_GPT2,
    "deepseek-llm": ("[\r\n]", _DEEPSEEK_LLM_LETTERS,
                     "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", r"\s+$", _CJK, r"\p{N}+"),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
}
# tokenizer.ggml.pre -> (regex list, ignore_merges, clean_spaces, add_bos default, BOS cleared)
PRE_TYPES: dict[str, tuple[str, bool, bool, bool | None, bool]] = {}


def _pre(names: str, regexes: str, ignore_merges: bool = False, clean_spaces: bool = True,
         add_bos: bool | None = None, no_bos: bool = False) -> None:
    for name in names.split():
        PRE_TYPES[name] = (regexes, ignore_merges, clean_spaces, add_bos, no_bos)


_pre("default", "default")
_pre("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", "llama3", ignore_merges=True,
     add_bos=True)
_pre("dbrx smaug-bpe", "llama3")
_pre("chatglm-bpe", "llama3", no_bos=True)
_pre("glm4 glm5", "llama3", ignore_merges=True, no_bos=True)
_pre("deepseek-llm", "deepseek-llm", clean_spaces=False)
_pre("deepseek-coder", "deepseek-coder", clean_spaces=False)
_pre("falcon", "falcon")
_pre("mpt olmo jais exaone4 gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert "
     "jina-v1-en jina-v2-code roberta-bpe", "gpt2")
_pre("trillion granite-docling", "gpt2", clean_spaces=False)
_pre("starcoder refact codeshell exaone minerva-7b mellum2", "digits")
_pre("command-r smollm", "digits", clean_spaces=False)
_pre("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open grok-2", "qwen2", clean_spaces=False)
_pre("megrez stablelm2", "qwen2")
_pre("qwen35", "qwen35", clean_spaces=False)

# llama.cpp's stand-ins for \p{...} in a regex over collapsed text (unicode_regex_split's k_ucat_cpt / k_ucat_map)
_UCAT_COLLAPSED = {
    r"\p{N}": "\xd1" + "0-9",
    r"\p{L}": "\xd2" + "A-Za-z",
    r"\p{P}": "\xd3" + r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    r"\p{M}": "\xd4",
    r"\p{S}": "\xd5" + r"\$\+<->^`\|\~",
    r"\p{Lu}": "\xd2" + "A-Za-z", r"\p{Ll}": "\xd2" + "A-Za-z", r"\p{Lt}": "\xd2" + "A-Za-z",
    r"\p{Lm}": "\xd2" + "A-Za-z", r"\p{Lo}": "\xd2" + "A-Za-z",
}


def _collapse_regex(expr: str) -> str:
    """llama.cpp's rewrite of a regex with Unicode categories for its collapsed text."""
    out = []
    inside = False
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
        elif inside and ch == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
        elif expr.startswith("\\p{", i) and i + 3 < len(expr):
            close = expr.find("}", i + 3)
            pat = expr[i:close + 1] if close != -1 and close <= i + 10 else ""
            if pat in _UCAT_COLLAPSED:
                out.append(_UCAT_COLLAPSED[pat] if inside else f"[{_UCAT_COLLAPSED[pat]}]")
                i = close + 1
                continue
            out.append(ch)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _ecmascript(expr: str) -> str:
    """An ECMAScript (std::regex) pattern as Python's ``re`` reads it the same way: ``$`` is the end only."""
    return re.sub(r"(?<!\\)\$(?=\)|\||$)", r"\\Z", expr)


def _custom_regex(expr: str) -> str | None:
    """llama.cpp's hand-written splitters (unicode_regex_split_custom_*), as regexes over the classes' ``view`` text."""
    u = unicode()
    L, N, M = (u.ascii_class(LETTER) + "\x80", u.ascii_class(NUMBER) + "\x81",
               u.ascii_class(ACCENT_MARK) + "\x82")
    W = "".join(re.escape(chr(c)) for c in sorted(u.whitespace) if c < 0x80) + "\x83"
    space_runs = rf"[{W}]*[\r\n]+|[{W}]+(?![^{W}])|[{W}]+|."
    if expr == _GPT2:
        return rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{W}{L}{N}]+|[{W}]+(?![^{W}])|[{W}]+|."
    if expr == _LLAMA3:
        return rf"{_CONTRACTIONS}|[^\r\n{L}{N}]?[{L}]+|[{N}]{{1,3}}| ?[^{W}{L}{N}]+[\r\n]*|{space_runs}"
    if expr == _QWEN2:
        return rf"{_CONTRACTIONS}|[^\r\n{L}{N}]?[{L}]+|[{N}]| ?[^{W}{L}{N}]+[\r\n]*|{space_runs}"
    if expr == _QWEN35:
        return rf"{_CONTRACTIONS}|[^\r\n{L}{N}]?[{L}{M}]+|[{N}]| ?[^{W}{L}{M}{N}]+[\r\n]*|{space_runs}"
    return None


class PreTokenizer:
    """unicode_regex_split: each regex splits every piece the previous ones left (matches and the gaps between)."""

    def __init__(self, regexes: Sequence[str]) -> None:
        self.steps: list[tuple[str, re.Pattern[str]]] = []
        for expr in regexes:
            custom = _custom_regex(expr)
            if custom is not None:
                self.steps.append(("view", re.compile(custom, re.DOTALL)))
            elif any(cat in expr for cat in _UCAT_COLLAPSED):
                self.steps.append(("collapsed", re.compile(_ecmascript(_collapse_regex(expr)), re.ASCII)))
            else:
                self.steps.append(("wide", re.compile(_ecmascript(expr), re.ASCII)))

    def split(self, text: str) -> list[str]:
        pieces = [(0, len(text))]
        views: dict[str, str] = {}
        for kind, pattern in self.steps:
            view = views.get(kind)
            if view is None:
                u = unicode()
                view = views[kind] = u.view(text) if kind == "view" else u.collapse(text) if kind == "collapsed" \
                    else u.widen(text)
            out: list[tuple[int, int]] = []
            for start, end in pieces:
                pos = start
                for m in pattern.finditer(view, start, end):
                    a, b = m.span()
                    if a == b:
                        continue
                    if a > pos:
                        out.append((pos, a))
                    out.append((a, b))
                    pos = b
                if pos < end:
                    out.append((pos, end))
            pieces = out
        return [text[a:b] for a, b in pieces]
