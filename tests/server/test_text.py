"""Stop strings, UTF-8 pieces and the reasoning splitter (llama-server's process_token and
find_stopping_strings, tools/server/server-context.cpp)."""

import pytest

from samplechain.chat.reasoning import ReasoningSplitter
from samplechain.runtime.decoding import complete_utf8 as _complete_utf8
from samplechain.runtime.decoding import find_stop, partial_stop


def test_find_stop_takes_the_earliest_hit_near_the_end():
    assert find_stop("hello world", ["world", "lo"], 5) == (6, "world")  # "lo" starts before the search window
    assert find_stop("hello world", ["lo w", "world"], 8) == (3, "lo w")
    assert find_stop("hello", ["xyz"], 5) is None


@pytest.mark.parametrize("text, stops, held", [
    ("The end. ST", ["STOP"], True), ("The end. S", ["STOP"], True), ("The end.", ["STOP"], False),
    ("STOP", ["STOP"], False),  # a whole stop string is not a partial one
    ("abc", [], False),
])
def test_partial_stop(text, stops, held):
    assert partial_stop(text, stops) is held


def test_piece_cut_before_an_incomplete_utf8_tail():
    assert _complete_utf8("é".encode()) == "é"
    assert _complete_utf8(b"a" + "é".encode()[:1]) == "a"
    assert _complete_utf8("€".encode()[:2]) == ""


def test_reasoning_splitter_streams_thought_then_content():
    s = ReasoningSplitter(enabled=True)
    out = [s.push(t) for t in ["<th", "ink>Let me", " think</th", "ink>\n\nThe answer", " is 4."]]
    out.append(s.push("", final=True))
    assert "".join(t for t, _ in out) == "Let me think"
    assert "".join(c for _, c in out) == "The answer is 4."
    assert out[0] == ("", "")  # "<th" may be the start tag: held back


def test_reasoning_splitter_without_a_block():
    s = ReasoningSplitter(enabled=True)
    assert s.push("Hello") == ("", "Hello")
    assert s.push(" <think>x</think>") == ("", " <think>x</think>")  # only a leading block is reasoning
    assert ReasoningSplitter(enabled=False).push("<think>a</think>b") == ("", "<think>a</think>b")
    started = ReasoningSplitter(enabled=True, started=True)  # the prompt opened the block
    assert started.push("plan</think>answer", final=True) == ("plan", "answer")
