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

import base64
import bisect
import heapq
import re
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

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

# --- llama.cpp's Unicode classes (src/unicode-data.cpp; regenerate with tests/fixtures/tokenizer/gen_unicode_flags.py)

_FLAG_CODES = (0x0000, 0x0001, 0x0002, 0x0004, 0x0008, 0x0010, 0x0020, 0x0040, 0x0080)
_NUMBER, _LETTER, _PUNCTUATION, _ACCENT_MARK, _SYMBOL = 0x0002, 0x0004, 0x0020, 0x0010, 0x0040
_UNICODE_WHITESPACE = (
    0x0009, 0x000a, 0x000b, 0x000c, 0x000d, 0x0020, 0x0085, 0x00a0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003,
    0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000,
)
_UNICODE_FLAGS = (
    "c-oCuTZmp)6?W~l*WUX-|8-"
    "{mxh0*Mf2Na3lgVUqPpYwwjg5pz6~vVI;03GV1uQ5C`VxxRhgwkzKJ=mBg+2&E`=Z9DAd27xDroURqzGO>DL#ch6!rVoJ~NqAEyC<M``>5nbzk"
    "3F=S^i2C25wFuwrOZ$eMy4@H5GRozz`fjeHtb(0U>{h5#DDEeU)|&?GvKvlXnLYmVB>1GSu$%p_0QWB4T+Kp8<Q5-"
    "U5!7Js5+toMTANnEh3&+%+SNR#wP!acAO+e%`%WuaXnMGr~@&mi5BXhf!3!MX{GCe=-"
    "wg?UkfiGGBVEf<PNI03EUO=whIn*rF7LUh><LiTm*Lg)bRSFNMuOm)Et)N{BgI2FU0nS?Zi#*3!dQTHxhEWjT8C_$1HJ!%U@Y*o+sjcID44Xl8"
    "C=ruBWqChHrG>3h5&!|R9BsHFR$J<h1IW*^Mo<T#{98&eEQAb`)PIHG_*jwNz)H+s<qWGO5i4t>wR^SUx(m0=v)Hv<uW35&NeAE|Y%TPnrhlv7"
    "?@N<3tAC~Rsv1b|bOz*af*#n0*R<nc&Lv9hz&}L5XJ<nBpun45CQFM)xF@k*r-"
    "OQjxwPYS^v?pC!`fM)Q?}c4UBqO~u^)QOx&!M@?hW%Vp^>fRCJCPnTX4jKP;Ng9DSS7HV%yMh_OwAql-83#Ov~i$j+2a-6w~Qka9Z~`-"
    "LV9|_C@-VJ;Atz+9_1~E_WXq_&W-!VX*<r<>KU~nH~4r0y)+FS2%uF?VT_8A-"
    "Ib6%?vHioGG;}pSr;7E5qe}O9EW5|mZQtxw6Ri`qzM*BuL7l}usCYpdaOL;9+6?gburg#6JGyS@SumbDC+)5`&|7m?^ulYxBE*>t<(u)xN(#l1"
    "m~Iq7Tl$OkF-vwA|a1ibQPgfSe11evFzv!t_D1(5tW|yYy5nF#wNrALZ*7n!E1~|N?j%zZNbaybR9giX4Rt0(&!2{%+wxZgfO#ympuYqJ%&6u0"
    "6tv=Z%yYNS%RK5WRWc~*Y>1jVk1sg<RmhC+om8?;oqDa>*Nl!rhk{M?+ACy22y~7>jpO@0|!(L&ey@c106RZUsD0Hz%w?B_>hd*;Rfq1u^s(Js"
    "E%`F=Ciae-(4#>JIe}p)UUOQCg5RUHmLS9>#Lqa!`LmB7GfxHc0zWgK2|R}z?CL=z6Zy3<_@2@*~jHo85$N5FSCAvHmyv{sqH#-"
    "u@1U;9|11rv=UCkCkFX3zZz1^OK2Idi7e)>%!Z5k;V_r~8q**w=aYD|lA8Rqrn&q!kWO%Lo9$=<b3UPeLY8|j2S8m!;oqIR7l?r{d|*V3j;H7w"
    "EM(L+=qIR}o~-"
    "2q5OH04`6ZD9c~m<#6c^|N0+`V;WB`l`@MvI%2AgXHg3MrwzCW=748axs0E;oi+~_2)OBb9*d4;8(mqP)sVV+=r7|&ZlZ=KFN`qcNR)p@9W9A-"
    "TgknJOO8W|(o(8Y~?YX!M|nH>X~lsvB;i2gX%4#eI;oCWkZV!C)<A**vF+#s^F>P%w5gPyW!<fzvX`eX9ya_ofEdw^sCH~WIlu1iA9*tS7pMY1"
    "M<F-"
    "qufKx>Y$11L_3rA1)`8Y4<Yol}n4M4#Z*DPElm$~^0urQj&sXlnC3?Tg(eTsL6u=x2$pE%&6~c?6&^kK>aP%Z&&16&A}UWdoOb(8F8^leFK0u<"
    "UEepUzV<(!ZhB^9a5RdQMP7K;RxcHA?izDBX*8HmGPUK8hu3K~_&7kf_D~bEZQ*T^HSF91D^)OPNi<FocsH*dhUSrqytWvw^JX7dbmg3|qL-"
    "3HRrz;G<dYyLYzp7W8@CBLqhb5j)OjlRzvTqn?Yy(uUC?%d~>sL)oQFj_R{5jQSzheHif0c*wi1!=2&b?%$X62Sn*P#H=8WC^<dq9rGbKkFGw}"
    "&I+u{c}fli`9SSgFrszjL~E)6^5)nZ5*@%MyMsE$$cxg$%n*)i?b@JZA8R}MlFu*5YH-Slh`JQWWC_A2iULChBU-@_oerX_2*Mn=6-"
    "YJwpT?~yJq(%e(JOLZPfH&Qbq>Tvb-"
    "*dlg|Jf1@<z{b>MBxr2?@_Jc+R>Z0<q`VxWH;dXTfYt*a6j98$xgl%MR&uNC(PqVN6EeBo<>+$a9h7ACgTWc0hDU9CL$9xYr18;`~n707G|l7+"
    "`y0AQ3j)7^8_z`zYK?wSkB{u&+1Qr~x`azKs@WE-"
    "(Ji5mDMvX?H~29qNpQD;#uK_fHB;oQ6u~(~eKUh|4k*9TOU90DUNsNnV{auN;2YKrrQFeb<|6UuH0<^c}R>X3ydCBG?d~>pA*nxrt1IGesWNoi"
    "KyaF73QnT9p@kE~9F(;tIm0(gCx}PJ7rD$kk;q<RJbxdLK{VPH%kJb@ezZo(O2jge%C7MsC*;@Q@GP#a}gHi30@32ZP@bvnzYP+py#gq%z{{s}"
    "qu!2Pr0I?OUsZzkEMn;^DlOTT~=ityL$dJ_xRH$`7-7N&4XaOqP#@&v-"
    "z(`V)~~j`hR1+}Gzz8TkY;l<%(S&!XJCq&G1etG66S>vv0?kf=Ic)*uv_(;~kRVMD{oInbC{1barFH#mGAnf+0{%0h#B=b<J>M-"
    "*sio!Nyo1ATQHK76SIK<UU|9`dByb;`E`K2k)M+A$wl4AQTtd}&%g1u;M|ABP%BW}THNzhAfG&=G}{KPMOSZK#$H<NZanF||~R6?|~!yo}NHtu"
    "mV*G)nsdDxt@fA3^XJ<q6UELH;}I_gDSG@F`myYNgfj?d{N7+TZuIMPu#PAkTioi;IZKV*ADYMo*+%IF)ZiJC9Cs%IETd`CJZkX84ElVnJA#6~"
    "C?DBvW2iZDPPF56CJAAJZ+)8qk0cUB6i{DgaSr3MGM#<F{W_ART}F+1=pEhqmf}N_g*p>WIFB2`RDWf_y!Nw`3pT(J0;(wm6T-"
    "kL%@wEdyzBylI)%nUk0k@0vmNb@Z=ayYF_hBJSfy-"
    "c$ZbUp+o0XV4748ZyT6{3v3HE{G+*4k1PR`I{maSPf2s)B*hfUp~)B{vE%;rXYl^@$=Y!5S_Qq{6l|Uz{G?K$Y^pIRe+lhXT-Lb2l&BDWOv-"
    "Va=}?;&-FBP#b9;_-urUVm+^Hp(H~9Vi$Bn?$G4EyFT5Ff{z{Z@&FHgH{@B%DY{0IUC-UnbZX&mq%ZKEK*gr(R_L`P|{tMOM|Njk{alXL"
)


