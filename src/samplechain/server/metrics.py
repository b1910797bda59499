"""``/metrics``: the engine's counters and their Prometheus text (llama-server's names, from
``server_task_result_metrics::to_metrics`` in tools/server/server-task.cpp)."""

from __future__ import annotations


class Metrics:
    """Counters for ``/metrics``. They outlive the engine: a server that sleeps (``--sleep-idle-seconds``) keeps
    them for the engine it loads when it wakes."""

    def __init__(self) -> None:
        self.prompt_tokens_total = 0
        self.prompt_seconds_total = 0.0
        self.tokens_predicted_total = 0
        self.tokens_predicted_seconds_total = 0.0
        self.n_cached = 0
        self.n_decode_total = 0
        self.n_tokens_max = 0
        self.n_busy_slots_total = 0
        self.requests_deferred = 0
        self.n_sleeps = 0  # times the server went to sleep (the model released after --sleep-idle-seconds)
        # the window since the last scrape
        self.window_prompt = [0, 0.0]
        self.window_predicted = [0, 0.0]
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted_tokens = 0

    def add_draft(self, n_drafted: int, n_accepted: int) -> None:
        self.spec_drafts += 1
        self.spec_draft_tokens += n_drafted
        self.spec_accepted_tokens += n_accepted

    def add_decode(self, n_tokens: int, n_busy: int) -> None:
        self.n_decode_total += 1
        self.n_tokens_max = max(self.n_tokens_max, n_tokens)
        self.n_busy_slots_total += n_busy

    def add_prompt(self, n: int, seconds: float) -> None:
        self.prompt_tokens_total += n
        self.prompt_seconds_total += seconds
        self.window_prompt[0] += n
        self.window_prompt[1] += seconds

    def add_predicted(self, n: int, seconds: float) -> None:
        self.tokens_predicted_total += n
        self.tokens_predicted_seconds_total += seconds
        self.window_predicted[0] += n
        self.window_predicted[1] += seconds

    def reset_window(self) -> None:
        """A scrape read the throughput gauges: they are averaged over the window between two scrapes."""
        self.window_prompt, self.window_predicted = [0, 0.0], [0, 0.0]

    def snapshot(self) -> Metrics:
        """A copy (what a sleeping server answers: the counters as they were on entering sleep)."""
        out = Metrics()
        out.__dict__.update({k: list(v) if isinstance(v, list) else v for k, v in self.__dict__.items()})
        return out


def render(m: Metrics, n_processing: int, n_deferred: int) -> str:
    """The Prometheus text of ``m`` (one scrape: the caller resets the window after it)."""
    wp, wd = m.window_prompt, m.window_predicted
    rows = [
        ("counter", "prompt_tokens_total", "Number of prompt tokens processed.", m.prompt_tokens_total),
        ("counter", "prompt_tokens_cached_total", "Number of prompt tokens reused from the cache.", m.n_cached),
        ("counter", "prompt_seconds_total", "Prompt process time", m.prompt_seconds_total),
        ("counter", "tokens_predicted_total", "Number of generation tokens processed.", m.tokens_predicted_total),
        ("counter", "tokens_predicted_seconds_total", "Predict process time", m.tokens_predicted_seconds_total),
        ("counter", "n_decode_total", "Total number of llama_decode() calls", m.n_decode_total),
        ("counter", "n_tokens_max", "Largest observed n_tokens.", m.n_tokens_max),
        ("counter", "n_sleeps_total", "Number of times the server went to sleep (--sleep-idle-seconds).",
         m.n_sleeps),
        ("counter", "spec_decode_num_drafts_total", "Number of speculative drafts.", m.spec_drafts),
        ("counter", "spec_decode_num_draft_tokens_total", "Number of drafted tokens.", m.spec_draft_tokens),
        ("counter", "spec_decode_num_accepted_tokens_total", "Number of accepted draft tokens.",
         m.spec_accepted_tokens),
        ("gauge", "n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
         m.n_busy_slots_total / m.n_decode_total if m.n_decode_total else 0.0),
        ("gauge", "prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
         wp[0] / wp[1] if wp[1] > 0 else 0.0),
        ("gauge", "predicted_tokens_seconds", "Average generation throughput in tokens/s.",
         wd[0] / wd[1] if wd[1] > 0 else 0.0),
        ("gauge", "requests_processing", "Number of requests processing.", n_processing),
        ("gauge", "requests_deferred", "Number of requests deferred.", n_deferred),
    ]
    lines = []
    for kind, name, help_text, value in rows:
        lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value}"]
    return "\n".join(lines) + "\n"
