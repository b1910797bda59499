"""``samplechain serve``: llama-server's and OpenAI's HTTP API over a continuously batched engine."""

from samplechain.server.app import BackgroundServer, ServerConfig, serve, start

__all__ = ["BackgroundServer", "ServerConfig", "serve", "start"]
