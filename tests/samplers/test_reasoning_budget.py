"""The reasoning-budget sampler (common/reasoning-budget.cpp) and the cases of llama.cpp's
tests/test-reasoning-budget.cpp."""

import numpy as np
import pytest

from samplechain import Candidates, ReasoningBudget, ReasoningBudgetState, Vocab
from samplechain.samplers.base import FILTER, DeviceShape
from samplechain.samplers.reasoning_budget import utf8_is_complete

S = ReasoningBudgetState


def harness_logits(max_token):
    """llama.cpp's harness: logit_i = logf(i + 1) for ids 0..max_token."""
    return np.log(np.arange(1, max_token + 2, dtype=np.float32))


def forced_token(rb, max_token=110):
    """The single finite token after apply, or None when the sampler leaves the logits alone."""
    c = Candidates.from_logits(harness_logits(max_token))
    rb.apply(c)
    finite = np.flatnonzero(np.isfinite(c.logits))
    if len(finite) == len(c):
        return None
    assert len(finite) == 1, "forcing leaves exactly one finite logit"
    return int(c.ids[finite[0]])


def run(rb, sequence, max_token=120):
    """Per step: apply on fresh logits (the forced token or None), then accept the sequence token (not the forced
    one), as llama.cpp's harness does."""
    out = []
    for token in sequence:
        out.append(forced_token(rb, max_token))
        rb.accept(token)
    return out


# --- the cases of tests/test-reasoning-budget.cpp --------------------------------------------------------------

@pytest.mark.parametrize("sequence, start, end, forced, budget, state, expected", [
    pytest.param([100, 50, 51, 101, 52], [[100]], [[101]], [102], 5, S.IDLE,
                 [None] * 5, id="natural end before budget exhausted"),
    pytest.param([100, 50, 51, 52, 53], [[100]], [[101]], [102, 101], 2, S.IDLE,
                 [None, None, None, 102, 101], id="budget exhausted forcing"),
    pytest.param([100, 50, 51, 52], [[100]], [[101]], [102, 101], 0, S.COUNTING,
                 [102, 101, None, None], id="activate immediately budget=0"),
    pytest.param([50, 51, 52, 53], [[]], [[]], [102], 2, S.IDLE,
                 [None] * 4, id="no start/end configured"),
    pytest.param([50, 51, 52, 53], [[100]], [[101]], [102, 101], 2, S.COUNTING,
                 [None, None, 102, 101], id="activate immediately with budget"),
    pytest.param([100, 50, 101, 100, 60, 61, 62, 63], [[100]], [[101]], [102, 101], 2, S.IDLE,
                 [None] * 6 + [102, 101], id="multi-block re-arms budget after DONE"),
    pytest.param([110, 111, 50, 51, 52, 53], [[100], [110, 111]], [[101]], [102, 101], 2, S.IDLE,
                 [None] * 4 + [102, 101], id="multiple start sequences"),
    pytest.param([100, 50, 103, 104, 52], [[100]], [[101], [103, 104]], [102, 101], 5, S.IDLE,
                 [None] * 5, id="multiple end sequences"),
])
def test_llama_cpp_cases(sequence, start, end, forced, budget, state, expected):
    rb = ReasoningBudget(None, start, end, forced, budget, state)
    assert run(rb, sequence) == expected


def test_clone_mid_counting_keeps_remaining():
    rb = ReasoningBudget(None, [[100]], [[101]], [102, 101], 2)
    rb.accept(100)  # COUNTING, remaining 2
    rb.accept(50)  # remaining 1
    clone = rb.clone()
    clone.accept(51)  # exhausts the clone's budget only
    assert forced_token(clone) == 102
    assert (rb.state, rb.remaining, forced_token(rb)) == (S.COUNTING, 1, None)


def test_clone_mid_forcing_keeps_position():
    rb = ReasoningBudget(None, [[100]], [[101]], [102, 101], 0, S.FORCING)
    assert forced_token(rb) == 102
    rb.accept(102)
    clone = rb.clone()
    assert forced_token(clone) == 101
    clone.accept(101)
    assert (clone.state, rb.state, rb.force_pos) == (S.DONE, S.FORCING, 1)


def test_clone_keeps_partial_sequence_match():
    rb = ReasoningBudget(None, [[110, 111]], [[101]], [102], 3)
    rb.accept(110)  # half of the start sequence
    clone = rb.clone()
    clone.accept(111)
    rb.accept(50)
    assert (clone.state, rb.state) == (S.COUNTING, S.IDLE)


