"""The sampler chain visualizer: ``POST /sampling/trace`` against a live server, and the page at ``/`` in a real
browser (Debian's chromium driven by playwright, headless, on loopback; ``make test`` installs both)."""

import json
import os
import shutil
from pathlib import Path

import pytest
from tests.server.conftest import call, live_server

PROMPT = "The three most useful things to know about the ocean are"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "build" / "test-artifacts"  # build/ is git-ignored


def trace(server, body):
    return call(server, "POST", "/sampling/trace", body)


# --- the API ---------------------------------------------------------------------------------------------------


def test_trace_selects_the_tokens_a_completion_generates(server):
    body = {"prompt": PROMPT, "seed": 7, "temperature": 0.9}
    r = trace(server, {**body, "steps": 5, "n_top": 4})
    assert r.status == 200
    out = r.json()
    done = call(server, "POST", "/completion", {**body, "n_predict": 5, "return_tokens": True}).json()
    assert out["tokens"] == done["tokens"]
    assert [s["token"] for s in out["steps"]] == out["tokens"]
    assert out["chain"] == "logits -> top-k -> top-p -> min-p -> temp-ext -> dist"
    assert (out["model"], out["n_ctx"], out["n_prompt_tokens"], out["prompt"]) == ("smol", 256, 11, PROMPT)
    first = out["steps"][0]
    assert [s["name"] for s in first["stages"]] == ["logits", "top-k", "top-p", "min-p", "temp-ext", "dist"]
    logits, top_k = first["stages"][:2]
    assert (logits["size"], top_k["size"], top_k["params"], top_k["effect"]) == (49152, 40, {"k": 40}, "filter")
    assert all(len(s["top"]) == 4 for s in first["stages"])
    assert first["stages"][-1]["selected"] == first["token"]
    row = logits["top"][0]
    assert set(row) == {"id", "piece", "logit", "prob", "rank"} and row["rank"] == 0
    # the tokenizer's piece of each id
    pieces = call(server, "POST", "/tokenize", {"content": PROMPT, "with_pieces": True}).json()["tokens"]
    assert len(pieces) == 11
    detok = call(server, "POST", "/detokenize", {"tokens": [row["id"]]}).json()["content"]
    assert row["piece"] == detok


def test_trace_of_chat_messages_and_generated_tokens(server):
    messages = [{"role": "user", "content": "Name a colour."}]
    chat = trace(server, {"messages": messages, "seed": 3, "top_k": 5, "n_top": 10}).json()
    template = call(server, "POST", "/apply-template", {"messages": messages}).json()["prompt"]
    assert chat["prompt"] == template
    top_k = chat["steps"][0]["stages"][1]
    assert top_k["name"] == "top-k" and top_k["size"] == 5 and len(top_k["top"]) == 5
    # tokens given as generated continue the text: the next logits are a two-step trace's second ones (the draw
    # is not: random draws start again from the seed in each request)
    two = trace(server, {"prompt": PROMPT, "seed": 1, "steps": 2}).json()
    later = trace(server, {"prompt": PROMPT, "seed": 1, "generated": two["tokens"][:1]}).json()
    assert later["n_prompt_tokens"] == 11
    assert later["steps"][0]["stages"][0]["top"] == two["steps"][1]["stages"][0]["top"]


def test_trace_mirostat_and_grammar(server):
    miro = trace(server, {"prompt": PROMPT, "seed": 2, "mirostat": 2, "n_top": 3}).json()
    assert [s["name"] for s in miro["steps"][0]["stages"]] == ["logits", "temp", "mirostat-v2"]
    gram = trace(server, {"prompt": "I have", "seed": 2, "grammar": 'root ::= " " [0-9]+', "steps": 3}).json()
    text = call(server, "POST", "/detokenize", {"tokens": gram["tokens"]}).json()["content"]
    assert text[0] == " " and text[1:].isdigit()
    done = call(server, "POST", "/completion", {"prompt": "I have", "seed": 2, "grammar": 'root ::= " " [0-9]+',
                                                "n_predict": 3, "return_tokens": True}).json()
    assert done["tokens"][:len(gram["tokens"])] == gram["tokens"]


