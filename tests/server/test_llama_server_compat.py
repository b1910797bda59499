"""What llama-server's own test suite (tools/server/tests/unit) expects of the server's surface: header names as it
spells them, progress timings, idle slots, slot save / restore / erase, token counting, the UI's public files, a
unified KV pool, several listen addresses, chat templates by name or source, ``--verbose`` and ``--reasoning``."""

import socket

from tests.server.conftest import call, live_server

from samplechain.runtime.chat import starts_with_bos
from samplechain.server.config import Defaults
from samplechain.server.routes_native import valid_filename

CHAT = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


def _raw_head(port: int, request: bytes) -> list[bytes]:
    """The response head's header lines, as the bytes came off the socket."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]


def test_header_names_go_out_in_llama_servers_spelling(server):
    lines = _raw_head(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nOrigin: http://localhost:3000\r\n"
                                   b"Connection: close\r\n\r\n")
    names = [line.split(b":", 1)[0] for line in lines]
    assert sorted(names) == [b"Access-Control-Allow-Origin", b"Connection", b"Content-Length", b"Content-Type",
                             b"Date", b"Process-Start-Time-Unix", b"Server", b"Vary"]
    streamed = _raw_head(server.port, b'POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
                                      b'Content-Length: 44\r\nConnection: close\r\n\r\n'
                                      b'{"prompt": "Hi", "n_predict": 1, "stream": 1}')
    # a 400 (stream must be true or false): its head is spelled the same way
    assert [line.split(b":", 1)[0] for line in streamed] == [b"Date", b"Content-Length", b"Content-Type",
                                                             b"Vary", b"Server", b"Connection"]


def test_progress_chunks_carry_timings_zeros_first(smol):
    prompt = "the quick brown fox jumps over the lazy dog " * 4
    with live_server(smol, n_slots=1, n_ctx=256, n_batch=16) as s:
        events = call(s, "POST", "/completion", {"prompt": prompt, "n_predict": 2, "stream": True,
                                                 "timings_per_token": True, "return_progress": True}).events()
        chat = call(s, "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "stream": True,
                                                        "timings_per_token": True, "return_progress": True}).events()
    progress = [e for e in events if "prompt_progress" in e]
    n_prompt = progress[0]["prompt_progress"]["total"]
    assert len(progress) == 1 + -(-n_prompt // 16)
    assert progress[0]["timings"] == {"cache_n": 0, "prompt_n": 0, "prompt_ms": 0.0, "prompt_per_token_ms": 0.0,
                                      "prompt_per_second": 0.0, "predicted_n": 0, "predicted_ms": 0.0,
                                      "predicted_per_token_ms": 0.0, "predicted_per_second": 0.0}
    for e in progress[1:]:
        t, p = e["timings"], e["prompt_progress"]
        assert t["prompt_n"] == p["processed"] - p["cache"] and t["predicted_n"] == 0 and t["predicted_ms"] == 0.0
        assert abs(t["prompt_ms"] - p["time_ms"]) < 1e-6 and t["prompt_ms"] > 0
    assert [e["timings"]["prompt_n"] for e in progress] == sorted(e["timings"]["prompt_n"] for e in progress)
    assert progress[-1]["timings"]["prompt_n"] == n_prompt
    chat_progress = [c for c in chat if isinstance(c, dict) and "prompt_progress" in c]
    assert chat_progress[0]["timings"]["prompt_n"] == 0 and chat_progress[-1]["timings"]["prompt_n"] > 0


def test_an_idle_slot_shows_no_budget_and_nothing_decoded(smol):
    with live_server(smol, n_slots=1, n_ctx=256) as s:
        r = call(s, "POST", "/completion", {"prompt": "Hello there", "n_predict": 5, "seed": 1,
                                            "ignore_eos": True}).json()
        slot = call(s, "GET", "/slots").json()[0]
    assert slot["is_processing"] is False and slot["params"]["n_predict"] == 5
    assert slot["next_token"] == [{"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}]
    assert slot["n_prompt_tokens"] == r["tokens_evaluated"] + 5 - 1  # the cells it holds
    assert (slot["n_prompt_tokens_processed"], slot["n_prompt_tokens_cache"]) == (0, 0)


def test_slot_save_restore_erase(smol, tmp_path):
    body = {"prompt": "What is the capital of France?", "n_predict": 8, "temperature": 0, "cache_prompt": True,
            "ignore_eos": True}
    with live_server(smol, n_slots=2, n_ctx=512, slot_save_path=str(tmp_path)) as s:
        first = call(s, "POST", "/completion", {**body, "id_slot": 1}).json()
        n_prompt, n_held = first["tokens_evaluated"], first["tokens_evaluated"] + first["tokens_predicted"] - 1
        saved = call(s, "POST", "/slots/1?action=save", {"filename": "slot1.bin"}).json()
        assert saved["id_slot"] == 1 and saved["filename"] == "slot1.bin" and saved["n_saved"] == n_held
        assert saved["n_written"] == (tmp_path / "slot1.bin").stat().st_size and saved["timings"]["save_ms"] > 0
        restored = call(s, "POST", "/slots/0?action=restore", {"filename": "slot1.bin"}).json()
        assert (restored["n_restored"], restored["n_read"]) == (saved["n_saved"], saved["n_written"])
        again = call(s, "POST", "/completion", {**body, "id_slot": 0}).json()
        assert again["content"] == first["content"]
        assert (again["timings"]["cache_n"], again["timings"]["prompt_n"]) == (n_prompt - 1, 1)
        assert call(s, "POST", "/slots/0?action=erase").json() == {"id_slot": 0, "n_erased": n_held}
        fresh = call(s, "POST", "/completion", {**body, "id_slot": 0}).json()
        assert (fresh["timings"]["cache_n"], fresh["timings"]["prompt_n"]) == (0, n_prompt)
        for path, payload, message in [
            ("/slots/0?action=save", {"filename": "../escape.bin"}, "Invalid filename"),
            ("/slots/0?action=save", {"filename": "a/b.bin"}, "Invalid filename"),
            ("/slots/0?action=save", {}, "Field 'filename': a file name (a string) is required"),
            ("/slots/7?action=save", {"filename": "x.bin"}, "Invalid slot ID"),
            ("/slots/x?action=erase", None, "Invalid slot ID"),
            ("/slots/0?action=copy", None, "Invalid action"),
            ("/slots/0?action=restore", {"filename": "missing.bin"},
             "Unable to restore slot: missing.bin: cannot read state file: No such file or directory"),
        ]:
            r = call(s, "POST", path, payload)
            assert (r.status, r.json()["error"]["message"]) == (400, message)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["slot1.bin"]


def test_slot_actions_need_a_save_path(server):
    r = call(server, "POST", "/slots/0?action=erase")
    assert r.status == 501 and r.json()["error"] == {
        "code": 501, "message": "This server does not support slots action. Start it with `--slot-save-path`",
        "type": "not_supported_error"}


def test_filenames_as_llama_cpp_validates_them():
    assert all(valid_filename(n) for n in ("slot1.bin", "a b.bin", "é.bin", ".hidden"))
    assert not any(valid_filename(n) for n in ("", ".", "..", "a..b", "a/b", "a\\b", "c:d", "x?", "a.", " a", "a ",
                                               "a\x00b", "a\u2215b", "x" * 256))


def test_chat_input_tokens(server, smol):
    r = call(server, "POST", "/chat/completions/input_tokens", {"messages": CHAT})
    text = smol.apply_chat_template(CHAT)
    n = len(smol.tokenize(text, add_special=not starts_with_bos(smol.vocab, text)))
    assert r.json() == {"input_tokens": n, "object": "response.input_tokens"} and n > 5
    assert call(server, "POST", "/v1/chat/completions/input_tokens", {"messages": CHAT}).json()["input_tokens"] == n
    assert call(server, "POST", "/v1/chat/completions/input_tokens", {"messages": 3}).status == 400


def test_ui_public_files_and_no_ui(smol):
    with live_server(smol, n_slots=1, n_ctx=256, api_keys=("sk-k",)) as s:
        for path in ("/", "/sw.js", "/manifest.webmanifest", "/_app/version.json"):
            assert call(s, "GET", path).status == 200, path
        assert call(s, "GET", "/sw.js").headers["content-type"] == "application/javascript"
        assert call(s, "GET", "/_app/version.json").json() == {"version": "b1-samplechain"}
        assert call(s, "GET", "/v1/models").status == 401
    with live_server(smol, n_slots=1, n_ctx=256, ui=False) as s:
        assert [call(s, "GET", p).status for p in ("/", "/index.html", "/manifest.webmanifest", "/sw.js")] == [
            404, 404, 404, 200]
        assert call(s, "GET", "/v1/models").status == 200


def test_unified_kv_pool_and_tags(smol):
    with live_server(smol, n_slots=2, n_ctx=64, kv_unified=True, alias=("b", "a"), tags=("x", "chat")) as s:
        assert [x["n_ctx"] for x in call(s, "GET", "/slots").json()] == [64, 64]
        model = call(s, "GET", "/v1/models").json()["data"][0]
        assert (model["id"], model["aliases"], model["tags"]) == ("a", ["a", "b"], ["chat", "x"])
        first = call(s, "POST", "/completion", {"prompt": "1 2 3 4 5 6 7 8 9 10", "n_predict": 10, "id_slot": 0,
                                                "ignore_eos": True}).json()
        held = first["tokens_evaluated"] + 10 - 1
        assert call(s, "GET", "/slots").json()[0]["n_prompt_tokens"] == held
        # slot 1 needs more than the pool has left: the idle slot 0 gives its cells up
        second = call(s, "POST", "/completion", {"prompt": "a b c d e f g h i j k l m n o p", "n_predict": 64 - held,
                                                 "id_slot": 1, "ignore_eos": True})
        assert second.status == 200 and second.json()["tokens_predicted"] == 64 - held
        assert call(s, "GET", "/slots").json()[0]["n_prompt_tokens"] == 0


def test_several_listen_addresses(smol):
    with live_server(smol, n_slots=1, n_ctx=256, host="127.0.0.1,127.0.0.2") as s:
        ports = {sock.getsockname() for sock in s.http.sockets}
        assert ports == {("127.0.0.1", s.port), ("127.0.0.2", s.port)}
        for host in ("127.0.0.1", "127.0.0.2"):
            with socket.create_connection((host, s.port), timeout=60) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert sock.recv(64).startswith(b"HTTP/1.1 200 OK\r\n")


def test_builtin_template_by_name_without_jinja(smol):
    with live_server(smol, n_slots=1, n_ctx=256, chat_template="command-r", use_jinja=False) as s:
        r = call(s, "POST", "/apply-template", {"messages": [{"role": "system", "content": "You are a test."},
                                                             {"role": "user", "content": "Hi there"}]}).json()
    assert r["prompt"] == ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
                           "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
                           "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    with live_server(smol, n_slots=1, n_ctx=256, use_jinja=False) as s:  # SmolLM2's template detected as ChatML
        r = call(s, "POST", "/apply-template", {"messages": [{"role": "user", "content": "Hi"}]}).json()
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        no_tools = call(s, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                             "tools": [tool]})
        no_choice = call(s, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                              "tool_choice": "required"})
    assert r["prompt"] == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert (no_tools.status, no_tools.json()["error"]["message"]) == (400, "tools param requires --jinja flag")
    assert (no_choice.status, no_choice.json()["error"]["message"]) == (
        400, "tool_choice param requires --jinja flag")


def test_jinja_template_reasoning_default_and_verbose(smol):
    template = "{{ 'T' if enable_thinking else 'F' }}{{ messages[-1]['content'] }}"
    with live_server(smol, n_slots=1, n_ctx=256, chat_template=template, enable_thinking=False,
                     defaults=Defaults(verbose=True)) as s:
        msgs = [{"role": "user", "content": "Hi"}]
        assert call(s, "POST", "/apply-template", {"messages": msgs}).json()["prompt"] == "FHi"
        on = {"messages": msgs, "chat_template_kwargs": {"enable_thinking": True}}
        assert call(s, "POST", "/apply-template", on).json()["prompt"] == "THi"
        r = call(s, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 1}).json()
        assert r["__verbose"]["prompt"] == "FHi"
        r = call(s, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "verbose": False}).json()
        assert "__verbose" not in r
    assert smol.vocab.chat_template != template  # the shared model is not changed


def test_templates_may_break_and_continue_loops(smol):
    """``{% break %}`` / ``{% continue %}`` parse, as in llama.cpp's engine (Command R7B's template uses them)."""
    from samplechain.chat.template import render

    template = ("{% for m in messages %}{% if m['content'] == 'skip' %}{% continue %}{% endif %}"
                "{{ m['content'] }}{% if m['content'] == 'b' %}{% break %}{% endif %}{% endfor %}")
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "skip"},
            {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]
    assert render(template, smol.vocab, msgs, False) == "ab"
    # a string + an undefined or null value is the string, as llama.cpp's engine has it (firefunction v2's template)
    assert render("{{ 'x' + functions + 'y' }}{{ none + 'z' }}", smol.vocab, msgs, False) == "xyz"
