"""``samplechain serve``: llama-server's and OpenAI's HTTP API over a continuously batched engine."""
