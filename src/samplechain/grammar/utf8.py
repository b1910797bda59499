"""llama.cpp's UTF-8 decoding with a partial sequence carried across tokens (``decode_utf8`` in
src/llama-grammar.cpp)."""

from __future__ import annotations

Partial = tuple[int, int]  # (value so far, continuation bytes still missing); n_remain -1: invalid
NO_PARTIAL: Partial = (0, 0)
INVALID: Partial = (0, -1)
_LENGTH = (1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4)  # sequence length by the lead byte's high nibble


def decode(piece: bytes, partial: Partial = NO_PARTIAL) -> tuple[list[int], Partial]:
    """Code points completed by ``piece`` (continuing ``partial``) and the new partial state.

    As llama.cpp: a NUL byte ends the piece; a bad continuation of a carried sequence or a stray continuation
    byte as a lead makes the whole piece invalid (no code points, state ``INVALID``); continuation bytes of a
    sequence started inside the piece are not checked.
    """
    nul = piece.find(0)
    if nul >= 0:
        piece = piece[:nul]
    if partial[1] <= 0:
        try:  # valid UTF-8 decodes identically, and fast
            return [ord(c) for c in piece.decode("utf-8")], NO_PARTIAL
        except UnicodeDecodeError:
            pass
    value, n_remain = partial
    cps: list[int] = []
    pos, n = 0, len(piece)
    while pos < n and n_remain > 0:
        b = piece[pos]
        if b >> 6 != 2:
            return [], INVALID
        value = (value << 6) + (b & 0x3F)
        pos += 1
        n_remain -= 1
    if partial[1] > 0 and n_remain == 0:
        cps.append(value)
    while pos < n:
        first = piece[pos]
        n_remain = _LENGTH[first >> 4] - 1
        if n_remain < 0:
            return [], INVALID
        value = first & ((1 << (7 - n_remain)) - 1)
        pos += 1
        while pos < n and n_remain > 0:
            value = (value << 6) + (piece[pos] & 0x3F)
            pos += 1
            n_remain -= 1
        if n_remain == 0:
            cps.append(value)
    return cps, (value, n_remain) if n_remain > 0 else NO_PARTIAL


def partial_range(partial: Partial) -> tuple[int, int] | None:
    """The code points a pending partial sequence can still complete to; None when it can complete to none."""
    value, n_remain = partial
    if n_remain < 0 or (n_remain == 1 and value < 2):  # invalid, or an overlong 2-byte form
        return None
    low = value << (6 * n_remain)
    high = low | ((1 << (6 * n_remain)) - 1)
    if low == 0:
        low = {2: 1 << 11, 3: 1 << 16}.get(n_remain, low)
    return low, high
