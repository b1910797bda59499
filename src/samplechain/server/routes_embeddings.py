"""llama-server's embeddings (``--embedding``): ``/embedding`` and ``/embeddings`` in its native shape,
``/v1/embeddings`` in OpenAI's (tools/server/server-context.cpp ``handle_embeddings_impl``).

Each prompt is one engine task: read in a slot, its tokens' final-norm outputs pooled as the server pools
(``--pooling``, else the model's own type, else ``none``) and the pooled vector normalized (``embd_normalize``,
default 2: euclidean; runtime/embeddings.py). With pooling ``none`` the native routes return every token's vector,
not normalized, and the OpenAI route refuses the request.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from samplechain.params import SamplingParams
from samplechain.runtime.events import Embeddings
from samplechain.server import limits
from samplechain.server import prompts as pr
from samplechain.server import request as rq
from samplechain.server.jobs import check_fits
from samplechain.server.limits import APIError, bad_request
from samplechain.server.responses import reply
from samplechain.server.run import Run
from samplechain.server.slot import Task

if TYPE_CHECKING:
    from samplechain.runtime.generation import Model
    from samplechain.server.state import ServerState

ENTRY_ERROR = ("\"prompt\" elements must be a string, a list of tokens, a JSON object containing a prompt string, or "
               "a list of mixed strings & tokens.")
MEDIA = {"image_url": "image", "input_audio": "audio", "input_video": "video", "video_url": "video"}


def content_text(content: Any) -> str:
    """An OpenAI content array's text parts, joined as llama-server joins them (with nothing between)."""
    if not isinstance(content, list):
        raise bad_request("\"content\" must be an array")
    text = ""
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in MEDIA:
            raise bad_request(f"{MEDIA[kind]} input is not supported - hint: if this is unexpected, you may need "
                              "to provide the mmproj")
        if kind != "text":
            raise bad_request("unsupported content[].type")
        value = part.get("text")
        text += value if isinstance(value, str) else ""
    return text


def entry_tokens(model: Model, entry: Any, n_ctx: int) -> list[int]:
    """One input: a string, token ids (mixed with strings), ``{"prompt_string": ...}`` or ``{"content": [...]}``;
    tokenized with the special tokens added and parsed (``tokenize_input_subprompt``)."""
    if isinstance(entry, Mapping):
        if "content" in entry:
            text = content_text(entry["content"])
            return pr.tokenize_mixed(model, text, n_ctx=n_ctx)
        if "prompt_string" not in entry:
            raise bad_request(ENTRY_ERROR)
        if entry.get("multimodal_data") is not None:
            raise bad_request("Multimodal data provided, but model does not support multimodal requests.")
        entry = entry["prompt_string"]
        if not isinstance(entry, (str, list)):
            raise bad_request(ENTRY_ERROR)
    if not isinstance(entry, (str, list)):
        raise bad_request(ENTRY_ERROR)
    return pr.tokenize_mixed(model, entry, n_ctx=n_ctx)


def embedding_prompts(model: Model, prompt: Any, n_ctx: int) -> list[list[int]]:
    """The prompts of ``input`` / ``content``: an array without numbers holds several (at most
    ``MAX_COMPLETIONS``), anything else is one (``tokenize_input_prompts``)."""
    several = isinstance(prompt, list) and not any(isinstance(p, (int, float)) and not isinstance(p, bool)
                                                   for p in prompt)
    entries = prompt if several else [prompt]
    if len(entries) > limits.MAX_COMPLETIONS:
        raise bad_request(f"Field 'input': a request may embed at most {limits.MAX_COMPLETIONS} prompts, "
                          f"got {len(entries)}")
    return [entry_tokens(model, e, n_ctx) for e in entries]


