"""``Decoder``: one sequence's generation step, the only step loop of the house.

A loop around a ``Decoder`` (``Model.generate``, ``ChatSession``, a server slot) decodes the prompt through the
``Sequence``, hands the decoder the prompt's last output row, then repeats: ``feed()`` says which tokens to decode
next (the last sampled token and, with speculation, a draft; a context shift first when the sequence is full), the
loop decodes them (alone, or in a batch with other sequences), and ``step(rows)`` samples or verifies, rewinds
rejected drafts and turns the tokens into typed events (``Token``, then one ``Final``).

Text follows one of llama.cpp's two tools (``Rules.server``):
- llama-server: special tokens' text with ``special``, an end-of-generation token's text included; a stop string
  ends the text before it, and text that may begin one is held back until it cannot; at least one token.
- llama-cli: every token's bytes, no end-of-generation text; a stop string (a reverse prompt) stops the
  generation after the text that completes it, which is emitted like any other.
"""

from __future__ import annotations

import codecs
import math
import sys
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from samplechain.options import option
from samplechain.runtime.events import Final, Token

if TYPE_CHECKING:
    import torch

    from samplechain.device import BatchSampler
    from samplechain.params import CommonSampler
    from samplechain.runtime.sequence import Sequence
    from samplechain.runtime.speculation import Speculation
    from samplechain.vocab import Vocab

LOGPROB_MIN = -3.4028234663852886e38  # log(0): the most negative float (completion_token_output::logarithm)