def test_force_from_counting_forces_the_whole_sequence():
    rb = ReasoningBudget(None, [[100]], [[101]], [102, 101], 5)
    rb.accept(100)
    rb.accept(50)
    assert rb.state == S.COUNTING and rb.remaining == 4
    assert rb.force() is True
    assert rb.state == S.FORCING
    assert forced_token(rb) == 102
    rb.accept(102)
    assert forced_token(rb) == 101
    rb.accept(101)
    assert rb.state == S.DONE


def test_force_is_refused_outside_counting():
    idle = ReasoningBudget(None, [[100]], [[101]], [102, 101], 5)
    assert idle.force() is False and idle.state == S.IDLE
    done = ReasoningBudget(None, [[100]], [[101]], [102, 101], 5)
    done.accept(100)
    done.accept(101)  # natural end
    assert done.force() is False and done.state == S.DONE
    forcing = ReasoningBudget(None, [[100]], [[101]], [102, 101], 0, S.FORCING)
    forcing.accept(102)
    assert forcing.force() is False
    assert forcing.state == S.FORCING and forced_token(forcing) == 101  # not rewound


def test_end_match_natural_end_and_rearm_clears_it():
    rb = ReasoningBudget(None, [[100]], [[101], [103, 104]], [102, 101], 5)
    assert rb.end_match is None
    for t in (100, 50, 103, 104):
        rb.accept(t)
    assert rb.state == S.DONE and rb.end_match == (103, 104)
    rb.accept(100)  # a new block
    assert rb.state == S.COUNTING and rb.end_match is None


def test_end_match_longest_sequence_wins():
    rb = ReasoningBudget(None, [[100]], [[104], [103, 104]], [102, 104], 5)
    for t in (100, 103, 104):
        rb.accept(t)
    assert rb.end_match == (103, 104)


def test_end_match_recorded_when_forced_sequence_ends_with_it():
    rb = ReasoningBudget(None, [[100]], [[101], [103, 104]], [102, 103, 104], 0, S.FORCING)
    rb.accept(102)
    rb.accept(103)
    assert rb.end_match is None and rb.state == S.FORCING
    rb.accept(104)
    assert rb.state == S.DONE and rb.end_match == (103, 104)


def test_end_match_absent_when_forced_sequence_has_no_end():
    rb = ReasoningBudget(None, [[100]], [[101], [103, 104]], [102], 0, S.FORCING)
    rb.accept(102)
    assert rb.state == S.DONE and rb.end_match is None


@pytest.mark.parametrize("data, complete", [
    (b"", True), (b"hello", True), (b"\xc2\xa0", True), (b"\xe2\x80\x9c", True), (b"\xf0\x9f\x98\x80", True),
    (b"abc\xc3\xa9", True), (b"hello\xc3\xa9", True),
    (b"\xc2", False), (b"\xe2\x80", False), (b"\xe2", False), (b"\xf0\x9f\x98", False), (b"\xf0\x9f", False),
    (b"\xf0", False), (b"\x80", False), (b"hello\xc3", False),
])
def test_utf8_is_complete(data, complete):
    assert utf8_is_complete(data) is complete


# --- state machine details -------------------------------------------------------------------------------------

# ids: 0 "a", 1 first two bytes of U+201C, 2 its last byte, 3 "<think>", 4 "</think>", 5 "!"
UTF8_VOCAB = Vocab([b"a", b"\xe2\x80", b"\x9c", b"<think>", b"</think>", b"!"])


def test_budget_spent_mid_character_waits_for_it():
    rb = ReasoningBudget(UTF8_VOCAB, [[3]], [[4]], [5, 4], 2)
    rb.accept(3)
    rb.accept(0)
    rb.accept(1)  # the budget ends inside a character
    assert (rb.state, rb.remaining) == (S.WAITING_UTF8, 0)
    assert forced_token(rb, 5) is None  # nothing forced while waiting
    rb.accept(1)  # still incomplete: no count, no forcing
    assert (rb.state, rb.remaining) == (S.WAITING_UTF8, 0)
    rb.accept(2)  # completes the character, but llama.cpp checks each token's own text: b"\x9c" alone is not whole
    assert rb.state == S.WAITING_UTF8
    rb.accept(0)
    assert rb.state == S.FORCING
    assert run(rb, [5, 4], 5) == [5, 4]
    assert rb.state == S.DONE and rb.end_match == (4,)


