"""``AffinityRouter``'s placement, driven directly (no cluster): new conversations to the least loaded replica,
later turns to the remembered one, pins first, counts released on completion."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from samplechain.integrations.ray_deployments import AffinityRouter


def replicas(*names: str) -> list:
    return [SimpleNamespace(replica_id=SimpleNamespace(unique_id=n)) for n in names]


def request(n: int, affinity: str | None = None, pin: str | None = None, age: float = 0.0):
    return SimpleNamespace(kwargs={"affinity": affinity, "pin": pin}, created_at=time.time() - age,
                           metadata=SimpleNamespace(internal_request_id=f"req-{n}"))


def router(**kwargs) -> AffinityRouter:
    r = AffinityRouter.__new__(AffinityRouter)  # Serve builds it with its own arguments; the state is ours
    r.initialize_state(**kwargs)
    return r


def choose(r: AffinityRouter, candidates: list, pending) -> list[list[str]]:
    ranks = asyncio.run(r.choose_replicas(candidates, pending))
    return [[x.replica_id.unique_id for x in rank] for rank in ranks]


def test_new_conversations_are_spread_evenly_and_later_turns_follow_them():
    r, candidates = router(), replicas("a", "b")
    first = [choose(r, candidates, request(i, affinity=f"prefix:{i}"))[0][0] for i in range(16)]
    assert sorted(first.count(x) for x in "ab") == [8, 8]  # rendezvous hashing alone gave 5 and 11
    assert dict(r.in_flight) == {"a": 8, "b": 8}
    # every later turn of each conversation goes where its first did, however loaded that replica is
    for i in range(16):
        r.on_request_completed(None, f"req-{i}")
    assert dict(r.in_flight) == {}
    later = [choose(r, candidates, request(100 + i, affinity=f"prefix:{i}"))[0][0] for i in range(16)]
    assert later == first


def test_a_pin_wins_and_a_gone_replica_s_keys_are_placed_again():
    r, candidates = router(), replicas("a", "b")
    assert choose(r, candidates, request(1, affinity="k", pin="b")) == [["b"]]
    r.on_request_completed(None, "req-1")
    home = choose(r, candidates, request(2, affinity="k2"))[0][0]
    r.on_request_completed(None, "req-2")
    other = "b" if home == "a" else "a"
    assert choose(r, replicas(other), request(3, affinity="k2")) == [[other]]  # its replica died
    assert r.placed["k2"] == other


def test_past_its_patience_a_request_may_go_anywhere_in_a_fixed_order():
    r, candidates = router(patience_s=5.0), replicas("a", "b", "c")
    home = choose(r, candidates, request(1, affinity="k"))[0][0]
    ranks = choose(r, candidates, request(2, affinity="k", age=6.0))
    assert ranks[0] == [home] and sorted(x for [x] in ranks) == ["a", "b", "c"]


def test_a_retried_request_is_counted_once_and_unkeyed_ones_are_not_counted():
    r, candidates = router(), replicas("a", "b")
    pending = request(1, affinity="k")
    choose(r, candidates, pending)
    choose(r, candidates, pending)  # Serve asks again when a replica rejected it
    assert sum(r.in_flight.values()) == 1
    assert len(choose(r, candidates, request(2))[0]) == 2  # two random replicas, Serve takes the less loaded
    assert sum(r.in_flight.values()) == 1


def test_the_remembered_keys_are_bounded():
    r, candidates = router(keys=4), replicas("a", "b")
    for i in range(10):
        choose(r, candidates, request(i, affinity=f"k{i}"))
    assert list(r.placed) == ["k6", "k7", "k8", "k9"]
