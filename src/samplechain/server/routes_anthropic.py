"""(being written)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter

if TYPE_CHECKING:
    from samplechain.server.state import ServerState


def router(state: ServerState) -> APIRouter:
    return APIRouter()
