"""The adaptive draft length (runtime/speculation.py, docs/speculative.md "The draft length"): a window that doubles
while drafts are accepted and shrinks on a rejection, capped by the length with the most expected tokens per unit
of time under the measured verify cost, never below --draft-min. Exact lengths from scripted outcomes on injected
cost models and a fake clock (no wall-clock bound anywhere); then the text with the policy equals plain decoding's,
and ``generate`` and ``serve`` build the same policy from the same flags."""

import pytest

from samplechain import SamplingParams
from samplechain.runtime.speculation import (
    KEEP,
    START,
    CostModel,
    LinearCost,
    MeasuredCost,
    Speculation,
    expected_tokens,
)
from samplechain.speculative.config import SpeculationConfig
from samplechain.speculative.ngram import make_drafters

COPY = ("Text: The ocean covers seventy percent of the planet. Its currents move heat from the equator to the poles, "
        "and its depths store carbon for centuries. Without it, the weather of every continent would be different."
        "\n\nThe same text, copied exactly:\n\nText: The ocean")


class Long:
    """Proposes 48 tokens whenever ``drafting`` says so (a prompt-lookup drafter with a long match)."""

    name = "long"
    n_max = 48

    def __init__(self, drafting=lambda round_: True):
        self.drafting, self.round = drafting, 0

    def begin(self, prompt):
        pass

    def draft(self, history, id_last):
        self.round += 1
        return list(range(100, 148)) if self.drafting(self.round) else []

    def accept(self, n_accepted, is_other=False):
        pass


def lengths(spec, outcomes, clock=None):
    """Drive ``spec`` as the decode loop does: propose, time the forward (``clock(batch)`` seconds, when given),
    accept. ``outcomes[i]``: tokens accepted in round i (None: all). Returns each round's draft length."""
    out = []
    for accepted in outcomes:
        draft = spec.propose([1, 2, 3], 4, 1000)
        out.append(len(draft))
        if clock is not None:
            spec.record_time(1 + len(draft), clock(1 + len(draft)))
        if draft:
            spec.accept(len(draft), len(draft) if accepted is None else min(accepted, len(draft)))
    return out


ALL = None


def test_expected_tokens():
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 3) == 1.875  # 1 + 1/2 + 1/4 + 1/8
    assert expected_tokens(1.0, 16) == 17.0


def test_best_length_maximises_tokens_per_unit_of_time():
    spec = Speculation([], cost=LinearCost(0.1))  # n tokens cost 1 + 0.1 (n - 1) one-token steps
    assert [spec.best_length(rate, 16) for rate in (0.1, 0.2, 0.5, 0.75, 0.9, 0.95, 0.99)] == [0, 1, 2, 5, 10, 15, 16]
    assert spec.best_length(0.99, 8) == 8  # the limit
    dear = Speculation([], cost=LinearCost(0.6))
    assert [dear.best_length(rate, 16) for rate in (0.5, 0.75, 0.9, 0.99)] == [0, 1, 2, 10]
    assert Speculation([]).best_length(0.1, 12) == 12  # nothing measured yet: no cap from the cost


def test_window_doubles_while_drafts_are_accepted():
    spec = Speculation([Long()], n_max=16, cost=LinearCost(0.1))
    assert lengths(spec, [ALL] * 6) == [START, 8, 16, 16, 16, 16]
    assert spec.stats["long"].window == 16


def test_the_window_follows_the_text_across_drafters():
    """One drafter starts a copy (its only proposal), another continues it at the length reached; a rejection of the
    second shrinks the window the first would draft with."""
    first = Long(lambda round_: round_ == 1)
    first.name = "first"
    spec = Speculation([first, Long()], n_max=16, cost=LinearCost(0.0))  # free verify batches: the window decides
    assert lengths(spec, [ALL, ALL, ALL, 2]) == [4, 8, 16, 16]
    assert {name: s.window for name, s in spec.stats.items()} == {"first": 9, "long": 9}
    assert (spec.stats["first"].drafts, spec.stats["long"].drafts) == (1, 3)