class _Unicode:
    """llama.cpp's code point categories: range starts with their flags, whitespace set, regex classes."""

    def __init__(self) -> None:
        raw = zlib.decompress(base64.b85decode("".join(_UNICODE_FLAGS)))
        starts: list[int] = []
        flags: list[int] = []
        pos = cp = 0
        while pos < len(raw):
            delta = shift = 0
            while True:
                byte = raw[pos]
                pos += 1
                delta |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            cp += delta
            starts.append(cp)
            flags.append(_FLAG_CODES[raw[pos]])
            pos += 1
        self.starts, self.flags = starts, flags
        self.whitespace = frozenset(_UNICODE_WHITESPACE)
        self._view = _LazyTable(self._view_of)
        self._collapsed = _LazyTable(self._collapsed_of)
        self._wide = {cp: "\x0b" for cp in self.whitespace if cp >= 0x80}

    def category(self, cp: int) -> int:
        return self.flags[bisect.bisect_right(self.starts, cp) - 1]

    def ascii_class(self, mask: int) -> str:
        """The ASCII code points of the categories in ``mask`` as the body of a regex class."""
        return "".join(re.escape(chr(c)) for c in range(128) if self.category(c) & mask)

    def view(self, text: str) -> str:
        """The text for the custom splitters' regexes: ASCII kept, every other code point replaced by its class's
        stand-in (letter ``\\x80``, number ``\\x81``, mark ``\\x82``, whitespace ``\\x83``, other ``\\x84``)."""
        return text if text.isascii() else text.translate(self._view)

    def collapse(self, text: str) -> str:
        """llama.cpp's "collapsed" text for std::regex: ASCII kept, other code points replaced by their category's
        stand-in byte (whitespace by ``\\v``)."""
        return text if text.isascii() else text.translate(self._collapsed)

    def widen(self, text: str) -> str:
        """llama.cpp's text for std::wregex: non-ASCII whitespace replaced by ``\\v``."""
        return text if text.isascii() else text.translate(self._wide)

    def _view_of(self, cp: int) -> str:
        if cp < 0x80:
            return chr(cp)
        if cp in self.whitespace:
            return "\x83"
        return {_LETTER: "\x80", _NUMBER: "\x81", _ACCENT_MARK: "\x82"}.get(self.category(cp), "\x84")

    def _collapsed_of(self, cp: int) -> str:
        if cp < 0x80:
            return chr(cp)
        if cp in self.whitespace:
            return "\x0b"
        return {_NUMBER: "\xd1", _LETTER: "\xd2", _PUNCTUATION: "\xd3", _ACCENT_MARK: "\xd4",
                _SYMBOL: "\xd5"}.get(self.category(cp), "\xd0")


