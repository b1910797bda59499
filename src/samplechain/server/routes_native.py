"""llama-server's native API: ``/completion``, ``/tokenize``, ``/detokenize``, ``/apply-template``, and the
server's own state: ``/health``, ``/props``, ``/slots`` (and a slot's cells saved to, restored from and erased into
``--slot-save-path``), ``/metrics``, and the web UI's public files (llama-server's routes: tools/server/server.cpp)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from samplechain.runtime.decoding import Rules
from samplechain.runtime.events import Event, Final, Progress, Token
from samplechain.runtime.state import StateError, load_seq_state, save_seq_state
from samplechain.server import limits
from samplechain.server import prompts as pr
from samplechain.server import request as rq
from samplechain.server import responses as rs
from samplechain.server.describe import props_body
from samplechain.server.infill import fim_tokens, infill_body
from samplechain.server.jobs import prepare_completion
from samplechain.server.limits import APIError, bad_request
from samplechain.server.metrics import render as render_metrics
from samplechain.server.request import Options
from samplechain.server.responses import reply
from samplechain.server.run import Run, sse_stream

if TYPE_CHECKING:
    from samplechain.server.engine import Engine, Slot
    from samplechain.server.state import ServerState

# llama-server's web UI is a PWA: a browser asks for these on its own, without the API key. Here: a service worker
# that unregisters itself (samplechain's page registers none; a browser that ran llama-server's UI on this address
# keeps its worker, and would go on showing that UI), the page's manifest and its version file.
UI_FILES = ("/sw.js", "/manifest.webmanifest", "/_app/version.json")
_SW_REMOVE = """
self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (e) => e.waitUntil((async () => {
    await self.registration.unregister();
    for (const key of await caches.keys()) await caches.delete(key);
    for (const c of await self.clients.matchAll({ type: 'window' })) c.navigate(c.url);
})()));
"""
_MANIFEST = {"name": "samplechain", "short_name": "samplechain", "start_url": "/", "display": "standalone"}


def router(state: ServerState) -> APIRouter:
    """The native routes over ``state``'s model and engine."""
    routes = APIRouter()
    config = state.config

    @routes.get("/health")
    @routes.get("/v1/health")
    async def health() -> Response:
        return reply({"status": "ok"})

    @routes.get("/props")
    async def props() -> Response:
        with state.loaded() as awake:  # sleeping: as it was on entering sleep (llama-server's cached props)
            return reply(props_body(state, False) if awake else state.snapshots["props"])

    @routes.post("/props")
    async def set_props() -> Response:
        if not config.props:
            raise APIError(501, "This server does not support changing global properties. Start it with `--props`",
                           "not_supported_error")
        return reply({"success": True})

    @routes.post("/tokenize")
    async def tokenize(req: Request) -> Response:
        body = await rq.read_json(req)
        content = body.get("content")
        if content is None:
            return reply({"tokens": []})
        add_special = body.get("add_special", False)
        parse_special = body.get("parse_special", True)
        if not isinstance(add_special, bool) or not isinstance(parse_special, bool):
            raise bad_request("add_special and parse_special must be true or false")
        parts = [content] if isinstance(content, str) else content if isinstance(content, list) else []
        n_chars = sum(len(p) for p in parts if isinstance(p, str))
        if n_chars > limits.MAX_TOKENIZE_CHARS:
            raise bad_request(f"Field 'content': at most {limits.MAX_TOKENIZE_CHARS} characters, got {n_chars}")
        if isinstance(content, str):
            tokens = await asyncio.to_thread(state.model.tokenize, content, add_special=add_special,
                                             parse_special=parse_special)
        else:
            tokens = await asyncio.to_thread(pr.tokenize_mixed, state.model, content, add_special)
        if body.get("with_pieces"):
            pieces = []
            for t in tokens:
                data = state.model.vocab.token_bytes(t)
                try:
                    piece: Any = data.decode("utf-8")
                except UnicodeDecodeError:
                    piece = list(data)
                pieces.append({"id": t, "piece": piece})
            return reply({"tokens": pieces})
        return reply({"tokens": tokens})

    @routes.post("/detokenize")
    async def detokenize(req: Request) -> Response:
        body = await rq.read_json(req)
        tokens = body.get("tokens") or []
        n_vocab = state.model.config.n_vocab
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise bad_request("'tokens' must be an array of token ids")
        if any(not 0 <= t < n_vocab for t in tokens):
            raise bad_request(f"token ids must be in [0, {n_vocab})")
        data = b"".join(state.model.vocab.token_bytes(t) for t in tokens)
        return reply({"content": data.decode("utf-8", "replace")})

    @routes.post("/apply-template")
    async def apply_template(req: Request) -> Response:
        body = await rq.read_json(req)
        try:
            prompt, _ = await asyncio.to_thread(pr.chat_prompt, state.model, body)
        except ValueError as e:
            raise bad_request(str(e)) from None
        return reply({"prompt": prompt})

    @routes.get("/slots")
    async def slots(req: Request) -> Response:
        if not config.slots:
            raise APIError(501, "This server does not support slots endpoint. Start it with `--slots`",
                           "not_supported_error")
        eng = state.running_engine
        if req.query_params.get("fail_on_no_slot") in ("1", "true") and all(s.busy for s in eng.slots):
            raise APIError(503, "no slot available", "unavailable_error")
        out = []
        for s in eng.slots:
            running, last = s.info()  # read once: the engine thread may release the slot meanwhile
            d: dict[str, Any] = {"id": s.id, "n_ctx": s.n_ctx, "speculative": eng.speculation is not None,
                                 "is_processing": running}
            if last is not None:
                d.update({k: last[k] for k in ("id_task", "n_prompt_tokens", "n_prompt_tokens_processed",
                                               "n_prompt_tokens_cache")})
                d["params"] = rs.settings(last["params"], Options(Rules(n_predict=last["n_predict"])))
                d["next_token"] = [{"has_next_token": running,
                                    "has_new_line": running and last["has_new_line"],
                                    "n_remain": last["n_remain"],
                                    "n_decoded": last["n_decoded"]}]
            out.append(d)
        return reply(out)

    @routes.post("/slots/{id_slot}")
    async def slot_action(id_slot: str, req: Request) -> Response:
        if config.slot_save_path is None:
            raise APIError(501, "This server does not support slots action. Start it with `--slot-save-path`",
                           "not_supported_error")
        eng = state.running_engine
        try:
            sid = int(id_slot)
        except ValueError:
            raise bad_request("Invalid slot ID") from None
        action = req.query_params.get("action")
        if action not in ("save", "restore", "erase"):
            raise bad_request("Invalid action")
        filename = ""
        if action != "erase":
            name = (await rq.read_json(req)).get("filename")
            if not isinstance(name, str):
                raise bad_request("Field 'filename': a file name (a string) is required")
            if not valid_filename(name):
                raise bad_request("Invalid filename")
            filename = name
        if not 0 <= sid < len(eng.slots):
            raise bad_request("Invalid slot ID")
        path = os.path.join(config.slot_save_path, filename)
        act = {"save": _save, "restore": _restore, "erase": _erase}[action]
        return reply(await asyncio.wrap_future(eng.call_on_slot(sid, lambda slot: act(eng, slot, path, filename))))

    @routes.get("/sw.js")
    async def service_worker() -> Response:
        return Response(_SW_REMOVE, media_type="application/javascript", headers={"Cache-Control": "no-cache"})

    @routes.get("/manifest.webmanifest")
    async def manifest() -> Response:
        return Response(json.dumps(_MANIFEST), media_type="application/manifest+json",
                        headers={"Cache-Control": "no-cache"})

    @routes.get("/_app/version.json")
    async def ui_version() -> Response:
        return Response(json.dumps({"version": rs.BUILD_INFO}), media_type="application/json",
                        headers={"Cache-Control": "no-cache"})

    @routes.get("/metrics")
    async def metrics() -> Response:
        if not config.metrics:
            raise APIError(501, "This server does not support metrics endpoint. Start it with `--metrics`",
                           "not_supported_error")
        with state.loaded() as awake:
            if awake:
                eng = state.running_engine
                m = eng.metrics
                text = render_metrics(m, sum(s.busy for s in eng.slots), eng.n_deferred)
            else:  # sleeping: the counters as the last scrape awake saw them; the window is reported once
                m = state.sleep_metrics
                text = render_metrics(m, 0, 0)
                state.scraped_asleep = True
            m.reset_window()
        return Response(text, media_type="text/plain; version=0.0.4",
                        headers={"Process-Start-Time-Unix": str(int(state.started))})

    @routes.post("/completion")
    @routes.post("/completions")
    async def completion(req: Request) -> Response:
        return await complete(req, await rq.read_json(req))

    @routes.post("/infill")
    async def infill(req: Request) -> Response:
        fim = fim_tokens(state.model)  # a model without FIM tokens: 501, whatever the body
        return await complete(req, await asyncio.to_thread(infill_body, state, fim, await rq.read_json(req)))

    async def complete(req: Request, body: dict[str, Any]) -> Response:
        """A native completion's answer (``/completion``; ``/infill`` with its prompt built)."""
        params, opts, todo = await asyncio.to_thread(prepare_completion, state, body)
        run = Run(state.running_engine, req.is_disconnected)
        for k, job in enumerate(todo):
            run.submit(job, opts, k)
        texts = [state.model.vocab.detokenize(job.tokens) for job in todo]
        eog = tuple(sorted(state.model.vocab.eog))
        model_id = state.model_id
        if not opts.stream:
            finals = await run.finals()
            outs = [rs.native_final(f, model=model_id, prompt_text=texts[k], params=params, opts=opts, eog=eog,
                                    index=k) for k, f in enumerate(finals)]
            return reply(outs[0] if len(outs) == 1 else outs)
        await run.started()

        def frames(index: int, ev: Event) -> list[Any]:
            match ev:
                case Progress():
                    return [rs.native_progress(ev, opts, index)]
                case Token():
                    return [rs.native_event(ev, params, opts, index)]
                case Final():
                    return [rs.native_final(ev, model=model_id, prompt_text=texts[index], params=params, opts=opts,
                                            eog=eog, index=index, streamed=True)]
            return []
        return sse_stream(run, frames)

    return routes