def test_a_drafter_added_later_drafts_at_the_window_reached():
    spec = Speculation([Long()], n_max=16, cost=LinearCost(0.0))
    lengths(spec, [ALL, ALL])
    late = Long()
    late.name = "late"
    spec.add(late)
    assert spec.stats["late"].window == spec.stats["long"].window == 16


class Table:
    """A cost model with fixed ratios and sample counts per batch size."""

    def __init__(self, ratios, samples):
        self.ratios, self.counts = ratios, samples

    def record(self, batch, seconds):
        pass

    def ratio(self, batch):
        return self.ratios(batch)

    def samples(self, batch):
        return self.counts.get(batch, 0)


def test_exploration_tries_the_neighbours_that_may_be_drafted():
    """The best length (16: batch 17, measured) has unmeasured neighbours: the shorter one is tried first; with
    --draft-min 16 it could not be drafted (dropped, never measured), so the longer one is; a neighbour predicted
    slower than plain decoding is never tried."""
    cost = Table(lambda b: 1.0 + 0.2 * (b - 1) + (3.0 if b > 17 else 0.0), {17: 3})
    assert Speculation([], n_max=17, cost=cost).best_length(0.99, 17) == 15
    assert Speculation([], n_max=17, n_min=16, cost=cost).best_length(0.99, 17) == 17
    assert Speculation([], n_max=16, n_min=16, cost=cost).best_length(0.99, 16) == 16  # nothing else to try
    dear = Table(lambda b: 1.0 if b == 1 else (2.0 if b == 3 else 3.0 * b), {3: 3})  # batches of 2 and 4: 6, 12
    assert Speculation([], cost=dear).best_length(0.99, 16) == 2


def test_window_shrinks_on_rejection_and_grows_back():
    spec = Speculation([Long()], n_max=16, cost=LinearCost(0.1))
    # 16 drafted, 2 taken: the next window is (16 + 2) // 2 = 9; two rejections at once halve it twice
    assert (lengths(spec, [ALL, ALL, ALL, ALL, 2, ALL, ALL, ALL, ALL, 0, 0, ALL, ALL])
            == [4, 8, 16, 16, 16, 9, 16, 16, 16, 16, 8, 4, 8])


def test_a_dear_verify_batch_caps_the_window():
    """Every draft accepted, but each verified token costs 0.6 of a step: the cost-optimal length, not the window,
    sets the pace, and it grows only as the acceptance estimate does."""
    spec = Speculation([Long()], n_max=16, cost=LinearCost(0.6))
    assert lengths(spec, [ALL] * 6) == [1, 2, 2, 3, 4, 5]
    assert spec.stats["long"].window == 10  # twice the last draft: the window stays near the lengths tried


def test_nothing_is_drafted_where_plain_decoding_is_faster_but_probes():
    spec = Speculation([Long()], n_max=16, probe_every=16, cost=LinearCost(0.25))
    got = lengths(spec, [0] * 40)
    assert got == [3, 1, 1] + [0] * 15 + [START] + [0] * 15 + [START] + [0] * 5
    s = spec.stats["long"]
    assert (s.drafts, s.drafted, s.accepted, s.rejected_rounds, s.window) == (5, 13, 0, 5, 2)


def test_never_below_draft_min():
    """A window or cost cap under --draft-min is raised to it (a shorter draft would be dropped: af4ce3c); where
    plain decoding is faster, nothing is drafted at all."""
    spec = Speculation([Long()], n_max=16, n_min=6, cost=LinearCost(0.1))
    assert lengths(spec, [0] * 12) == [6] * 8 + [0] * 4  # rate 1.5 / 10 = 0.15: k = 1 gains under 5 %
    assert Speculation([Long()], n_max=8, n_min=4, cost=LinearCost(0.5)).propose([1], 2, 8) == [100, 101, 102, 103]


def test_the_limit_and_draft_max_bound_every_length():
    spec = Speculation([Long()], n_max=12, cost=LinearCost(0.0))
    assert lengths(spec, [ALL] * 4) == [4, 8, 12, 12]
    assert spec.propose([1], 2, 5) == list(range(100, 105))  # the context or n_predict leave room for 5
    fixed = Speculation([Long()], n_max=12, adaptive=False)
    assert lengths(fixed, [0, 0]) == [12, 12]