@pytest.mark.parametrize("body, message", [
    ({"prompt": PROMPT, "top_k": "many"}, "Field 'top_k'"),
    ({"prompt": PROMPT, "n_top": 0}, "Field 'n_top': Value must be between 1 <= value <= 100, but got 0"),
    ({"prompt": PROMPT, "n_top": 101}, "Field 'n_top': Value must be between 1 <= value <= 100, but got 101"),
    ({"prompt": PROMPT, "steps": 0}, "Field 'steps': Value must be between 1 <= value <= 64, but got 0"),
    ({"prompt": PROMPT, "steps": "two"}, "Field 'steps': expected an integer, got \"two\""),
    ({"prompt": PROMPT, "generated": [49152]}, "Field 'generated': token ids must be in [0, 49152)"),
    ({"prompt": PROMPT, "generated": "x"}, "Field 'generated': must be an array of token ids"),
    ({"prompt": PROMPT, "samplers": ["top_q"]}, "Field 'samplers'"),
    ({"prompt": PROMPT, "grammar": "root ::= ("}, "Failed to initialize samplers"),
    ({"prompt": PROMPT, "messages": [{"role": "user", "content": "x"}]}, 'use one of "prompt" and "messages"'),
    ({}, '"prompt" is required'),
    ({"prompt": ""}, "the prompt is empty"),
    ({"prompt": ["a", "b"]}, "a trace takes one prompt"),
    ({"prompt": "1 2", "grammar": "root ::= [a-z]+", "generated": [33]}, "the grammar refuses token 33 (b'1') here"),
])
def test_trace_bad_parameters_are_400(server, body, message):
    r = trace(server, body)
    assert r.status == 400, r.body
    error = r.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert message in error["message"]


def test_trace_beyond_the_context_is_400(server):
    r = trace(server, {"prompt": PROMPT, "steps": 64, "generated": [30] * 190})
    assert r.status == 400
    assert r.json() == {"error": {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 11,
                                  "n_ctx": 256, "message": "request (201 tokens and 64 steps) exceeds the available "
                                                           "context size (256 tokens), try increasing it"}}


def test_page_and_assets_are_public_and_the_trace_is_not(smol):
    with live_server(smol, n_slots=1, n_ctx=256, api_keys=("secret",)) as s:
        for path, ctype in (("/", "text/html"), ("/index.html", "text/html"),
                            ("/static/visualizer.js", "text/javascript"), ("/static/visualizer.css", "text/css")):
            r = call(s, "GET", path)
            assert r.status == 200 and r.headers["content-type"].startswith(ctype), path
        assert call(s, "GET", "/static/missing.js").status == 404
        assert call(s, "GET", "/static/..%2Fapp.py").status == 404
        assert call(s, "POST", "/sampling/trace", {"prompt": "Hi"}).status == 401
        assert call(s, "GET", "/props").status == 401
        r = call(s, "POST", "/sampling/trace", {"prompt": "Hi"}, headers={"Authorization": "Bearer secret"})
        assert r.status == 200 and len(r.json()["tokens"]) == 1


def test_page_loads_nothing_from_elsewhere():
    static = ROOT / "src" / "samplechain" / "server" / "static"
    assert sorted(p.name for p in static.iterdir()) == ["index.html", "visualizer.css", "visualizer.js"]
    for p in static.iterdir():
        text = p.read_text()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, p.name


