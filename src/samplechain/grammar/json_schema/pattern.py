"""``pattern`` regular expressions -> GBNF (llama.cpp's ``_visit_pattern``); what it cannot express raises
``UnsupportedPattern``, which the converter turns into a warning and a plain string (as llama.cpp)."""

from __future__ import annotations

from typing import Protocol

from samplechain.grammar.json_schema.rules import UnsupportedPattern, repetition
from samplechain.grammar.parser import GrammarError

DOT = "[^\\x0A\\x0D]"
DOT_ALL = "[\\U00000000-\\U0010FFFF]"
_NON_LITERAL = set("|.()[]{}*+?")
_REGEX_ONLY_ESCAPES = set("^$.[]()|{}*+?")
_GBNF_ESCAPES = set('trn\\"[]-')
MAX_PATTERN_NESTING = 100


class _Rules(Protocol):
    """What the translator uses of the converter: its dot mode and its rule table (``_Converter`` fits)."""

    dotall: bool

    def add_rule(self, name: str, body: str) -> str: ...


class PatternTranslator:
    """A regular expression (between its anchors) -> a GBNF expression."""

    def __init__(self, conv: _Rules, pattern: str, rule_name: str) -> None:
        self.conv = conv
        self.p = pattern
        self.i = 0
        self.name = rule_name
        self.sub_rules: dict[str, str] = {}

    def translate(self) -> str:
        text, is_lit = self.sequence(0)
        if self.i < len(self.p):  # a ')' closed a group that was never opened
            raise GrammarError(f"JSON schema conversion failed: unbalanced parentheses in pattern /{self.p}/")
        return f'"{text}"' if is_lit else text

    def dot(self) -> str:
        return self.conv.add_rule("dot", DOT_ALL if self.conv.dotall else DOT)

    def sequence(self, depth: int) -> tuple[str, bool]:
        if depth > MAX_PATTERN_NESTING:
            raise UnsupportedPattern(f"groups nested deeper than {MAX_PATTERN_NESTING}")
        p, n = self.p, len(self.p)
        seq: list[tuple[str, bool]] = []
        while self.i < n:
            c = p[self.i]
            if c == ".":
                seq.append((self.dot(), False))
                self.i += 1
            elif c == "(":
                self.i += 1
                if p.startswith("?", self.i):
                    if not p.startswith("?:", self.i):
                        raise UnsupportedPattern("lookaround, named groups and flags")
                    self.i += 2
                inner = self.sequence(depth + 1)
                if self.i >= n or p[self.i] != ")":
                    raise GrammarError(f"JSON schema conversion failed: unbalanced parentheses in pattern /{p}/")
                self.i += 1
                seq.append((f"({_to_rule(inner)})", False))
            elif c == ")":
                if depth == 0:
                    raise GrammarError(f"JSON schema conversion failed: unbalanced parentheses in pattern /{p}/")
                return _join(seq)
            elif c == "[":
                seq.append((self.char_class(), False))
            elif c == "|":
                seq.append(("|", False))
                self.i += 1
            elif c in "*+?":
                self.need_operand(seq, c)
                seq[-1] = (_to_rule(seq[-1]) + c, False)
                self.i += 1
            elif c == "{":
                self.need_operand(seq, c)
                seq[-1] = (self.braces(seq[-1]), False)
            elif c in "]}":
                raise UnsupportedPattern(f"stray '{c}'")
            elif c in "^$":
                raise UnsupportedPattern(f"'{c}' inside the pattern")
            else:
                seq.append((self.literal(), True))
        return _join(seq)

    def need_operand(self, seq: list[tuple[str, bool]], c: str) -> None:
        if not seq or seq[-1] == ("|", False):
            raise GrammarError(f"JSON schema conversion failed: quantifier '{c}' with nothing before it in "
                               f"pattern /{self.p}/")

    def hex_escape(self) -> str:
        """``\\xHH``, ``\\uHHHH`` or ``\\UHHHHHHHH`` at the cursor, kept as written (GBNF reads them too)."""
        e = self.p[self.i + 1]
        width = {"x": 2, "u": 4, "U": 8}[e]
        digits = self.p[self.i + 2 : self.i + 2 + width]
        if len(digits) < width or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise UnsupportedPattern(f"escape \\{e} without {width} hex digits")
        self.i += 2 + width
        return "\\" + e + digits

    def char_class(self) -> str:
        p, n = self.p, len(self.p)
        out = "["
        self.i += 1
        while self.i < n and p[self.i] != "]":
            if p[self.i] == "\\":
                if self.i + 1 >= n:
                    break
                e = p[self.i + 1]
                if e in "xuU":
                    out += self.hex_escape()
                    continue
                if e not in _GBNF_ESCAPES:
                    raise UnsupportedPattern(f"escape \\{e} inside a character class")
                out += p[self.i : self.i + 2]
                self.i += 2
            else:
                out += p[self.i]
                self.i += 1
        if self.i >= n:
            raise GrammarError(f"JSON schema conversion failed: unterminated '[' in pattern /{p}/")
        self.i += 1
        return out + "]"

    def braces(self, last: tuple[str, bool]) -> str:
        p = self.p
        end = p.find("}", self.i)
        if end < 0:
            raise UnsupportedPattern("unterminated '{'")
        nums = [s.strip() for s in p[self.i + 1 : end].split(",")]
        self.i = end + 1
        if len(nums) > 2 or not all(s.isdigit() or (s == "" and k > 0) or (s == "" and len(nums) == 2)
                                    for k, s in enumerate(nums)):
            raise UnsupportedPattern(f"quantifier {{{','.join(nums)}}}")
        if len(nums) == 1:
            lo = hi = int(nums[0])
        else:
            lo = int(nums[0]) if nums[0] else 0
            hi = int(nums[1]) if nums[1] else None
        if hi is not None and hi < lo:
            raise GrammarError(f"JSON schema conversion failed: quantifier {{{lo},{hi}}} in pattern /{p}/")
        sub, is_lit = last
        if not is_lit:
            rule = self.sub_rules.get(sub)
            if rule is None:
                rule = self.conv.add_rule(f"{self.name}-{len(self.sub_rules) + 1}", sub)
                self.sub_rules[sub] = rule
            sub = rule
        return repetition(f'"{sub}"' if is_lit else sub, lo, hi)

    def literal(self) -> str:
        p, n = self.p, len(self.p)
        out = ""
        while self.i < n:
            c = p[self.i]
            if c == "\\":
                if self.i + 1 >= n:
                    raise GrammarError(f"JSON schema conversion failed: trailing backslash in pattern /{p}/")
                e = p[self.i + 1]
                if e in _REGEX_ONLY_ESCAPES:
                    out += e
                    self.i += 2
                elif e in _GBNF_ESCAPES:
                    out += p[self.i : self.i + 2]
                    self.i += 2
                elif e in "xuU":
                    out += self.hex_escape()
                else:
                    raise UnsupportedPattern(f"escape \\{e}")
            elif c == '"':
                out += '\\"'
                self.i += 1
            elif c not in _NON_LITERAL and c not in "^$" and (
                self.i == n - 1 or out == "" or p[self.i + 1] == "." or p[self.i + 1] not in _NON_LITERAL
            ):
                out += c
                self.i += 1
            else:
                break
        if not out:
            raise UnsupportedPattern(f"'{p[self.i]}'")
        return out


def _to_rule(item: tuple[str, bool]) -> str:
    text, is_lit = item
    return f'"{text}"' if is_lit else text


def _join(seq: list[tuple[str, bool]]) -> tuple[str, bool]:
    """Merge adjacent literals; a single literal stays a literal."""
    merged: list[tuple[str, bool]] = []
    for text, is_lit in seq:
        if is_lit and merged and merged[-1][1]:
            merged[-1] = (merged[-1][0] + text, True)
        else:
            merged.append((text, is_lit))
    if len(merged) == 1 and merged[0][1]:
        return merged[0]
    return " ".join(_to_rule(x) for x in merged), False