class _LazyTable(dict):
    """A ``str.translate`` table that computes a code point's replacement the first time it is seen."""

    def __init__(self, compute: Any) -> None:
        super().__init__()
        self._compute = compute

    def __missing__(self, cp: int) -> str:
        value = self[cp] = self._compute(cp)
        return value


_UNICODE: _Unicode | None = None


def _unicode() -> _Unicode:
    global _UNICODE
    if _UNICODE is None:
        _UNICODE = _Unicode()
    return _UNICODE


# --- pre-tokenizers (llm_tokenizer_bpe's regex lists, per pre-tokenizer type)

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
_PRE_REGEXES: dict[str, tuple[str, ...]] = {
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
_PRE_TYPES: dict[str, tuple[str, bool, bool, bool | None, bool]] = {}


def _pre(names: str, regexes: str, ignore_merges: bool = False, clean_spaces: bool = True,
         add_bos: bool | None = None, no_bos: bool = False) -> None:
    for name in names.split():
        _PRE_TYPES[name] = (regexes, ignore_merges, clean_spaces, add_bos, no_bos)


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
    """llama.cpp's hand-written splitters (unicode_regex_split_custom_*), as regexes over :meth:`_Unicode.view`."""
    u = _unicode()
    L, N, M = (u.ascii_class(_LETTER) + "\x80", u.ascii_class(_NUMBER) + "\x81",
               u.ascii_class(_ACCENT_MARK) + "\x82")
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


class _PreTokenizer:
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
                u = _unicode()
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


def _byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of each byte (unicode_byte_to_utf8_map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = [""] * 256
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_ALPHABET = _byte_alphabet()
_BYTE_TRANSLATION = {i: ch for i, ch in enumerate(_BYTE_ALPHABET)}


def byte_decoder() -> dict[str, int]:
    """GPT-2's printable spelling of bytes, reversed: character -> byte."""
    return {ch: b for b, ch in enumerate(_BYTE_ALPHABET)}


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
        decode = byte_decoder()
        for text, kind in zip(tokens, types.tolist(), strict=False):
            if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED) or not all(ch in decode for ch in text):
                out.append(text.encode("utf-8", errors="surrogateescape"))
            else:
                out.append(bytes(decode[ch] for ch in text))
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
        texts = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(self.tokens)]
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(texts)}  # the last of equal texts wins
        self._merges = metadata.get("tokenizer.ggml.merges")
        self._ranks: dict[tuple[str, str], int] | None = None

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
            self.exact = self.pre in _PRE_TYPES  # unknown to us: GPT-2's rules
            regexes, self.ignore_merges, self.clean_spaces, pre_bos, no_bos = _PRE_TYPES.get(
                self.pre, ("gpt2", False, True, None, False))
            add_bos = bool(pre_bos)
            if no_bos:
                bos_default = None
            self._pre_tokenizer = _PreTokenizer(_PRE_REGEXES[regexes])
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
        self._cache: dict[str, list[int]] = {}
        self._spm_split: re.Pattern[str] | None = None

    # --- pieces

    def _piece(self, text: str, attr: int) -> bytes:
        """llama.cpp's token_to_piece with ``special`` on (its cache)."""
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            return text.encode("utf-8", "surrogatepass")
        if attr & ATTR_NORMAL:
            if self.model == "llama":
                return text.replace("\u2581", " ").encode("utf-8", "surrogatepass")
            decode = _BYTE_DECODE
            if all(ch in decode for ch in text):
                return bytes(decode[ch] for ch in text)
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
                    out += self._spm(frag.replace(" ", "\u2581"))
                    prev_special = False
            return out
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
            else:
                out += self._bpe(frag)
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

    # --- byte-level BPE (llm_tokenizer_bpe_session)

    def _bpe(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._cache
        if len(cache) > 200_000:
            cache.clear()
        for word in self._pre_tokenizer.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = cache[word] = self._bpe_word(
                    word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_TRANSLATION))
            out += ids
        return out

    def _bpe_word(self, word: str) -> list[int]:
        vocab = self.token_to_id
        if self.ignore_merges and word in vocab:
            return [vocab[word]]
        syms = list(word)
        if len(syms) > 1:
            ranks = self._ranks if self._ranks is not None else self._load_ranks()
            n = len(syms)
            nxt = [*range(1, n), -1]
            prv = list(range(-1, n - 1))
            heap = []
            for i in range(n - 1):
                r = ranks.get((syms[i], syms[i + 1]))
                if r is not None:
                    heap.append((r, i, i + 1, syms[i] + syms[i + 1]))
            heapq.heapify(heap)
            while heap:
                _, left, right, merged = heapq.heappop(heap)
                a, b = syms[left], syms[right]
                if not a or not b or a + b != merged:
                    continue
                syms[left], syms[right] = merged, ""
                after = nxt[right]
                nxt[left] = after
                if after >= 0:
                    prv[after] = left
                before = prv[left]
                if before >= 0:
                    r = ranks.get((syms[before], merged))
                    if r is not None:
                        heapq.heappush(heap, (r, before, left, syms[before] + merged))
                if after >= 0:
                    r = ranks.get((merged, syms[after]))
                    if r is not None:
                        heapq.heappush(heap, (r, left, after, merged + syms[after]))
        out = []
        for sym in syms:
            if not sym:
                continue
            tid = vocab.get(sym)
            if tid is not None:
                out.append(tid)
                continue
            for byte in sym.encode("utf-8"):  # llama.cpp looks each byte up as a one-byte text
                tid = vocab.get(chr(byte)) if byte < 0x80 else None
                if tid is not None:
                    out.append(tid)
        return out

    def _load_ranks(self) -> dict[tuple[str, str], int]:
        ranks: dict[tuple[str, str], int] = {}
        for i, merge in enumerate(self._merges if self._merges is not None else ()):
            at = merge.find(" ", 1)
            pair = (merge[:at], merge[at + 1:]) if at != -1 else ("", "")
            ranks.setdefault(pair, i)
        self._ranks = ranks
        return ranks

    # --- SentencePiece (llm_tokenizer_spm_session)

    def _spm(self, text: str) -> list[int]:
        splitter = self._spm_split if self._spm_split is not None else self._spm_splitter()
        out: list[int] = []
        cache = self._cache
        if len(cache) > 200_000:
            cache.clear()
        for chunk in splitter.split(text):
            ids = cache.get(chunk)
            if ids is None:
                ids = cache[chunk] = self._spm_chunk(chunk)
            out += ids
        return out

    def _spm_splitter(self) -> re.Pattern[str]:
        """Where the text can be cut with no merge across the cut: before a ``▁`` whose previous character never
        precedes a ``▁`` inside a token (so the pieces can be tokenized apart and remembered)."""
        before = {t[i - 1] for t in self.token_to_id for i in range(1, len(t)) if t[i] == "\u2581"}
        before.add("\u2581")
        self._spm_split = re.compile("(?<=[^" + "".join(re.escape(c) for c in sorted(before)) + "])(?=\u2581)")
        return self._spm_split

    def _spm_chunk(self, text: str) -> list[int]:
        vocab, scores = self.token_to_id, self.scores
        syms = list(text)
        n = len(syms)
        nxt = [*range(1, n), -1]
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(n - 1):
            tid = vocab.get(syms[i] + syms[i + 1])
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, 2))
        heapq.heapify(heap)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or len(a) + len(b) != size:
                continue
            merged = syms[left] = a + b
            syms[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            before = prv[left]
            if before >= 0:
                tid = vocab.get(syms[before] + merged)
                if tid is not None:
                    heapq.heappush(heap, (-scores[tid], before, left, len(syms[before]) + size))
            if after >= 0:
                tid = vocab.get(merged + syms[after])
                if tid is not None:
                    heapq.heappush(heap, (-scores[tid], left, after, size + len(syms[after])))
        out: list[int] = []
        i = 0
        while i != -1:
            sym = syms[i]
            tid = vocab.get(sym)
            if tid is not None:
                out.append(tid)
            else:
                for byte in sym.encode("utf-8", "surrogatepass"):  # byte fallback
                    tid = vocab.get(f"<0x{byte:02X}>")
                    if tid is None:
                        tid = vocab.get(chr(byte)) if byte < 0x80 else self.unk
                    if tid is not None:
                        out.append(tid)
            i = nxt[i]
        return out


_BYTE_DECODE = byte_decoder()


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
