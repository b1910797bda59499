"""The sampler chain visualizer: ``POST /sampling/trace`` against a live server, and the page at ``/`` in a real
browser (Debian's chromium driven by playwright, headless, on loopback; ``make test`` installs both)."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from tests.server.conftest import call, live_server

from samplechain.samplers import TopK
from samplechain.trace import LOGITS_ABOUT, NEIGHBOURS, _about

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


def test_trace_says_what_each_stage_removed_and_why(server):
    body = {"prompt": PROMPT, "seed": 42, "top_p": 0.9, "min_p": 0.1, "n_top": 5}
    out = trace(server, {**body, "steps": 3}).json()
    # the stages of the last step only: the same random stream, the same last step
    last = trace(server, {**body, "steps": 3, "last_step_only": True}).json()
    assert last["tokens"] == out["tokens"]
    assert [s["stages"] for s in last["steps"][:2]] == [[], []] and last["steps"][2] == out["steps"][2]
    stages = out["steps"][0]["stages"]
    logits, top_k, top_p, min_p, temp, dist = stages
    assert [s["scale"] for s in stages] == ["logit", "logit", "prob", "prob", "prob", "prob"]
    assert (logits["about"], top_k["about"]) == (LOGITS_ABOUT, _about(TopK))
    assert all(len(s["rows"]) <= 5 + 2 * NEIGHBOURS + 1 for s in stages)  # never the whole vocabulary
    assert (top_k["n_before"], top_k["removed"], top_k["cut"]) == (49152, 49112, {
        "kind": "top-k", "k": 40, "kth_rank": 39, "kth_id": top_k["rows"][-4]["id"],
        "kth_logit": top_k["rows"][-4]["logit"]})
    # the cut's neighbourhood: ranks [40 - 3, 40 + 3)
    assert [(r["rank"], r["kept"]) for r in top_k["rows"][-6:]] == [(37, True), (38, True), (39, True),
                                                                   (40, False), (41, False), (42, False)]
    cut = top_p["cut"]
    assert cut["p"] == float(np.float32(0.9)) and cut["cum_before_last"] < cut["p"] <= cut["cum_kept"]
    assert top_p["removed"] == 40 - cut["kept"] > 0
    assert [r["rank"] for r in top_p["rows"] if not r["kept"]] == list(range(cut["kept"], cut["kept"] + NEIGHBOURS))
    assert min_p["n_before"] == cut["kept"] and min_p["removed"] > 0
    thr = min_p["cut"]
    assert thr["threshold_prob"] == thr["top_prob"] * float(np.float32(0.1))
    assert all(r["kept"] == (r["logit_before"] >= thr["threshold_logit"]) for r in min_p["rows"])
    assert temp["cut"]["entropy_after"] < temp["cut"]["entropy_before"]  # t = 0.8 sharpens
    assert dist["selected"] == out["tokens"][0]


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
    ({"prompt": PROMPT, "last_step_only": "yes"}, "Field 'last_step_only': expected true or false, got \"yes\""),
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
                                                           "context size (256 tokens), try increasing it (serve -c "
                                                           "/ --ctx-size; each of the -np slots holds -c / -np)"}}


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


def open_page(server, browser):
    """The page, its trace requests as they finished and its errors; after the first trace."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    requests, errors, outside = [], [], []
    page.on("requestfinished", lambda req: requests.append(req) if req.url.endswith("/sampling/trace") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda req: None if req.url.startswith(server.url) else outside.append(req.url))
    page.goto(server.url + "/")
    expect(page.locator("#stages .stage")).to_have_count(6, timeout=60_000)
    wait_idle(page)
    return page, requests, errors, outside


def wait_idle(page):
    from playwright.sync_api import expect

    page.wait_for_timeout(250)  # past the edit's debounce
    expect(page.locator("body[data-busy='0']")).to_have_count(1, timeout=60_000)


def traces(requests):
    """(request body, response body) of each trace the page asked for."""
    return [(json.loads(req.post_data), req.response().json()) for req in requests]