# --- the page in a browser ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium, headless. Missing is a failure, not a skip: CI must run these tests."""
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(exe):
        pytest.fail("chromium is not installed: `make test` installs it (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


def test_page_traces_edits_and_steps(server, browser):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    requests = []  # every trace the page asked for, as they finished
    page.on("requestfinished", lambda req: requests.append(req) if req.url.endswith("/sampling/trace") else None)

    def traces():  # (request body, response body) of each
        return [(json.loads(req.post_data), req.response().json()) for req in requests]

    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    outside = []
    page.on("request", lambda req: None if req.url.startswith(server.url) else outside.append(req.url))
    page.goto(server.url + "/")

    stages = page.locator("#stages .stage")
    idle = page.locator("body[data-busy='0']")
    top_k_bars = page.locator(".stage[data-name='top-k'] .bar-row:not(.extra)")
    expect(stages).to_have_count(6, timeout=60_000)
    expect(idle).to_have_count(1, timeout=60_000)
    assert stages.evaluate_all("els => els.map(e => e.dataset.name)") == [
        "logits", "top-k", "top-p", "min-p", "temp-ext", "dist"]
    expect(top_k_bars).to_have_count(10)  # 40 candidates, 10 bars shown
    if os.environ.get("SAMPLECHAIN_UPDATE_DOCS"):  # the README's screenshot: SAMPLECHAIN_UPDATE_DOCS=1 pytest ...
        page.screenshot(path=str(ROOT / "docs" / "visualizer.png"), full_page=True)

    page.fill("#stage-top_k input[name='top_k']", "3")
    expect(top_k_bars).to_have_count(3, timeout=60_000)
    expect(idle).to_have_count(1, timeout=60_000)
    expect(page.locator(".stage[data-name='top-k'] .meta")).to_contain_text("k=3 · 3 candidates")
    body, first = traces()[-1]
    assert body["top_k"] == 3 and body["generated"] == [] and body["samplers"] == [
        "top_k", "top_p", "min_p", "temperature"]
    shown = page.locator(".stage[data-name='top-k'] .bar-row").evaluate_all("els => els.map(e => +e.dataset.id)")
    assert shown == [r["id"] for r in first["steps"][0]["stages"][1]["top"]]
    selected = page.locator(".stage[data-name='dist'] .bar-row.selected")
    expect(selected).to_have_count(1)
    assert selected.get_attribute("data-id") == str(first["tokens"][0])

    for n in (1, 2):
        page.click("#step")
        expect(page.locator("#generated .gen")).to_have_count(n, timeout=60_000)
        expect(idle).to_have_count(1, timeout=60_000)
    body, last = traces()[-1]
    steps = [t for b, t in traces() if b["top_k"] == 3]
    assert body["generated"] == [steps[0]["tokens"][0], steps[1]["tokens"][0]]
    ids = page.locator("#generated .gen").evaluate_all("els => els.map(e => +e.dataset.id)")
    assert ids == body["generated"]
    # the page shows what the API answers for the same request
    again = trace(server, body).json()
    assert again["tokens"] == last["tokens"]
    assert page.locator(".stage[data-name='dist'] .bar-row.selected").get_attribute("data-id") == str(
        last["tokens"][0])

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "visualizer.png"), full_page=True)
    assert (ARTIFACTS / "visualizer.png").stat().st_size > 10_000
    assert errors == [] and outside == []
    page.close()


def test_page_edits_the_chain(server, browser):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(server.url + "/")
    idle = page.locator("body[data-busy='0']")
    stages = page.locator("#stages .stage")
    expect(stages).to_have_count(6, timeout=60_000)
    names = "els => els.map(e => e.dataset.name)"
    # remove top-p, move min-p first, add xtc with a probability that makes it run
    page.locator("#stage-top_p button[title='remove']").click()
    page.locator("#stage-min_p button[title='move up']").click()
    page.select_option("#add-kind", "xtc")
    page.click("#add")
    page.fill("#stage-xtc input[name='xtc_probability']", "1")
    expect(page.locator("#chain .stage-editor")).to_have_count(4)
    assert page.locator("#chain .stage-editor").evaluate_all("els => els.map(e => e.dataset.kind)") == [
        "min_p", "top_k", "temperature", "xtc"]
    expect(stages).to_have_count(6, timeout=60_000)
    expect(idle).to_have_count(1, timeout=60_000)
    page.wait_for_function("document.querySelectorAll('#stages .stage')[1].dataset.name === 'min-p'")
    assert stages.evaluate_all(names) == ["logits", "min-p", "top-k", "temp-ext", "xtc", "dist"]
    assert page.locator("#chain-preview").inner_text() == "min-p → top-k → temp-ext → xtc → dist"
    # mirostat replaces the chain
    page.select_option("#mode", "2")
    page.wait_for_function("document.querySelectorAll('#stages .stage').length === 3")
    expect(idle).to_have_count(1, timeout=60_000)
    assert stages.evaluate_all(names) == ["logits", "temp", "mirostat-v2"]
    # a bad field is shown, not thrown
    page.click("details summary")
    page.fill("#extra", '{"top_k": "x"}')
    expect(page.locator("#status.error")).to_contain_text("Field 'top_k'", timeout=60_000)
    page.close()
