"""What a server says about its model: the bodies of ``/props`` and ``/v1/models`` (also their snapshots when it
goes to sleep: ``ServerState``, which imports this module, so ``state`` is duck-typed here)."""

from __future__ import annotations

import os
import time
from typing import Any

from samplechain.chat import ChatTemplate
from samplechain.runtime.decoding import Rules
from samplechain.server import responses as rs
from samplechain.server.request import Options


def props_body(state: Any, sleeping: bool) -> dict[str, Any]:
    """``/props`` of the loaded model (and its snapshot on entering sleep, ``ServerState._on_sleep``)."""
    config = state.config
    m = state.model
    vocab = m.vocab
    opts = Options(Rules(n_predict=config.defaults.rules.n_predict, n_keep=config.defaults.rules.n_keep))

    def text(t: int | None) -> str:
        return vocab.token_bytes(t).decode("utf-8", "replace") if t is not None else ""

    return {
        "default_generation_settings": {"params": rs.settings(config.defaults.params, opts),
                                        "n_ctx": state.running_engine.n_ctx_slot},
        "total_slots": config.n_slots, "model_alias": state.model_id,
        "model_path": os.path.basename(m.path),  # the file's name: its folder is nobody's business
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": config.slots, "endpoint_props": config.props, "endpoint_metrics": config.metrics,
        "chat_template": vocab.chat_template or "",
        "chat_template_caps": ChatTemplate.of(vocab).caps.to_json(), "bos_token": text(vocab.bos),
        "eos_token": text(vocab.eos), "build_info": rs.BUILD_INFO, "is_sleeping": sleeping,
        "ui": False, "cors_proxy_enabled": False,
    }


def models_body(state: Any) -> dict[str, Any]:
    """``/v1/models`` of the loaded model (and its snapshot on entering sleep, ``ServerState._on_sleep``)."""
    config = state.config
    m = state.model
    meta = {"vocab_type": 2, "n_vocab": m.config.n_vocab, "n_ctx": state.running_engine.n_ctx_slot,
            "n_ctx_train": m.config.n_ctx_train, "n_embd": m.config.n_embd,
            "n_params": m.transformer.n_params if hasattr(m.transformer, "n_params") else 0,
            "size": os.path.getsize(m.path), "ftype": ""}
    mid = state.model_id
    return {"object": "list",
            "data": [{"id": mid, "aliases": sorted(config.alias), "tags": sorted(config.tags),
                      "object": "model", "created": int(time.time()), "owned_by": "samplechain",
                      "meta": meta}],
            "models": [{"name": mid, "model": mid, "modified_at": "", "size": "", "digest": "",
                        "type": "model", "description": "", "tags": [""], "capabilities": ["completion"],
                        "parameters": "", "details": {"parent_model": "", "format": "gguf", "family": "",
                                                      "families": [""], "parameter_size": "",
                                                      "quantization_level": ""}}]}
