"""Tool calls per wire API and chat format: a seeded batch of requests that require a call, through each API's
official client against ``samplechain serve`` (in process, SmolLM2's weights), and how many answers parse into
calls whose arguments validate against their tool's schema (``jsonschema``). The lazy / required grammar from the
tools' schemas is what makes this 100 %: SmolLM2 was never trained on any of these formats.

APIs: OpenAI Chat Completions (``tool_choice: required``), Anthropic Messages (``tool_choice: any``) and OpenAI
Responses (``tool_choice: required``), each with parallel calls off, the same questions, seeds, temperature and
``max_tokens``: the three share the chat layer, so they differ only in their wire shapes. Formats: generic
(SmolLM2's own template) and every format with a template of its own in llama.cpp's ``models/templates`` (Hermes
2 Pro: Qwen 2.5's; Llama 3.x: Llama 3.1's; Mistral Nemo; DeepSeek R1 and V3.1; Qwen3-Coder; GPT-OSS; Command R7B;
Functionary v3.2; FireFunction v2), over SmolLM2's weights.
Run: ``python -m benchmarks.bench_tool_calls [--requests 20] [--apis chat,anthropic,responses] [--formats ...]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import time

import anthropic
import jsonschema
import openai
from tests.llama_tree import template_file

from samplechain.runtime import load_model
from samplechain.server.app import BackgroundServer, ServerConfig

FORMATS = {  # name -> llama.cpp's template (models/templates/<name>.jinja; None: the model's own)
    "Generic": None,
    "Hermes 2 Pro": "Qwen-Qwen2.5-7B-Instruct",
    "Llama 3.x": "meta-llama-Llama-3.1-8B-Instruct",
    "Mistral Nemo": "mistralai-Mistral-Nemo-Instruct-2407",
    "DeepSeek R1": "llama-cpp-deepseek-r1",
    "DeepSeek V3.1": "deepseek-ai-DeepSeek-V3.1",
    "Qwen3 Coder": "Qwen3-Coder",
    "GPT-OSS": "openai-gpt-oss-120b",
    "Command R7B": "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
    "Functionary v3.2": "meetkai-functionary-medium-v3.2",
    "FireFunction v2": "fireworks-ai-llama-3-firefunction-v2",
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
    vocab.chat_template = template_file(name).read_text()
    out = copy.copy(model)
    out.vocab = vocab
    return out


MAX_TOKENS, TEMPERATURE = 192, 1.0  # room for the multi-token markers of DeepSeek, GPT-OSS, ... in SmolLM2's vocabulary


def _valid(calls: list[tuple[str, object]]) -> bool:
    """Every call's arguments (a JSON text or an object) valid for its tool's schema."""
    try:
        for name, args in calls:
            jsonschema.validate(json.loads(args) if isinstance(args, str) else args, SCHEMAS[name])
    except (ValueError, KeyError, jsonschema.ValidationError):
        return False
    return True


def chat(url: str, seed: int) -> tuple[list[tuple[str, object]], bool, bool]:
    """(the calls, whether the answer ended for a call, whether ``max_tokens`` cut it) over Chat Completions."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": QUESTIONS[seed % 4]}],
                                       tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=MAX_TOKENS, seed=seed, temperature=TEMPERATURE)
    calls = [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls or []]
    return calls, r.choices[0].finish_reason == "tool_calls", r.choices[0].finish_reason == "length"


def messages(url: str, seed: int) -> tuple[list[tuple[str, object]], bool, bool]:
    """The same over Anthropic Messages (the ``anthropic`` client; ``tool_choice: any``)."""
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=300)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    # (this SDK's create() has no temperature argument: sent as a body field, which the server reads the same)
    r = client.messages.create(model="m", max_tokens=MAX_TOKENS, tools=tools,
                               tool_choice={"type": "any", "disable_parallel_tool_use": True},
                               messages=[{"role": "user", "content": QUESTIONS[seed % 4]}],
                               extra_body={"seed": seed, "temperature": TEMPERATURE})
    calls = [(b.name, b.input) for b in r.content if b.type == "tool_use"]
    return calls, r.stop_reason == "tool_use", r.stop_reason == "max_tokens"


def responses(url: str, seed: int) -> tuple[list[tuple[str, object]], bool, bool]:
    """The same over OpenAI Responses (``client.responses.create``)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    tools = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
              "parameters": t["function"]["parameters"], "strict": False} for t in TOOLS]
    r = client.responses.create(model="m", input=QUESTIONS[seed % 4], tools=tools, tool_choice="required",
                                parallel_tool_calls=False, max_output_tokens=MAX_TOKENS, temperature=TEMPERATURE,
                                extra_body={"seed": seed})
    calls = [(o.name, o.arguments) for o in r.output if o.type == "function_call"]
    return calls, bool(calls) and r.status == "completed", r.status == "incomplete"


APIS = {"chat": chat, "anthropic": messages, "responses": responses}


def one(api: str, url: str, seed: int) -> tuple[bool, bool, bool]:
    """(parsed into at least one call, every call's arguments valid for its tool, cut by ``max_tokens``). One call
    per answer: with parallel calls a model this small keeps calling until ``max_tokens`` cuts the last call short,
    and a cut answer is all content (as in llama.cpp); a cut answer is counted apart (the grammar did not fail)."""
    calls, ended_for_calls, cut = APIS[api](url, seed)
    if not ended_for_calls or not calls:
        return False, False, cut
    return True, _valid(calls), False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20, help="seeded requests per API and format")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated formats")
    ap.add_argument("--apis", default=",".join(APIS), help="comma-separated APIs: " + ", ".join(APIS))
    args = ap.parse_args()
    model = load_model()
    print("| API | format | template | requests | parsed | schema-valid of finished | cut by max_tokens | s |\n"
          "|---|---|---|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        template = FORMATS[fmt]
        with BackgroundServer(ServerConfig(port=0, n_slots=4, n_ctx=8192), with_template(model, template)) as s:
            for api in args.apis.split(","):
                one(api, s.url, -1)  # compiles the grammar once (later requests find it cached), not counted
                t0 = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(4) as pool:
                    results = list(pool.map(one, [api] * args.requests, [s.url] * args.requests,
                                            range(args.requests)))
                dt = time.perf_counter() - t0
                parsed, valid, cut = (sum(r[k] for r in results) for k in range(3))
                n = len(results)
                share = f"{100 * valid / parsed:.0f} %" if parsed else "-"
                print(f"| {api} | {fmt} | {template or 'SmolLM2 (own)'} | {n} | {parsed} ({100 * parsed / n:.0f} %) | "
                      f"{valid} ({share}) | {cut} | {dt:.0f} |", flush=True)


if __name__ == "__main__":
    main()