def test_end_sequence_while_waiting_ends_naturally():
    rb = ReasoningBudget(UTF8_VOCAB, [[3]], [[4]], [5, 4], 1)
    rb.accept(3)
    rb.accept(1)
    assert rb.state == S.WAITING_UTF8
    rb.accept(4)
    assert rb.state == S.DONE and rb.end_match == (4,)


def test_without_vocab_every_token_is_complete():
    rb = ReasoningBudget(None, [[3]], [[4]], [5, 4], 2)
    for t in (3, 0, 1):
        rb.accept(t)
    assert rb.state == S.FORCING


def test_sequences_match_across_tokens_and_restart_on_a_mismatch():
    rb = ReasoningBudget(None, [[110, 111]], [[120, 121, 122]], [102], 10)
    for t in (110, 50, 111):  # interrupted start: not a match
        rb.accept(t)
    assert rb.state == S.IDLE
    for t in (110, 110, 111):  # the second 110 restarts the match (failure link), then 111 completes it
        rb.accept(t)
    assert rb.state == S.COUNTING and rb.remaining == 10
    for t in (120, 121, 50, 121, 122):  # broken end sequence: counted tokens
        rb.accept(t)
    assert rb.state == S.COUNTING and rb.remaining == 5
    for t in (120, 120, 121, 122):
        rb.accept(t)
    assert rb.state == S.DONE and rb.end_match == (120, 121, 122)


def test_tokens_of_the_end_sequence_count_until_it_completes():
    rb = ReasoningBudget(None, [[100]], [[103, 104]], [102], 2)
    rb.accept(100)
    rb.accept(103)  # a partial end sequence still counts: remaining 1
    rb.accept(103)  # remaining 0 -> forcing (the end matcher restarts)
    assert rb.state == S.FORCING
    rb.accept(104)  # forced position advances; the restarted matcher does not see a complete end sequence
    assert rb.state == S.DONE and rb.end_match is None


def test_budget_zero_from_idle_forces_right_after_the_start():
    rb = ReasoningBudget(None, [[100]], [[101]], [102, 101], 0)
    assert run(rb, [50, 100, 7, 8, 9]) == [None, None, 102, 101, None]
    assert rb.state == S.DONE


def test_rearm_after_done_with_budget_zero_forces_again():
    rb = ReasoningBudget(None, [[100]], [[101]], [102, 101], 0)
    assert run(rb, [100, 102, 101, 55, 100, 9, 9, 9]) == [None, 102, 101, None, None, 102, 101, None]


def test_forcing_advances_whatever_token_is_accepted():
    rb = ReasoningBudget(None, [[100]], [[101]], [102, 103, 101], 0, S.FORCING)
    assert run(rb, [7, 8, 9, 10]) == [102, 103, 101, None]
    assert rb.state == S.DONE and rb.end_match is None  # 9 is not the end tag


def test_empty_forced_sequence_forces_nothing_and_ends_after_one_token():
    rb = ReasoningBudget(None, [[100]], [[101]], [], 1)
    assert run(rb, [100, 50, 51, 52]) == [None] * 4
    assert rb.state == S.DONE


def test_initial_state_promotion_and_forms():
    assert ReasoningBudget(None, [[1]], [[2]], [3], 0, "counting").state == S.FORCING
    assert ReasoningBudget(None, [[1]], [[2]], [3], 4, S.COUNTING).state == S.COUNTING
    assert ReasoningBudget(None, [[1]], [[2]], [3], 4, 2).state == S.FORCING
    assert ReasoningBudget(None, [[1]], [[2]], [3], 0, S.IDLE).state == S.IDLE
    done = ReasoningBudget(None, [[1]], [[2]], [3], 4, "DONE")
    assert run(done, [9, 1, 8]) == [None, None, None] and done.state == S.COUNTING


def test_reset_goes_back_to_idle_and_clears_counters():
    rb = ReasoningBudget(None, [[100]], [[101], [103, 104]], [102, 101], 5, S.COUNTING)
    for t in (5, 6, 103, 104):
        rb.accept(t)
    assert rb.state == S.DONE and rb.end_match == (103, 104)
    for t in (100, 5, 6, 7, 8, 9, 102):  # a new block, spent, one forced token accepted
        rb.accept(t)
    assert (rb.state, rb.remaining, rb.force_pos) == (S.FORCING, 0, 1)
    rb.reset()
    assert (rb.state, rb.remaining, rb.force_pos, rb.end_match) == (S.IDLE, 5, 0, None)
    rb.accept(5)
    assert rb.state == S.IDLE  # IDLE, not the initial COUNTING (llama.cpp)
    rb2 = ReasoningBudget(None, [[110, 111]], [[101]], [102], 3)
    rb2.accept(110)
    rb2.reset()
    rb2.accept(111)  # the half-matched start was forgotten
    assert rb2.state == S.IDLE


