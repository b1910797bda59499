"""GBNF text -> llama.cpp's flat rule tables (``llama_grammar_parser``, src/llama-grammar.cpp), with every hazard
turned into a GrammarError."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# element types, with llama.cpp's numeric codes (enum llama_gretype, src/llama-grammar.h)
END, ALT, RULE_REF, CHAR, CHAR_NOT, CHAR_RNG_UPPER, CHAR_ALT, CHAR_ANY, TOKEN, TOKEN_NOT = range(10)
TYPE_NAMES = ("END", "ALT", "RULE_REF", "CHAR", "CHAR_NOT", "CHAR_RNG_UPPER", "CHAR_ALT", "CHAR_ANY", "TOKEN",
              "TOKEN_NOT")
MAX_REPETITION = 2000  # llama.cpp's MAX_REPETITION_THRESHOLD
MAX_NESTING = 200  # parenthesis depth; deeper input is refused instead of exhausting the Python stack
MAX_TOKEN_ID = 2**32 - 1

Element = tuple[int, int]


class GrammarError(ValueError):
    """A grammar (or schema) that cannot be used; ``line``/``column`` (1-based) locate parse errors."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        self.message = message
        self.line = line
        self.column = column
        where = f" at line {line}, column {column}" if line is not None else ""
        super().__init__(message + where)


@dataclass
class ParsedGrammar:
    """The parser's output: ``rules[i]`` is the element list of symbol ``i`` (ends with END)."""

    rules: list[list[Element]]
    symbol_ids: dict[str, int]

    def name_of(self, rule_id: int) -> str:
        for name, i in self.symbol_ids.items():
            if i == rule_id:
                return name
        return f"#{rule_id}"


def _is_word_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


