"""The sampler-chain visualizer: ``POST /sampling/trace`` and the page at ``/``.

``/sampling/trace`` takes a completion request's prompt (or chat ``messages``) and sampling fields, plus ``n_top``
(candidates kept per stage), ``steps`` (tokens traced, each appended before the next), ``generated`` (tokens already
chosen after the prompt) and ``last_step_only`` (stages of the last step only: the page steps by tracing ``steps``
= N + 1 from the prompt, one random stream, exactly a completion's tokens), and answers with the candidates after
every stage of the chain, what each stage removed or changed and why (``samplechain.trace``). The trace runs on the
engine thread (``Engine.call``), between two steps, in a context of its own, so it never runs the model beside the
slots; its tokens are those a completion with the same parameters generates. The page is static (``static/``: HTML,
CSS and JavaScript, no build step, nothing fetched from elsewhere) and public, as llama-server's UI is.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from samplechain.server import prompts as pr
from samplechain.server import request as rq
from samplechain.server.limits import APIError, bad_request, context_error
from samplechain.server.responses import reply

STATIC_DIR = Path(__file__).parent / "static"
# the page's files, served at /static/<name> (and index.html at /)
_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}
PAGE_PATHS = ("/", "/index.html")
ASSET_PREFIX = "/static/"
MAX_N_TOP = 100
MAX_STEPS = 64  # a trace holds the engine between two of its steps: keep it short


def router(state: Any) -> APIRouter:
    """``POST /sampling/trace``, the page at ``/`` and its assets, over ``state``'s model and engine."""
    routes = APIRouter()
    config = state.config

    def static(name: str) -> Response:
        path = STATIC_DIR / name
        if name not in _assets() or not path.is_file():
            raise APIError(404, "File Not Found", "not_found_error")
        return Response(path.read_bytes(), media_type=_TYPES[path.suffix], headers={"Cache-Control": "no-cache"})

    @routes.get("/")
    @routes.get("/index.html")
    async def page() -> Response:
        return static("index.html")

    @routes.get(ASSET_PREFIX + "{name}")
    async def asset(name: str) -> Response:
        return static(name)

    @routes.post("/sampling/trace")
    async def sampling_trace(req: Request) -> Response:
        body = await rq.read_json(req)
        model, engine = state.model, state.engine
        try:  # templates, tokenizing and the grammar's check off the event loop
            tokens, params, sampler = await asyncio.to_thread(_prompt_and_params, state, body)
            n_top = rq.int_field(body, ("n_top",), 10, 1, MAX_N_TOP)
            steps = rq.int_field(body, ("steps",), 1, 1, MAX_STEPS)
            generated = _token_ids(body.get("generated"), model.config.n_vocab)
            last_only = rq.bool_field(body, "last_step_only", False)
        except ValueError as e:
            raise bad_request(str(e)) from None
        n_ctx = engine.n_ctx_slot
        n_needed = len(tokens) + len(generated) + steps
        if n_needed > n_ctx:
            raise context_error(f"{len(tokens) + len(generated)} tokens and {steps} steps", n_ctx,
                                n_prompt_tokens=len(tokens))

        def run() -> Any:  # on the engine thread
            from samplechain.trace import TraceContext, trace

            ctx = engine.trace_context  # the engine's (it goes with the engine when the model sleeps)
            if ctx is None:
                ctx = engine.trace_context = TraceContext(model, n_ctx, n_batch=config.n_batch)
            return trace(model, tokens, params, n_top=n_top, steps=steps, generated=generated, context=ctx,
                         sampler=sampler, last_only=last_only)

        try:
            result = await asyncio.wrap_future(engine.call(run))
        except ValueError as e:  # a token the grammar refuses, a chain that selects nothing
            raise bad_request(str(e)) from None
        out = result.to_dict()
        out["model"] = state.model_id
        out["n_ctx"] = n_ctx
        out["prompt"] = b"".join(map(model.vocab.token_bytes, tokens)).decode("utf-8", "replace")  # specials shown
        return reply(out)

    return routes


def _assets() -> frozenset[str]:
    return frozenset(p.name for p in STATIC_DIR.iterdir() if p.suffix in _TYPES)


def _prompt_and_params(state: Any, body: dict[str, Any]) -> tuple[list[int], Any, Any]:
    """The prompt's tokens (``prompt`` as in /completion, or ``messages`` as in /v1/chat/completions), the
    sampling parameters over the server's defaults and their sampler (the grammar compiled within its budget);
    bad fields raise the server's 400s."""
    model = state.model
    if body.get("messages") is not None:
        if body.get("prompt") is not None:
            raise bad_request("use one of \"prompt\" and \"messages\"")
        from samplechain.runtime.chat import starts_with_bos

        text, generation_prompt = pr.chat_prompt(model, body, state.engine.n_ctx_slot)
        fields = {**body, **rq.response_format(body)}
        if generation_prompt and "generation_prompt" not in body:
            fields["generation_prompt"] = generation_prompt
        pr.check_length(model, len(text), state.engine.n_ctx_slot)
        tokens = model.tokenize(text, add_special=not starts_with_bos(model.vocab, text))
    else:
        prompts = pr.prompts(model, body, state.engine.n_ctx_slot)
        if len(prompts) != 1:
            raise bad_request("a trace takes one prompt")
        tokens, fields = prompts[0], body
    if not tokens:
        raise bad_request("the prompt is empty")
    params = rq.parse_sampling(fields, state.config.defaults)
    return tokens, params, rq.samplers([params], model)[0]


def _token_ids(value: Any, n_vocab: int) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise bad_request("Field 'generated': must be an array of token ids")
    if any(not 0 <= t < n_vocab for t in value):
        raise bad_request(f"Field 'generated': token ids must be in [0, {n_vocab})")
    return value