def check_size(state: ServerState, tokens: list[int]) -> None:
    """What llama-server checks when an embedding task takes its slot, checked before it is queued: with pooling
    ``last`` a prompt may be read in chunks and must leave a free cell; any other pooling reads the whole prompt
    in one forward, so it must fit in a batch (llama-server answers that with a 500; it is the request's size)."""
    if not tokens:
        raise bad_request("Input content cannot be empty")
    engine = state.running_engine
    if engine.pooling == "last":
        check_fits(state, tokens)
    elif len(tokens) > engine.n_batch:
        raise bad_request(f"input ({len(tokens)} tokens) is too large to process. increase the physical batch size "
                          f"(current batch size: {engine.n_batch})")
    elif len(tokens) > engine.n_ctx_slot:
        raise APIError(400, f"input ({len(tokens)} tokens) is larger than the max context size "
                       f"({engine.n_ctx_slot} tokens). skipping", "exceed_context_size_error",
                       n_prompt_tokens=len(tokens), n_ctx=engine.n_ctx_slot)


def prepare(state: ServerState, body: Mapping[str, Any], oai: bool) -> tuple[list[list[int]], bool, bool, int]:
    """A request's prompts, whether it is answered in OpenAI's shape (``content`` instead of ``input`` is not),
    whether as base64, and its ``embd_normalize``."""
    if "input" in body:
        prompt = body["input"]
    elif "content" in body:
        oai, prompt = False, body["content"]  # "content" is not OpenAI's field: the native shape
    else:
        raise bad_request("\"input\" or \"content\" must be provided")
    fmt = body.get("encoding_format")
    if fmt is not None and fmt not in ("float", "base64"):
        raise bad_request("The format to return the embeddings in. Can be either float or base64")
    norm = rq.int_field(body, ("embd_normalize",), 2)
    prompts = embedding_prompts(state.model, prompt, state.running_engine.n_ctx_slot)
    if not prompts:
        raise bad_request("\"input\" must not be empty")
    for tokens in prompts:
        check_size(state, tokens)
    return prompts, oai, fmt == "base64", norm


def oai_body(results: list[Embeddings], model: str, use_base64: bool) -> dict[str, Any]:
    """``format_embeddings_response_oaicompat``: each prompt's (first) vector, as floats or as base64 of its
    little-endian float32 bytes, and the prompt tokens used."""
    data = []
    for i, r in enumerate(results):
        vector = np.asarray(r.vectors[0], dtype="<f4")
        if use_base64:
            data.append({"embedding": base64.b64encode(vector.tobytes()).decode("ascii"), "index": i,
                         "object": "embedding", "encoding_format": "base64"})
        else:
            data.append({"embedding": vector.tolist(), "index": i, "object": "embedding"})
    n = sum(r.n_prompt for r in results)
    return {"model": model, "object": "list", "usage": {"prompt_tokens": n, "total_tokens": n}, "data": data}


def router(state: ServerState) -> APIRouter:
    """The embeddings routes over ``state``'s model and engine."""
    routes = APIRouter()

    async def embeddings(req: Request, oai: bool) -> Response:
        if not state.config.embedding:
            raise APIError(501, "This server does not support embeddings. Start it with `--embeddings`",
                           "not_supported_error")
        engine = state.running_engine
        if oai and engine.pooling == "none":
            raise bad_request("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
        body = await rq.read_json(req)
        prompts, oai, use_base64, norm = await asyncio.to_thread(prepare, state, body, oai)
        run = Run(engine, req.is_disconnected)
        for k, tokens in enumerate(prompts):
            run.add(Task(tokens=tokens, params=SamplingParams(), emit=run.emitter(k), cache_prompt=False,
                         embedding=True, embd_normalize=norm))
        results = await run.finals(Embeddings)
        model = body["model"] if isinstance(body.get("model"), str) else state.model_id

        def answer() -> Response:  # off the event loop: a long prompt's vectors are a large body
            if oai:
                return reply(oai_body(results, model, use_base64))
            return reply([{"index": k, "embedding": r.vectors.tolist()} for k, r in enumerate(results)])
        return await asyncio.to_thread(answer)

    @routes.post("/embedding")
    @routes.post("/embeddings")
    async def native(req: Request) -> Response:
        return await embeddings(req, oai=False)

    @routes.post("/v1/embeddings")
    async def openai(req: Request) -> Response:
        return await embeddings(req, oai=True)

    return routes