def test_sequences_are_deduplicated_and_flat_lists_are_one_sequence():
    rb = ReasoningBudget(None, [[100], [], [100], (110, 111)], [101, 102], [102], 1)
    assert rb.start == ((100,), (110, 111)) and rb.end == ((101, 102),)
    assert ReasoningBudget(None, [], [], [], 1).start == ()


# --- apply -----------------------------------------------------------------------------------------------------

def test_apply_keeps_only_the_forced_token_and_its_logit():
    rb = ReasoningBudget(None, [[1]], [[2]], [3, 2], 0, S.FORCING)
    x = np.array([0.5, 2.0, -1.0, 0.25, 4.0], dtype=np.float32)
    c = Candidates.from_logits(x)
    c.sort()
    rb.apply(c)
    assert c.ids.tolist() == [4, 1, 0, 3, 2]
    np.testing.assert_array_equal(c.logits, np.array([-np.inf, -np.inf, -np.inf, 0.25, -np.inf], np.float32))
    assert c.sorted is False and c.probs is None and rb.force_pos == 0  # apply does not advance
    np.testing.assert_array_equal(x, [0.5, 2.0, -1.0, 0.25, 4.0])  # the input is not modified


def test_apply_on_a_subset_without_the_forced_token_masks_everything():
    rb = ReasoningBudget(None, [[1]], [[2]], [7], 0, S.FORCING)
    c = Candidates.from_arrays([5, 6], [1.0, 2.0])
    rb.apply(c)
    assert np.isneginf(c.logits).all()


def test_apply_is_a_no_op_outside_forcing():
    rb = ReasoningBudget(None, [[1]], [[2]], [3], 5)
    c = Candidates.from_logits([1.0, 2.0, 3.0, 4.0])
    before = c.logits
    rb.apply(c)
    assert c.logits is before


def test_identity():
    rb = ReasoningBudget(None, [[1]], [[2]], [3], 5)
    assert rb.name == rb.display_name == "reasoning-budget" and rb.effect == FILTER and not rb.disabled
    assert rb.device_plan(DeviceShape()) is None  # no device form (as in llama.cpp)
    assert repr(rb) == ("ReasoningBudget(start=((1,),), end=((2,),), forced=(3,), budget=5, "
                        "initial_state='IDLE')")


# --- bad parameters -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, match", [
    ((None, [[1]], [[2]], [3], -1), "budget must be >= 0"),
    ((None, [[1]], [[2]], [3], 2**31), "budget must be at most"),
    ((None, [[1]], [[2]], [3], 1.5), "budget must be an integer"),
    ((None, [[1]], [[2]], [3], True), "budget must be an integer"),
    ((None, "<think>", [[2]], [3], 1), "start must be a list of token-id sequences"),
    ((None, [[1]], [["</think>"]], [3], 1), "end token must be an integer"),
    ((None, [[1]], ["</think>"], [3], 1), "end must be a list of token-id sequences"),
    ((None, [[1]], [[2]], "ab", 1), "forced must be a sequence of token ids"),
    ((None, [[-1]], [[2]], [3], 1), "start token must be >= 0"),
    ((None, [[1]], [[2]], [3], 1, "thinking"), "initial_state must be one of IDLE"),
    ((None, [[1]], [[2]], [3], 1, 9), "initial_state"),
    ((UTF8_VOCAB, [[1]], [[2]], [6], 1), r"forced token 6 is outside the vocabulary \[0, 6\)"),
    ((UTF8_VOCAB, [[60]], [[2]], [3], 1), "start token 60"),
])
def test_bad_parameters(args, match):
    with pytest.raises(ValueError, match=match):
        ReasoningBudget(*args)


def test_accept_checks_tokens_against_the_vocabulary():
    rb = ReasoningBudget(UTF8_VOCAB, [[3]], [[4]], [5], 2, S.COUNTING)
    with pytest.raises(ValueError, match="token 9 is outside the vocabulary"):
        rb.accept(9)