@dataclass
class Timings:
    """A generation's counters: llama.cpp's performance report (``report``) and llama-server's ``timings``
    object (``to_dict``). Milliseconds, except ``t_*`` (``time.perf_counter`` seconds)."""

    load_ms: float = 0.0
    kernel: str = ""
    n_reused: int = 0  # prompt tokens found in the cache (llama-server's cache_n)
    n_prompt: int = 0  # prompt tokens decoded (prompt_n)
    prompt_ms: float = 0.0
    n_eval: int = 0
    eval_ms: float = 0.0
    n_sample: int = 0
    sample_ms: float = 0.0
    t_start: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    n_predicted: int = 0
    draft_n: int | None = None  # with speculative decoding: tokens drafted, and accepted
    draft_n_accepted: int = 0

    def report(self) -> str:
        def line(what: str, ms: float, n: int, unit: str) -> str:
            per = ms / n if n else 0.0
            rate = 1e3 * n / ms if ms > 0 else 0.0
            return (f"{what:>18} = {ms:10.2f} ms / {n:5d} {unit} "
                    f"({per:8.2f} ms per token, {rate:8.2f} tokens per second)")
        return "\n".join([
            *([f"{'kernel':>18} = {self.kernel}"] if self.kernel else []),
            f"{'load time':>18} = {self.load_ms:10.2f} ms",
            line("prompt eval time", self.prompt_ms, self.n_prompt, "tokens"),
            line("eval time", self.eval_ms, self.n_eval, "runs  "),
            line("sampling time", self.sample_ms, self.n_sample, "runs  "),
        ] + ([f"{'prompt cache':>18} = {self.n_reused} tokens reused"] if self.n_reused else []))

    def to_dict(self) -> dict[str, float | int]:
        """llama-server's ``timings``: the first token's cost is in the prompt phase; the rate is over n - 1."""
        prompt_ms = (self.t_first - self.t_start) * 1e3 if self.t_first else 0.0
        predicted_ms = (self.t_last - self.t_first) * 1e3 if self.t_first else 0.0
        n_rate = max(self.n_predicted - 1, 0)
        return {
            "cache_n": self.n_reused,
            "prompt_n": self.n_prompt,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / self.n_prompt if self.n_prompt else 0.0,
            "prompt_per_second": 1e3 * self.n_prompt / prompt_ms if prompt_ms > 0 else 0.0,
            "predicted_n": self.n_predicted,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n_rate if n_rate else 0.0,
            "predicted_per_second": 1e3 * n_rate / predicted_ms if n_rate and predicted_ms > 0 else 0.0,
            **({} if self.draft_n is None else {"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted}),
        }


@dataclass
class Rules:
    """When a generation stops and what text it shows. ``n_predict``, ``n_keep`` and ``stop`` are declared options
    (``options.py``): ``generate``'s flags, and ``serve``'s defaults for every request."""

    n_predict: int = option(-1, "-n", "--n-predict", "--predict", type=int,
                            check=lambda v: None if v >= -1 else f"-n/--n-predict must be -1 or more, got {v}",
                            help="tokens to generate at most (-1 = until end of generation or the context limit)")
    n_keep: int = option(0, "--keep", type=int,
                         help="tokens of the prompt kept on context shift (-1 = all)")  # the BOS included
    n_discard: int = 0  # cells a context shift drops (0: half of the rest)
    context_shift: bool = True
    stop: tuple[str, ...] = option((), "-r", "--reverse-prompt", action="append", flag_default=[],
                                   convert=lambda v: tuple(r for r in v if r), metavar="TEXT",
                                   help="stop generating at this text (repeatable; interactive and conversation "
                                        "modes then wait for input)")
    server: bool = False  # llama-server's text rules, else llama-cli's (see the module's docstring)
    special: bool = False  # special tokens' text (llama-server's ``special``; llama-cli always shows them)
    preserved: frozenset[int] = frozenset()  # special tokens whose text shows anyway (a chat format's tool tags)
    n_indent: int = 0  # a new line indented less ends the generation, cut before it (FIM)
    t_max_predict_ms: float = -1.0  # after the first new line, stop once generating took this long
    probs: bool = False  # a ``completion_probabilities`` entry per token (the sampler's ``n_probs``)
    rewind: bool = False  # a stop inside a verified draft leaves the cache and sampler as plain decoding would


class Decoder:
    """Sampling, drafting and stopping for one ``Sequence``; see the module's docstring for the loop around it."""

    def __init__(self, seq: Sequence, sampler: CommonSampler, vocab: Vocab, rules: Rules | None = None, *,
                 n_prompt: int = 0, speculation: Speculation | None = None, device: BatchSampler | None = None,
                 timings: Timings | None = None,
                 on_token: Callable[[int, CommonSampler], None] | None = None) -> None:
        self.seq, self.sampler, self.vocab = seq, sampler, vocab
        self.rules = rules or Rules()
        self.n_prompt = n_prompt
        self.spec, self.device, self.on_token = speculation, device, on_token
        self.timings = timings or Timings()
        if not self.timings.t_start:
            self.timings.t_start = time.perf_counter()
        if speculation is not None:
            self.timings.draft_n = 0
        self.last: int | None = None  # sampled, not yet in the cache
        self.draft: list[int] = []  # the draft fed after ``last``
        self.round: tuple[int, int] | None = None  # the last step's (drafted, accepted), when it verified a draft
        self.generated: list[int] = []
        self.probs: list[dict[str, Any]] = []
        self.text = ""
        self.n_sent = 0
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop_type, self.stopping_word, self.truncated = "none", "", False
        self.has_new_line = False
        self.last_nl = 0  # where the current line starts (n_indent)
        self.n_shifts = 0
        self.final: Final | None = None

    @property
    def done(self) -> bool:
        return self.final is not None

    @property
    def pending(self) -> list[int]:
        """The last sampled token when it is not in the cache (it opens the next turn of a conversation)."""
        return [] if self.last is None else [self.last]

    # --- the step ---------------------------------------------------------------------------------------

    def feed(self) -> list[int] | None:
        """The tokens to decode next, at ``seq.positions(len(...))``, each an output row: the last sampled token
        and the draft that follows it. Makes room first (a context shift); None when the generation is over."""
        if self.final is not None or self.last is None:
            return None
        if not self.seq.has_room() and not self._make_room():
            return None
        self.draft = []
        if self.spec is not None:
            r = self.rules
            limit = self.seq.n_ctx - self.seq.n_past - 2
            if r.n_predict >= 0:  # the accepted drafts and the target's own token stay within n_predict
                limit = min(limit, r.n_predict - len(self.generated) - 1)
            self.draft = self.spec.propose(self.seq.tokens, self.last, limit) if limit > 0 else []
        return [self.last, *self.draft]

    def step(self, rows: Any, *, token: int | None = None, elapsed: float = 0.0) -> list[Token | Final]:
        """After the forward: ``rows`` are the output rows of what ``feed`` returned (or of the prompt's last
        token, the first time), already in the sequence; ``token`` a token sampled elsewhere (batched on the device)
        from the last row; ``elapsed`` the forward's seconds. Returns the events."""
        self.round = None
        if self.last is not None:
            self.timings.eval_ms += elapsed * 1e3
            self.timings.n_eval += 1
        if self.spec is not None and self.last is not None:
            return self._verify(_numpy(rows), elapsed)
        if self.spec is not None and not self.generated:  # the prompt is in: index it for the drafters
            self.spec.begin(self.seq.tokens)
        start = time.perf_counter()
        row = None
        if token is None and self.device is not None and not isinstance(rows, np.ndarray):
            token = self.device.sample(rows[-1:])[0]  # the chain's device prefix runs where the logits are
        if token is None:
            row = _numpy(rows)[-1]
            token = self.sampler.sample(row)
        self.timings.sample_ms += (time.perf_counter() - start) * 1e3
        self.timings.n_sample += 1
        if row is None and self.rules.probs:
            row = _numpy(rows)[-1]
        return self._accepted(token, row)

    def _verify(self, rows: np.ndarray, elapsed: float) -> list[Token | Final]:
        """Sample-and-compare over ``[last, *draft]``'s rows: every emitted token is the target's own sample."""
        spec, draft, seq = self.spec, self.draft, self.seq
        spec.record_time(1 + len(draft), elapsed)
        start = time.perf_counter()
        before = self.sampler.clone() if self.rules.rewind and draft and spec.verify == "compare" else None
        accepted = spec.verify_round(self.sampler, list(rows), draft)
        self.timings.sample_ms += (time.perf_counter() - start) * 1e3
        self.timings.n_sample += len(accepted)
        n_acc = len(accepted) - 1
        if draft:
            spec.accept(len(draft), n_acc)
            self.timings.draft_n += len(draft)
            self.timings.draft_n_accepted += n_acc
            self.round = (len(draft), n_acc)
        seq.truncate(seq.n_past - len(draft) + n_acc)  # the rejected drafts' cells
        events: list[Token | Final] = []
        for j, token in enumerate(accepted):
            n_later = len(accepted) - 1 - j  # accepted tokens after this one (in the cache but the last)
            events += self._accepted(token, None, n_later)
            if self.final is None:
                continue
            if n_later:  # verified after the stop, never emitted: out of the cache
                seq.truncate(seq.n_past - n_later)
                if before is not None:  # the sampler as plain decoding leaves it: the round replayed to the stop
                    self.sampler = before
                    before.sample_and_accept_n(list(rows[:j + 1]), draft[:j])
            break
        return events

    # --- a sampled token --------------------------------------------------------------------------------

    def _accepted(self, token: int, row: np.ndarray | None, n_later: int = 0) -> list[Token | Final]:
        """A token the sampler chose (and accepted): timings, probabilities, text, stop rules. ``n_later``: tokens
        of the same verified round after it, already in the cache (the context is judged at this token's place,
        so a round stops where plain decoding would)."""
        r, t = self.rules, self.timings
        now = time.perf_counter()
        if not self.generated:
            t.t_first = now
        t.t_last = now
        self.last = token
        if self.on_token is not None:
            self.on_token(token, self.sampler)
        eog = self.vocab.is_eog(token)
        if eog and not r.server:  # llama-cli: the end, without its text
            return [self.finish("eos")]
        self.generated.append(token)
        t.n_predicted = len(self.generated)
        probs = None
        if r.probs and row is not None:
            probs = self._probs_entry(token, row)
            self.probs.append(probs)
        new = self.utf8.decode(self.vocab.piece(token, r.special or not r.server or token in r.preserved))
        self.text += new
        send = self._text(new, eog)
        n = len(self.generated)
        if self.stop_type == "none":
            if not self.seq.has_room(1 - n_later) and not r.context_shift:
                self.stop_type, self.truncated = "limit", True
            elif r.n_predict >= 0 and n >= r.n_predict:
                self.stop_type = "limit"
            elif r.n_indent > 0 and self._dedented():
                self.stop_type = "limit"
            elif (r.t_max_predict_ms > 0 and self.has_new_line
                  and (time.perf_counter() - t.t_first) * 1e3 > r.t_max_predict_ms):
                self.stop_type = "limit"
            elif eog:
                self.stop_type = "eos"
        done = self.stop_type != "none"
        if done and self.n_sent < len(self.text):  # text held back for a stop string that never came
            send += self.text[self.n_sent:]
            self.n_sent = len(self.text)
        events: list[Token | Final] = [Token(token, send, probs, n, self.n_prompt, self.seq.id, t.to_dict())]
        if done:
            events.append(self.finish(self.stop_type))
        return events

    def _text(self, new: str, eog: bool) -> str:
        """The text ``new`` releases under the stop rules (UTF-8 is complete in ``new``, or held by the decoder)."""
        r = self.rules
        if not r.server:  # llama-cli: everything as it comes; a reverse prompt stops after the piece with it
            self.n_sent = len(self.text)
            hit = find_stop(self.text, r.stop, len(new)) if r.stop and new else None
            if hit is not None:
                self.stop_type, self.stopping_word = "word", hit[1]
            return new
        send = ""
        if not self.utf8.getstate()[0]:
            unsent: str | None = self.text[self.n_sent:]
            hit = find_stop(unsent, r.stop, len(new))
            if hit is not None:
                pos, word = hit
                self.text = self.text[:self.n_sent + pos]
                self.stop_type, self.stopping_word = "word", word
            elif not eog and partial_stop(unsent, r.stop):
                unsent = None
            if unsent is not None:
                send = self.text[self.n_sent:]
                self.n_sent = len(self.text)
            if "\n" in new:
                self.has_new_line = True
        return send

    def _dedented(self) -> bool:
        """``n_indent``: a new line indented less than ``n_indent`` ends the generation, cut before it (FIM)."""
        if self.last_nl > 0:
            pos = self.last_nl
            while pos < len(self.text) and self.text[pos] in " \t":
                pos += 1
            if pos < len(self.text) and pos - self.last_nl < self.rules.n_indent:
                self.text = self.text[:self.last_nl]
                self.n_sent = min(self.n_sent, len(self.text))
                return True
        nl = self.text.find("\n", self.last_nl)
        if nl >= 0:
            self.last_nl = nl + 1
        return False

    def _make_room(self) -> bool:
        """A context shift (keep ``n_keep``, drop ``n_discard``), or the end when shifting is off or impossible."""
        r = self.rules
        if r.context_shift and self.seq.shift(r.n_keep, r.n_discard):
            self.n_shifts += 1
            self.truncated = True
            return True
        self.finish("limit", truncated=True)
        return False

    # --- the end ----------------------------------------------------------------------------------------

    def finish(self, stop_type: str = "limit", truncated: bool = False) -> Final:
        """The final event: the one the generation ended with, else (a cut generation) one that ends it here."""
        if self.final is not None:
            return self.final
        tail = self.utf8.decode(b"", final=True)
        content = self.text + (tail if stop_type != "word" or not self.rules.server else "")
        probs = self.probs
        if stop_type == "word" and probs:
            n_stop = len(self.vocab.tokenize(self.stopping_word, add_special=False))
            probs = probs[:max(len(probs) - n_stop, 0)]
        self.final = Final(content, list(self.generated), stop_type, self.stopping_word,
                           truncated or self.truncated, self.has_new_line, self.n_prompt, len(self.generated),
                           self.timings.n_reused, self.timings.to_dict(), probs, self.seq.id)
        return self.final

    # --- probabilities ----------------------------------------------------------------------------------

    def _probs_entry(self, token: int, row: np.ndarray) -> dict[str, Any]:
        """One ``completion_probabilities`` entry (llama-server's ``completion_token_output::to_json``)."""
        n = self.sampler.params.n_probs
        if self.sampler.params.post_sampling_probs:
            top = self.sampler.top_probs(n)
            c = self.sampler.candidates
            chosen = 0.0
            if c is not None and c.probs is not None:
                hit = np.flatnonzero(c.ids == token)
                chosen = float(c.probs[hit[0]]) if hit.size else 0.0
            entry = self._token_entry(token)
            entry["prob"] = chosen
            entry["top_probs"] = [{**self._token_entry(t), "prob": p} for t, p in top]
            return entry
        x = row.astype(np.float32)
        finite = np.isfinite(x)
        mx = x[finite].max() if finite.any() else 0.0
        logp = x - mx - np.float32(math.log(float(np.exp((x[finite] - mx).astype(np.float64)).sum())))
        k = min(n, x.size)
        top = np.argpartition(-x, k - 1)[:k]
        top = top[np.lexsort((top, -x[top]))]
        entry = self._token_entry(token)
        entry["logprob"] = _logprob(logp[token])
        entry["top_logprobs"] = [{**self._token_entry(int(t)), "logprob": _logprob(logp[t])} for t in top]
        return entry

    def _token_entry(self, token: int) -> dict[str, Any]:
        data = self.vocab.piece(token, self.rules.special)
        return {"id": int(token), "token": complete_utf8(data), "bytes": list(data)}


def device_sampler(sampler: CommonSampler, device: torch.device) -> BatchSampler | None:
    """llama.cpp's backend sampling for one sequence: on with ``backend_sampling``, off (with a warning) for
    grammars and the reasoning budget."""
    p = sampler.params
    if not (p.backend_sampling or p.backend_dist):
        return None
    if sampler.grammar is not None or sampler.reasoning_budget is not None:
        print("warning: backend sampling is off: grammars and the reasoning budget sample on the CPU",
              file=sys.stderr)
        return None
    from samplechain.device import BatchSampler

    return BatchSampler([sampler], device, select_on_device=p.backend_dist)


def find_stop(text: str, stops: tuple[str, ...] | list[str], n_piece: int) -> tuple[int, str] | None:
    """The earliest full stop string in ``text`` that ends in its last ``n_piece`` characters (llama.cpp searches
    each from ``len(text) - len(word) - n_piece``)."""
    best: tuple[int, str] | None = None
    for word in stops:
        pos = text.find(word, max(len(text) - len(word) - n_piece, 0))
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, word)
    return best


def partial_stop(text: str, stops: tuple[str, ...] | list[str]) -> bool:
    """Whether ``text`` ends with a proper prefix of a stop string."""
    for word in stops:
        for n in range(min(len(word) - 1, len(text)), 0, -1):
            if text.endswith(word[:n]):
                return True
    return False


def complete_utf8(data: bytes) -> str:
    """The piece cut before an incomplete UTF-8 tail."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace")


def _logprob(x: float) -> float:
    x = float(x)
    return x if math.isfinite(x) else LOGPROB_MIN


def _numpy(rows: Any) -> np.ndarray:
    return rows if isinstance(rows, np.ndarray) else rows.float().cpu().numpy()


def stream_text(decoder: Decoder, rows: Any) -> Generator[str, None, Final]:
    """One sequence on a context of its own, as llama.cpp's completion tool runs it: ``rows`` are the output rows
    of the prompt's last token; yields the text as it is released, returns the final event."""
    seq, sent = decoder.seq, 0
    events = [decoder.finish("limit")] if decoder.rules.n_predict == 0 else decoder.step(rows)
    while True:
        for ev in events:
            if isinstance(ev, Token):
                if ev.text:
                    sent += len(ev.text)
                    yield ev.text
                continue
            rest = ev.content[sent:]
            if rest:
                yield rest
            if ev.truncated and ev.stop_type == "limit" and not decoder.rules.context_shift:
                print("\nwarning: context full and context shift is off, stopping", file=sys.stderr)
            return ev
        start = time.perf_counter()  # a draft's cost is the forward's and the drafter's (what drafting saves)
        batch = decoder.feed()
        if batch is None:
            events = [decoder.final]
            continue
        rows = seq.decode(batch, outputs=[True] * len(batch))
        events = decoder.step(rows, elapsed=time.perf_counter() - start)
