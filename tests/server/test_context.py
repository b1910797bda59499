"""A slot's context: shifting when full (--context-shift), cells per slot, and the same text whatever the slot."""

from tests.server.conftest import call, live_server


def test_context_shift_keeps_generating(smol):
    body = {"prompt": "1 2 3 4 5 6 7", "n_predict": 100, "ignore_eos": True, "seed": 1, "n_keep": 2}
    with live_server(smol, n_slots=1, n_ctx=64, context_shift=True) as s:
        r = call(s, "POST", "/completion", body).json()
        assert r["tokens_predicted"] == 100 and r["truncated"] is True and r["stop_type"] == "limit"
    with live_server(smol, n_slots=1, n_ctx=64) as s:  # no shift: stops at the slot's end
        r = call(s, "POST", "/completion", body).json()
        assert r["tokens_predicted"] == 64 - r["tokens_evaluated"] and r["truncated"] is True


def test_every_slot_gives_the_same_text(smol):
    body = {"prompt": "The river", "n_predict": 20, "seed": 5}
    with live_server(smol, n_slots=3, n_ctx=768) as s:
        texts = {call(s, "POST", "/completion", {**body, "id_slot": i, "cache_prompt": False}).json()["content"]
                 for i in range(3)}
        slots = call(s, "GET", "/slots").json()
    assert len(texts) == 1
    assert [x["n_ctx"] for x in slots] == [256, 256, 256]
    # idle, as llama-server shows a released slot: the cells it holds, its counters reset
    assert all(x["n_prompt_tokens"] == 2 + 20 - 1 and x["next_token"][0]["n_decoded"] == 0 for x in slots)