def texts(locator, attr=None):
    js = f"els => els.map(e => e.getAttribute('{attr}'))" if attr else "els => els.map(e => e.textContent)"
    return locator.evaluate_all(js)


def test_page_traces_edits_and_steps(server, browser):
    from playwright.sync_api import expect

    page, requests, errors, outside = open_page(server, browser)
    stages = page.locator("#stages .stage")
    assert stages.evaluate_all("els => els.map(e => e.dataset.name)") == [
        "logits", "top-k", "top-p", "min-p", "temp-ext", "dist"]
    # the logits card shows logits, each card says what its sampler does (the server's sentence)
    body, first = traces(requests)[-1]
    logits = first["steps"][0]["stages"][0]
    card = page.locator(".stage[data-name='logits']")
    assert card.get_attribute("data-scale") == "logit"
    assert texts(card.locator(".bar-row .value")) == [f"{r['logit']:.2f}" for r in logits["rows"]]
    assert texts(page.locator(".stage .about")) == [s["about"] for s in first["steps"][0]["stages"]]
    if os.environ.get("SAMPLECHAIN_UPDATE_DOCS"):  # the README's screenshot: SAMPLECHAIN_UPDATE_DOCS=1 pytest ...
        page.screenshot(path=str(ROOT / "docs" / "visualizer.png"), full_page=True)

    page.fill("#stage-top_k input[name='top_k']", "3")
    wait_idle(page)
    top_k = page.locator(".stage[data-name='top-k']")
    expect(top_k.locator(".bar-row.kept")).to_have_count(3)
    expect(top_k.locator(".meta")).to_contain_text("k=3 · 3 candidates")
    body, first = traces(requests)[-1]
    assert body["top_k"] == 3 and (body["steps"], body["last_step_only"]) == (1, True) and body["samplers"] == [
        "top_k", "top_p", "min_p", "temperature"]
    rows = first["steps"][0]["stages"][1]["rows"]
    assert [int(i) for i in texts(top_k.locator(".bar-row"), "data-id")] == [r["id"] for r in rows]
    assert top_k.locator(".bar-row.kth").get_attribute("data-rank") == "2"  # the k-th token, marked
    selected = page.locator(".stage[data-name='dist'] .bar-row.selected")
    expect(selected).to_have_count(1)
    assert selected.get_attribute("data-id") == str(first["tokens"][0])

    # busy: a click disables Trace, Step and Reset and shows the indicator until the answer; a second click on
    # the disabled Step sends nothing
    n = len(requests)
    state = page.evaluate("""() => {
        const step = document.querySelector('#step');
        step.click();
        const s = [step.disabled, document.querySelector('#trace').disabled, document.querySelector('#reset').disabled,
                   !document.querySelector('#busy').hidden, document.body.dataset.busy];
        step.click();
        return s;
    }""")
    assert state == [True, True, True, True, "1"]
    wait_idle(page)
    assert len(requests) == n + 1 and traces(requests)[-1][0]["steps"] == 2
    assert page.locator("#busy").is_hidden() and page.locator("#step").is_enabled()

    # Step continues one random stream: after N steps the page's tokens are a (N + 1)-step trace's
    for steps in (3, 4):
        page.click("#step")
        expect(page.locator("#generated .gen")).to_have_count(steps - 1, timeout=60_000)
        wait_idle(page)
    body, last = traces(requests)[-1]
    assert (body["steps"], body["last_step_only"]) == (4, True) and "generated" not in body
    full = trace(server, {**body, "last_step_only": False}).json()
    ids = [int(i) for i in texts(page.locator("#generated .gen"), "data-id")]
    assert ids == full["tokens"][:3] and last["tokens"] == full["tokens"]
    assert last["steps"][3] == full["steps"][3]
    assert page.locator(".stage[data-name='dist'] .bar-row.selected").get_attribute("data-id") == str(
        full["tokens"][3])
    page.click("#reset")
    expect(page.locator("#generated .gen")).to_have_count(0, timeout=60_000)
    wait_idle(page)

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "visualizer.png"), full_page=True)
    assert (ARTIFACTS / "visualizer.png").stat().st_size > 10_000
    assert errors == [] and outside == []
    page.close()


