"""Tool calls per chat format: a seeded batch of requests with ``tool_choice: "required"`` through the ``openai``
client against ``samplechain serve`` (in process, SmolLM2's weights), and how many answers parse into calls whose
arguments validate against their tool's schema (``jsonschema``). The lazy / required grammar from the tools' schemas
is what makes this 100 %: SmolLM2 was never trained on any of these formats.

Formats: generic (SmolLM2's own template), Hermes 2 Pro (Qwen 2.5's template), Llama 3.x (Llama 3.1's) and Mistral
Nemo (Nemo's): the real templates from llama.cpp's ``models/templates`` (``tests/fixtures/templates``) over
SmolLM2's weights. Run: ``python -m benchmarks.bench_tool_calls [--requests 50]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import time
from pathlib import Path

import jsonschema
import openai

from samplechain.runtime import load_model
from samplechain.server.app import BackgroundServer, ServerConfig

TEMPLATES = Path(__file__).parent.parent / "tests" / "fixtures" / "templates"
FORMATS = {  # name -> template file (None: the model's own)
    "Generic": None,
    "Hermes 2 Pro": "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Llama 3.x": "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "Mistral Nemo": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
}
TOOLS = [
    {"type": "function", "function": {"name": "get_current_weather", "description": "Get the current weather",
                                      "parameters": {"type": "object", "properties": {
                                          "location": {"type": "string", "description": "City and country"},
                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                          "required": ["location", "unit"]}}},
    {"type": "function", "function": {"name": "search_flights", "description": "Find flights",
                                      "parameters": {"type": "object", "properties": {
                                          "from": {"type": "string", "minLength": 3, "maxLength": 3},
                                          "to": {"type": "string", "minLength": 3, "maxLength": 3},
                                          "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
                                          "flexible": {"type": "boolean"}},
                                          "required": ["from", "to", "passengers"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTIONS = ["What is the weather in Paris?", "Find me a flight from Berlin to Rome for two people.",
             "Is it cold in Oslo today?", "I need to fly from JFK to LAX."]


def with_template(model, name: str | None):
    if name is None:
        return model
    vocab = copy.copy(model.vocab)
    vocab.chat_template = (TEMPLATES / name).read_text()
    out = copy.copy(model)
    out.vocab = vocab
    return out


def one(client: openai.OpenAI, seed: int) -> tuple[bool, bool, bool]:
    """(parsed into at least one call, every call's arguments valid for its tool, cut by ``max_tokens``). One call
    per answer: with parallel calls a model this small keeps calling until ``max_tokens`` cuts the last call short,
    and a cut answer is all content (as in llama.cpp); a cut answer is counted apart (the grammar did not fail)."""
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": QUESTIONS[seed % 4]}],
                                       tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=96, seed=seed, temperature=1.0)
    calls = r.choices[0].message.tool_calls or []
    if r.choices[0].finish_reason != "tool_calls" or not calls:
        return False, False, r.choices[0].finish_reason == "length"
    try:
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    except (ValueError, KeyError, jsonschema.ValidationError):
        return True, False, False
    return True, True, False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=50, help="seeded requests per format")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated formats")
    args = ap.parse_args()
    model = load_model()
    print("| format | template | requests | parsed | schema-valid | cut by max_tokens | s |\n"
          "|---|---|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        template = FORMATS[fmt]
        with BackgroundServer(ServerConfig(port=0, n_slots=4, n_ctx=8192), with_template(model, template)) as s:
            client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            one(client, -1)  # compiles the grammar once (later requests find it cached), not counted
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                results = list(pool.map(one, [client] * args.requests, range(args.requests)))
            dt = time.perf_counter() - t0
        parsed, valid, cut = (sum(r[k] for r in results) for k in range(3))
        n = len(results)
        print(f"| {fmt} | {template or 'SmolLM2 (own)'} | {n} | {parsed} ({100 * parsed / n:.0f} %) | "
              f"{valid} ({100 * valid / n:.0f} %) | {cut} | {dt:.0f} |")


if __name__ == "__main__":
    main()