# --- a slot's cells in a file: run on the engine thread, between two steps, once the slot is idle -----------------


def _save(eng: Engine, slot: Slot, path: str, filename: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    tokens = list(slot.seq.tokens)
    try:
        n_bytes = save_seq_state(path, eng.ctx.transformer, eng.ctx.kv, slot.id, tokens)
    except OSError as e:
        raise APIError(500, f"Unable to save slot: {e.strerror}", "server_error") from None
    return {"id_slot": slot.id, "filename": filename, "n_saved": len(tokens), "n_written": n_bytes,
            "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}


def _restore(eng: Engine, slot: Slot, path: str, filename: str) -> dict[str, Any]:
    """The file's cells become the slot's (its cached prompt); a file that does not load leaves the slot empty."""
    t0 = time.perf_counter()
    slot.seq.clear()
    try:
        tokens, n_bytes = load_seq_state(path, eng.ctx.transformer, eng.ctx.kv, slot.id)
        if len(tokens) > slot.n_ctx:
            raise StateError(f"{path}: restored prompt does not fit in the slot context")
    except StateError as e:
        slot.seq.clear()
        # the client named the file: the server's folder is no business of its
        raise bad_request(f"Unable to restore slot: {str(e).replace(path, filename)}") from None
    slot.seq.appended(tokens)
    return {"id_slot": slot.id, "filename": filename, "n_restored": len(tokens), "n_read": n_bytes,
            "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}


def _erase(eng: Engine, slot: Slot, path: str, filename: str) -> dict[str, Any]:
    n_erased = len(slot.seq.tokens)
    slot.seq.clear()
    return {"id_slot": slot.id, "n_erased": n_erased}


def valid_filename(name: str) -> bool:
    """A file name a client may give (``/slots`` save and restore), as llama.cpp's ``fs_validate_filename``: one
    path component of 1 to 255 bytes, no control or reserved characters (``/ \\ : * ? " < > |`` and their
    look-alikes), no leading or trailing space, no trailing dot, no ``..``."""
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate
        return False
    if not 0 < size <= 255 or name == "." or ".." in name or name[0] == " " or name[-1] in " .":
        return False
    for ch in name:
        c = ord(ch)
        if (c <= 0x1F or c == 0x7F or 0x80 <= c <= 0x9F or c in (0xFF0E, 0x2215, 0x2216, 0xFFFD, 0xFEFF)
                or 0xD800 <= c <= 0xDFFF or ch in ':*?"<>|/\\'):
            return False
    return True