class _Parser:
    def __init__(self, text: str, tokenize: Callable[[str], list[int]] | None) -> None:
        nul = text.find("\0")  # the C parser reads a NUL-terminated string
        self.src = text if nul < 0 else text[:nul]
        self.n = len(self.src)
        self.tokenize = tokenize
        self.symbol_ids: dict[str, int] = {}
        self.rules: list[list[Element] | None] = []
        self.depth = 0

    # --- errors and characters --------------------------------------------------------------------------

    def error(self, message: str, pos: int) -> GrammarError:
        line = self.src.count("\n", 0, pos) + 1
        column = pos - (self.src.rfind("\n", 0, pos) + 1) + 1
        return GrammarError(message, line, column)

    def at(self, pos: int) -> str:
        return self.src[pos] if pos < self.n else ""

    def space(self, pos: int, newline_ok: bool) -> int:
        src, n = self.src, self.n
        while pos < n:
            c = src[pos]
            if c == "#":
                while pos < n and src[pos] not in "\r\n":
                    pos += 1
            elif c in " \t" or (newline_ok and c in "\r\n"):
                pos += 1
            else:
                break
        return pos

    def name_end(self, pos: int) -> int:
        end = pos
        while end < self.n and _is_word_char(self.src[end]):
            end += 1
        if end == pos:
            raise self.error("expecting name", pos)
        return end

    def int_end(self, pos: int) -> int:
        end = pos
        while end < self.n and self.src[end].isascii() and self.src[end].isdigit():
            end += 1
        return end

    def char(self, pos: int) -> tuple[int, int]:
        """One (possibly escaped) code point at ``pos``; returns (code point, next position)."""
        c = self.at(pos)
        if c == "\\":
            e = self.at(pos + 1)
            if e in ("x", "u", "U"):
                width = {"x": 2, "u": 4, "U": 8}[e]
                digits = self.src[pos + 2 : pos + 2 + width]
                if len(digits) < width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                    raise self.error(f"expecting {width} hex chars", pos)
                return int(digits, 16), pos + 2 + width
            simple = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}
            if e in simple:
                return simple[e], pos + 2
            if e == "":
                raise self.error("unexpected end of input", pos)
            raise self.error(f"unknown escape '\\{e}'", pos)
        if c == "":
            raise self.error("unexpected end of input", pos)
        return ord(c), pos + 1

    # --- symbols ------------------------------------------------------------------------------------------

    def symbol(self, name: str) -> int:
        return self.symbol_ids.setdefault(name, len(self.symbol_ids))

    def generate_symbol(self, base: str) -> int:
        i = len(self.symbol_ids)
        self.symbol_ids[f"{base}_{i}"] = i
        return i

    def add_rule(self, rule_id: int, elements: list[Element]) -> None:
        while len(self.rules) <= rule_id:
            self.rules.append(None)
        self.rules[rule_id] = elements

    # --- grammar structure -------------------------------------------------------------------------------

    def parse(self) -> ParsedGrammar:
        pos = self.space(0, True)
        while pos < self.n:
            pos = self.rule(pos)
        rules: list[list[Element]] = []
        for i, rule in enumerate(self.rules):
            if not rule:
                raise GrammarError(f"Undefined rule identifier '{self._name(i)}'")
            rules.append(rule)
        for name, i in self.symbol_ids.items():
            if i >= len(rules):
                raise GrammarError(f"Undefined rule identifier '{name}'")
        return ParsedGrammar(rules, dict(self.symbol_ids))

    def _name(self, rule_id: int) -> str:
        return next((k for k, v in self.symbol_ids.items() if v == rule_id), f"#{rule_id}")

    def rule(self, pos: int) -> int:
        end = self.name_end(pos)
        name = self.src[pos:end]
        rule_id = self.symbol(name)
        pos = self.space(end, False)
        if self.src[pos : pos + 3] != "::=":
            raise self.error("expecting ::=", pos)
        pos = self.space(pos + 3, True)
        pos = self.alternates(pos, name, rule_id, False)
        c = self.at(pos)
        if c == "\r":
            pos += 2 if self.at(pos + 1) == "\n" else 1
        elif c == "\n":
            pos += 1
        elif c:
            raise self.error("expecting newline or end", pos)
        return self.space(pos, True)

    def alternates(self, pos: int, name: str, rule_id: int, nested: bool) -> int:
        elements: list[Element] = []
        pos = self.sequence(pos, name, elements, nested)
        while self.at(pos) == "|":
            elements.append((ALT, 0))
            pos = self.space(pos + 1, True)
            pos = self.sequence(pos, name, elements, nested)
        elements.append((END, 0))
        self.add_rule(rule_id, elements)
        return pos

    def sequence(self, pos: int, name: str, out: list[Element], nested: bool) -> int:
        last_start = len(out)  # where the last item's elements begin
        weight = 1  # symbols the last item stands for (llama.cpp's guard on nested repetitions)
        while pos < self.n:
            c = self.src[pos]
            if c == '"':
                pos += 1
                last_start, weight = len(out), 1
                while self.at(pos) != '"':
                    if pos >= self.n:
                        raise self.error("unexpected end of input", pos)
                    cp, pos = self.char(pos)
                    out.append((CHAR, cp))
                pos = self.space(pos + 1, nested)
            elif c == "[":
                pos += 1
                start_type = CHAR
                if self.at(pos) == "^":
                    pos += 1
                    start_type = CHAR_NOT
                last_start, weight = len(out), 1
                while self.at(pos) != "]":
                    if pos >= self.n:
                        raise self.error("unexpected end of input", pos)
                    cp, pos = self.char(pos)
                    out.append((CHAR_ALT if last_start < len(out) else start_type, cp))
                    if self.at(pos) == "-" and self.at(pos + 1) != "]":
                        if pos + 1 >= self.n:
                            raise self.error("unexpected end of input", pos + 1)
                        cp, pos = self.char(pos + 1)
                        out.append((CHAR_RNG_UPPER, cp))
                pos = self.space(pos + 1, nested)
            elif _is_word_char(c):
                end = self.name_end(pos)
                ref = self.symbol(self.src[pos:end])
                pos = self.space(end, nested)
                last_start, weight = len(out), 1
                out.append((RULE_REF, ref))
            elif c == "(":
                self.depth += 1
                if self.depth > MAX_NESTING:
                    raise self.error(f"groups nested deeper than {MAX_NESTING}", pos)
                pos = self.space(pos + 1, True)
                n_before = len(self.symbol_ids)
                sub = self.generate_symbol(name)
                pos = self.alternates(pos, name, sub, True)
                weight = max(1, len(self.symbol_ids) - n_before)
                last_start = len(out)
                out.append((RULE_REF, sub))
                if self.at(pos) != ")":
                    raise self.error("expecting ')'", pos)
                self.depth -= 1
                pos = self.space(pos + 1, nested)
            elif c == ".":
                last_start, weight = len(out), 1
                out.append((CHAR_ANY, 0))
                pos = self.space(pos + 1, nested)
            elif c in "<!":
                last_start, weight = len(out), 1
                pos = self.token(pos, out)
                pos = self.space(pos, nested)
            elif c in "*+?":
                lo, hi = {"*": (0, -1), "+": (1, -1), "?": (0, 1)}[c]
                weight = self.repeat(pos, name, out, last_start, weight, lo, hi, c)
                pos = self.space(pos + 1, nested)
            elif c == "{":
                at = pos
                pos = self.space(pos + 1, nested)
                end = self.int_end(pos)
                if end == pos:
                    raise self.error("expecting an int", pos)
                lo, hi = int(self.src[pos:end]), -1
                pos = self.space(end, nested)
                if self.at(pos) == "}":
                    hi = lo
                    pos = self.space(pos + 1, nested)
                elif self.at(pos) == ",":
                    pos = self.space(pos + 1, nested)
                    end = self.int_end(pos)
                    if end > pos:
                        hi = int(self.src[pos:end])
                        pos = self.space(end, nested)
                    if self.at(pos) != "}":
                        raise self.error("expecting '}'", pos)
                    pos = self.space(pos + 1, nested)
                else:
                    raise self.error("expecting ','", pos)
                if lo > MAX_REPETITION:
                    raise self.error(f"number of repetitions exceeds sane defaults ({lo} > {MAX_REPETITION})", at)
                if hi > MAX_REPETITION:
                    hi = -1  # llama.cpp: an upper bound above the limit means unbounded
                if 0 <= hi < lo:
                    raise self.error(f"repetition {{{lo},{hi}}} has a maximum below its minimum", at)
                weight = self.repeat(at, name, out, last_start, weight, lo, hi, "{")
            else:
                break
        return pos

    def token(self, pos: int, out: list[Element]) -> int:
        negated = self.at(pos) == "!"
        if negated:
            pos += 1
            if self.at(pos) != "<":
                raise self.error("expecting '<'", pos)
        kind = TOKEN_NOT if negated else TOKEN
        if self.at(pos + 1) == "[":
            start = pos + 2
            end = self.int_end(start)
            if end == start:
                raise self.error("expecting an int", start)
            token_id = int(self.src[start:end])
            if token_id > MAX_TOKEN_ID:
                raise self.error("parsed token id is too big", start)
            if self.at(end) != "]":
                raise self.error("expecting ']'", end)
            if self.at(end + 1) != ">":
                raise self.error("expecting '>'", end + 1)
            out.append((kind, token_id))
            return end + 2
        close = self.src.find(">", pos)
        if close < 0:
            raise self.error("expecting '>'", pos)
        text = self.src[pos : close + 1]
        if self.tokenize is None:
            raise self.error("no vocab to parse token", pos)
        try:
            ids = self.tokenize(text)
        except ValueError:
            ids = []
        if len(ids) != 1:
            raise self.error(f"invalid token '{text}'", pos)
        out.append((kind, ids[0]))
        return close + 1

    def repeat(self, pos: int, name: str, out: list[Element], last_start: int, weight: int, lo: int, hi: int,
               what: str) -> int:
        """Lower ``S{lo,hi}`` (hi -1: unbounded) for the item ``out[last_start:]``, as llama.cpp's
        ``handle_repetitions`` does."""
        if last_start == len(out):
            raise self.error(f"expecting preceding item to {what}", pos)
        times = hi if hi > 0 else (lo if lo > 0 else 1)
        if weight * times > MAX_REPETITION:
            raise self.error("number of rules that are going to be repeated multiplied by the new repetition "
                             f"exceeds sane defaults ({weight} x {times} > {MAX_REPETITION})", pos)
        item = out[last_start:]
        if lo == 0:
            del out[last_start:]
        else:
            out.extend(item * (lo - 1))
        n_opt = 1 if hi < 0 else hi - lo
        last_rec = 0
        for i in range(n_opt):
            rec = self.generate_symbol(name)
            body = list(item)
            if i > 0 or hi < 0:
                body.append((RULE_REF, rec if hi < 0 else last_rec))
            body += [(ALT, 0), (END, 0)]
            self.add_rule(rec, body)
            last_rec = rec
        if n_opt > 0:
            out.append((RULE_REF, last_rec))
        return weight * times


def parse_gbnf(text: str, tokenize: Callable[[str], list[int]] | None = None) -> ParsedGrammar:
    """Parse GBNF ``text``; ``tokenize`` resolves ``<text>`` token items (None: they are errors)."""
    if not isinstance(text, str):
        raise GrammarError(f"grammar must be a str, got {type(text).__name__}")
    return _Parser(text, tokenize).parse()
