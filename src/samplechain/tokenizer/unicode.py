"""llama.cpp's Unicode classes (src/unicode-data.cpp; regenerate with tests/fixtures/tokenizer/gen_unicode_flags.py):
each code point's category, the whitespace set, and the stand-in texts the pre-tokenizers' regexes run over."""

from __future__ import annotations

import base64
import bisect
import re
import zlib
from typing import Any

_FLAG_CODES = (0x0000, 0x0001, 0x0002, 0x0004, 0x0008, 0x0010, 0x0020, 0x0040, 0x0080)
NUMBER, LETTER, _PUNCTUATION, ACCENT_MARK, _SYMBOL = 0x0002, 0x0004, 0x0020, 0x0010, 0x0040
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
        return {LETTER: "\x80", NUMBER: "\x81", ACCENT_MARK: "\x82"}.get(self.category(cp), "\x84")

    def _collapsed_of(self, cp: int) -> str:
        if cp < 0x80:
            return chr(cp)
        if cp in self.whitespace:
            return "\x0b"
        return {NUMBER: "\xd1", LETTER: "\xd2", _PUNCTUATION: "\xd3", ACCENT_MARK: "\xd4",
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


def unicode() -> _Unicode:
    """llama.cpp's Unicode classes, built on first use."""
    global _UNICODE
    if _UNICODE is None:
        _UNICODE = _Unicode()
    return _UNICODE
