"""``samplechain serve``: llama-server's and OpenAI's HTTP API over a continuously batched engine.

``start``, ``serve`` and ``BackgroundServer`` live in ``server/app.py`` and ``ServerConfig`` in ``server/config.py``;
they are loaded on first use (PEP 562), so that ``samplechain --help`` and the config need no model code."""

from __future__ import annotations

from typing import Any

__all__ = ["BackgroundServer", "ServerConfig", "serve", "start"]


def __getattr__(name: str) -> Any:
    if name == "ServerConfig":
        from samplechain.server.config import ServerConfig

        return ServerConfig
    if name in ("BackgroundServer", "serve", "start"):
        from samplechain.server import app

        return getattr(app, name)
    raise AttributeError(f"module 'samplechain.server' has no attribute {name!r}")