def test_measured_cost_on_a_fake_clock():
    cost = MeasuredCost()  # seconds here are ticks of a fake clock
    assert isinstance(cost, CostModel) and cost.slope is None and cost.ratio(5) is None
    cost.record(5, 3.0)  # before any one-token step: counted against the first one
    assert cost.slope is None
    cost.record(1, 1.0)
    assert list(cost.ratios[5]) == [3.0] and cost.slope == 0.5
    for _ in range(7):
        cost.record(1, 1.0)
    cost.record(9, 3.0)  # 3 steps for 9 tokens
    # sizes 5 (ratio 3, once) and 9 (ratio 3, once): slope = (4 * 2 + 8 * 2) / (4 * 4 + 8 * 8)
    assert cost.slope == 24 / 80
    for _ in range(8):  # the machine gets twice as busy: steps and batches alike
        cost.record(1, 2.0)
    cost.record(9, 6.0)
    cost.record(9, 60.0)  # a burst of load elsewhere: the median of 3, 3, 30 is 3
    assert list(cost.ratios[9]) == [3.0, 3.0, 30.0]
    # size 9 now weighs 3: slope = (4 * 2 + 3 * 8 * 2) / (4 * 4 + 3 * 8 * 8)
    assert cost.slope == 56 / 208
    assert cost.ratio(17) == 1 + 16 * (56 / 208)
    assert cost.describe() == "9 tokens 6000.0 ms vs 1 token 1500.0 ms (3.00x), +0.269 step per token"
    for _ in range(KEEP + 3):
        cost.record(9, 4.0)  # each size keeps its last KEEP forwards
    assert len(cost.ratios[9]) == KEEP and cost.ratios[9][-1] == 2.0
    cost.record(1, 0.0)  # not a time: ignored
    assert len(cost.steps) == 16


def test_the_policy_on_measured_costs():
    """The decode loop's timings on a fake clock: a one-token step takes 10 ms (20 ms from the 20th forward on: load
    elsewhere), n tokens 1 + 0.1 (n - 1) steps; every third round has nothing to draft. The batches timed while the
    last steps were still the quiet ones look twice as dear, and the median of each size's ratios leaves them out:
    the fit is the machine's, and the lengths are those of the policy on the exact cost model, but for the three
    rounds that measure the neighbouring length (15) once 16 has been measured three times."""
    forwards = [0]

    def clock(batch):
        forwards[0] += 1
        return (0.010 if forwards[0] < 20 else 0.020) * (1 + 0.1 * (batch - 1))

    def every_third_idle(round_):
        return round_ % 3 != 1

    outcomes = [ALL] * 10 + [3] + [ALL] * 29
    measured = Speculation([Long(every_third_idle)], n_max=16)
    got = lengths(measured, outcomes, clock)
    assert got == [0, 4, 8] + [0, 16, 16, 0, 16, 15, 0, 15, 9, 0, 15, 16] + [0, 16, 16] * 8 + [0]
    exact = lengths(Speculation([Long(every_third_idle)], n_max=16, cost=LinearCost(0.1)), outcomes)
    assert [i for i, (a, b) in enumerate(zip(got, exact, strict=True)) if a != b] == [8, 10, 13]
    assert {size: measured.cost.samples(size) for size in (16, 17)} == {16: 3, 17: 20}
    assert list(measured.cost.ratios[17]).count(pytest.approx(5.2)) == 4  # 2.6 steps, against the quiet ones
    assert measured.cost.slope == pytest.approx(0.1)