def test_page_draws_the_cuts(server, browser):
    """top-p's removed tokens and its threshold on the running sum, min-p's threshold relative to the top token,
    the penalties' changed logits: drawn from the trace the page asked for."""
    from playwright.sync_api import expect

    page, requests, errors, _ = open_page(server, browser)
    page.fill("#stage-top_p input[name='top_p']", "0.9")
    page.fill("#stage-min_p input[name='min_p']", "0.1")
    wait_idle(page)
    body, out = traces(requests)[-1]
    assert (body["top_p"], body["min_p"]) == (0.9, 0.1)
    stages = {s["name"]: s for s in out["steps"][0]["stages"]}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    top_p, card = stages["top-p"], page.locator(".stage[data-name='top-p']")
    removed = [r["id"] for r in top_p["rows"] if not r["kept"]]
    assert removed and [int(i) for i in texts(card.locator(".bar-row.removed"), "data-id")] == removed
    assert [int(i) for i in texts(card.locator(".bar-row.kept"), "data-id")] == [
        r["id"] for r in top_p["rows"] if r["kept"]]
    assert card.locator(".bar-row.removed .piece").first.evaluate(
        "e => getComputedStyle(e).textDecorationLine") == "line-through"
    assert texts(card.locator(".bar-row .cum")) == [f"{r['cum']:.3f}" for r in top_p["rows"]]
    line = card.locator("svg.cumulative line.threshold")
    assert float(line.get_attribute("data-value")) == top_p["cut"]["p"]
    y = float(line.get_attribute("y1"))  # 70 px high, 4 px padding: y = 66 - 62 p
    assert abs(y - (66 - 62 * top_p["cut"]["p"])) < 1e-6
    assert texts(card.locator("svg.cumulative circle.removed"), "data-id") == [str(i) for i in removed]
    expect(card.locator(".cut")).to_contain_text(f"{top_p['cut']['kept']} kept · {top_p['removed']} removed")
    expect(card.locator(".why")).to_contain_text(f"p = 0.9 at #{top_p['cut']['kept']}")
    card.screenshot(path=str(ARTIFACTS / "visualizer-top-p.png"))

    min_p, card = stages["min-p"], page.locator(".stage[data-name='min-p']")
    removed = [r["id"] for r in min_p["rows"] if not r["kept"]]
    assert removed and [int(i) for i in texts(card.locator(".bar-row.removed"), "data-id")] == removed
    assert float(card.locator(".threshold").get_attribute("data-value")) == min_p["cut"]["threshold_prob"]
    # the threshold's tick in every bar's track, at its share of the widest bar
    widest = max(max(r["prob_before"], r["prob"]) for r in min_p["rows"])
    left = f"{100 * min_p['cut']['threshold_prob'] / widest:.2f}%"
    assert set(card.locator(".bar-row .tick").evaluate_all("els => els.map(e => e.style.left)")) == {left}
    card.screenshot(path=str(ARTIFACTS / "visualizer-min-p.png"))

    # penalties first: the prompt's tokens get other logits, shown before -> after
    page.select_option("#add-kind", "penalties")
    page.click("#add")
    for _ in range(4):
        page.locator("#stage-penalties button[title='move up']").click()
    page.fill("#stage-penalties input[name='repeat_penalty']", "1.5")
    page.fill("#stage-penalties input[name='presence_penalty']", "0.5")
    wait_idle(page)
    body, out = traces(requests)[-1]
    assert body["samplers"][0] == "penalties"
    penalties = out["steps"][0]["stages"][1]
    assert penalties["name"] == "penalties" and penalties["changed"] > 0
    card = page.locator(".stage[data-name='penalties']")
    assert card.get_attribute("data-scale") == "logit"
    changed = [r for r in penalties["rows"] if r["logit"] != r["logit_before"]]
    assert changed and texts(card.locator(".bar-row.changed .value")) == [
        f"{r['logit_before']:.2f} → {r['logit']:.2f}" for r in changed]
    card.screenshot(path=str(ARTIFACTS / "visualizer-penalties.png"))
    assert errors == []
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
