"""Integer ranges (``minimum`` / ``maximum``) as digit-wise GBNF in the shape of llama.cpp's ``build_min_max_int``
(common/json-schema-to-grammar.cpp), with one of its bugs fixed (see ``_IntRange``)."""

from __future__ import annotations


class _IntRange:
    """Digit-wise GBNF for canonical integers in [lo, hi], llama.cpp's shape.

    Fixed: a minimum whose remaining digits start with 0 (e.g. 1005) keeps those zeros (llama.cpp drops them,
    so its grammar for minimum 1005 also accepts 100, 1000 and 1004), and below the
    top level a remaining minimum that starts with 1 still admits longer numbers starting with 0.
    """

    def __init__(self) -> None:
        self.out: list[str] = []

    def digit_range(self, a: str, b: str) -> None:
        self.out.append(f"[{a}]" if a == b else f"[{a}-{b}]")

    def more_digits(self, lo: int, hi: int | None) -> None:
        self.out.append("[0-9]")
        if lo == hi == 1:
            return
        self.out.append(f"{{{lo}")
        if hi != lo:
            self.out.append(",")
            if hi is not None:
                self.out.append(str(hi))
        self.out.append("}")

    def uniform(self, a: str, b: str) -> None:
        out = self.out
        i = 0
        while i < len(a) and a[i] == b[i]:
            i += 1
        if i > 0:
            out.append(f'"{a[:i]}"')
        if i >= len(a):
            return
        if i > 0:
            out.append(" ")
        k = len(a) - i - 1
        if k == 0:
            out.append(f"[{a[i]}-{b[i]}]")
            return
        a_rest, b_rest = a[i + 1 :], b[i + 1 :]
        zeros, nines = "0" * k, "9" * k
        reached = False
        out.append("(")
        if a_rest == zeros:
            self.digit_range(a[i], chr(ord(b[i]) - 1))
            out.append(" ")
            self.more_digits(k, k)
        else:
            out.append(f"[{a[i]}] (")
            self.uniform(a_rest, nines)
            out.append(")")
            if ord(a[i]) < ord(b[i]) - 1:
                out.append(" | ")
                if b_rest == nines:
                    self.digit_range(chr(ord(a[i]) + 1), b[i])
                    reached = True
                else:
                    self.digit_range(chr(ord(a[i]) + 1), chr(ord(b[i]) - 1))
                out.append(" ")
                self.more_digits(k, k)
        if not reached:
            out.append(" | ")
            self.digit_range(b[i], b[i])
            out.append(" ")
            self.uniform(zeros, b_rest)
        out.append(")")

    def both(self, lo: int, hi: int) -> None:
        out = self.out
        if lo < 0 and hi < 0:
            out.append('"-" (')
            self.both(-hi, -lo)
            out.append(")")
            return
        if lo < 0:
            out.append('"-" (')
            self.both(0, -lo)
            out.append(") | ")
            lo = 0
        lo_s, hi_s = str(lo), str(hi)
        for digits in range(len(lo_s), len(hi_s)):
            self.uniform(lo_s, "9" * digits)
            lo_s = "1" + "0" * digits
            out.append(" | ")
        self.uniform(lo_s, hi_s)

    def minimum(self, digits: str, decimals_left: int, top_level: bool) -> None:
        """Numbers >= ``digits``; below the top level, ``digits`` is the rest after a fixed first digit and
        may start with zeros: a rest of the same length must be >= it, a longer one is always larger."""
        out = self.out
        less = max(decimals_left - 1, 1)
        if digits.startswith("-"):
            out.append('"-" (')
            self.maximum(int(digits[1:]), decimals_left, top_level=False)
            out.append(") | [0] | [1-9] ")
            self.more_digits(0, decimals_left - 1)
            return
        if int(digits) == 0:
            if top_level:
                out.append("[0] | [1-9] ")
                self.more_digits(0, less)
            else:
                self.more_digits(len(digits), decimals_left)
            return
        start = "1" if top_level else "0"
        c = digits[0]
        if len(digits) == 1:
            if c > start:
                self.digit_range(start, chr(ord(c) - 1))
                out.append(" ")
                self.more_digits(1, less)
                out.append(" | ")
            self.digit_range(c, "9")
            out.append(" ")
            self.more_digits(0, less)
            return
        if c > start:
            self.digit_range(start, chr(ord(c) - 1))
            out.append(" ")
            self.more_digits(len(digits), less)
            out.append(" | ")
        self.digit_range(c, c)
        out.append(" (")
        self.minimum(digits[1:], less, top_level=False)
        out.append(")")
        if c < "9":
            out.append(" | ")
            self.digit_range(chr(ord(c) + 1), "9")
            out.append(" ")
            self.more_digits(len(digits) - 1, less)

    def maximum(self, hi: int, decimals_left: int, top_level: bool) -> None:
        out = self.out
        if hi >= 0:
            if top_level:
                out.append('"-" [1-9] ')
                self.more_digits(0, max(decimals_left - 1, 1))
                out.append(" | ")
            self.both(0, hi)
        else:
            out.append('"-" (')
            self.minimum(str(-hi), decimals_left, top_level=False)
            out.append(")")


def integer_range(lo: int | None, hi: int | None) -> str:
    """A GBNF expression for the canonical decimal integers in ``[lo, hi]`` (llama.cpp's ``build_min_max_int``);
    either bound may be None (open), not both."""
    r = _IntRange()
    if lo is not None and hi is not None:
        r.both(lo, hi)
    elif lo is not None:
        r.minimum(str(lo), 16, top_level=True)
    else:
        r.maximum(hi, 16, top_level=True)
    return "".join(r.out)