def test_the_policy_finds_a_step_in_the_verify_cost():
    """A kernel that pads batches to 16 rows: 17 tokens cost a 16-row group more than 16 (a one-token step takes 5
    ticks, each more token 1, a 17th 5 more). The line through the measured sizes cannot see it; the neighbouring
    lengths are measured once the chosen one is (three forwards each), and the drafts settle at 15 tokens: with every
    draft accepted, a batch of 16 emits 16 tokens for 4 steps, one of 17 emits 17 for 5.2."""
    def clock(batch):
        return 5.0 + (batch - 1) + (5.0 if batch > 16 else 0.0)

    def every_third_idle(round_):
        return round_ % 3 != 1

    spec = Speculation([Long(every_third_idle)], n_max=16)
    got = lengths(spec, [ALL] * 40, clock)
    assert got == [0, 4, 7, 0, 12, 16, 0, 16, 16] + [0, 15, 15, 0, 15, 14, 0, 14, 14] + [0, 15, 15] * 7 + [0]
    assert {size: (spec.cost.samples(size), spec.cost.ratio(size)) for size in (15, 16, 17)} == {
        15: (3, 3.8), 16: (17, 4.0), 17: (3, 5.2)}
    assert spec.cost.ratio(13) == 1 + 12 * spec.cost.slope  # measured once: the line


# --- with the model ------------------------------------------------------------------------------------------------

def recorded(spec):
    """The drafts ``spec`` proposes, in order, as they are proposed."""
    drafts = []
    propose = spec.propose

    def wrapped(*args):
        drafts.append(propose(*args))
        return drafts[-1]

    spec.propose = wrapped
    return drafts


@pytest.mark.parametrize("params", [dict(temperature=0.0), dict(seed=7, temperature=0.8, repeat_penalty=1.1)])
def test_the_policy_keeps_the_text_of_plain_decoding(smol, params):
    p = SamplingParams(**params)
    plain = "".join(smol.generate(COPY, p, n_predict=96))
    for cost in (LinearCost(0.1), None):  # an exact cost model, and this machine's measured one
        spec = Speculation(make_drafters(["ngram-simple"], ngram_simple_size_n=3, ngram_simple_size_m=16),
                           n_max=16, **({} if cost is None else {"cost": cost}))
        drafts = recorded(spec)
        assert "".join(smol.generate(COPY, p, n_predict=96, speculation=spec)) == plain
        s = spec.stats["ngram-simple"]
        assert s.accepted > 0 and s.drafted == sum(map(len, drafts))
        if cost is not None and params.get("temperature") == 0.0:
            assert max(map(len, drafts)) == 16  # the copy was drafted in long drafts


def test_generate_and_serve_build_the_same_policy(monkeypatch, smol, capsys):
    """``generate`` and ``serve`` turn the same flags into the same ``SpeculationConfig`` and build each sequence's
    ``Speculation`` from it the same way (``SpeculationConfig.build``): one policy for the CLI and the server."""
    from tests.server.conftest import call, live_server

    from samplechain import cli
    from samplechain.cli import run as cli_run

    flags = ["--spec-type", "ngram-simple", "--draft-max", "16", "--draft-min", "2", "--spec-ngram-simple-size-n", "3",
             "--seed", "5"]
    built = []
    build = SpeculationConfig.build
    monkeypatch.setattr(SpeculationConfig, "build",
                        lambda self, draft=None: built.append((self, build(self, draft))) or built[-1][1])
    monkeypatch.setattr(cli_run, "load_model", lambda name, args, kernel=None: smol)
    assert cli.main(["generate", "-p", COPY, "-n", "24", "--temp", "0", *flags]) == 0
    text = capsys.readouterr().out
    got = {}
    monkeypatch.setattr("samplechain.server.app.serve", lambda config, log_level: got.setdefault("c", config) and 0)
    assert cli.main(["serve", *flags]) == 0
    config = got["c"].speculation
    with live_server(smol, n_slots=1, n_ctx=1024, speculation=config) as s:
        body = call(s, "POST", "/completion", {"prompt": COPY, "n_predict": 24, "temperature": 0}).json()
    (cli_config, cli_spec), (server_config, server_spec) = built
    assert cli_config == config == server_config
    for spec in (cli_spec, server_spec):
        assert (type(spec), type(spec.cost), spec.n_max, spec.n_min, spec.adaptive) == (
            Speculation, MeasuredCost, 16, 2, True)
        assert [(d.name, d.size_n, d.size_m) for d in spec.drafters] == [("ngram-simple", 3, 48)]
        assert spec.stats["ngram-simple"].drafts > 0
    assert text.endswith(body["content"] + "\n")
