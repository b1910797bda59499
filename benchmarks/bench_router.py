"""Router mode under load: 3 models behind one router with room for 2, 24 concurrent requests over them.

The models are the packaged ones (SmolLM2-135M, Gemma-3-270M) and a third GGUF (``--third``, default the Qwen 2
fixture of the tests). First each model alone: its text for every request's seed and its child's resident memory
once loaded. Then the 24 requests at once (8 per model, every other one streamed, one client thread each) through
a router with ``--models-max 2``: every answer must equal its model's text alone; the loads, the stops (evictions)
and the children left are counted, and the memory of the children left is compared with those models' memory alone
(a stopped model's memory is gone with its process).

    python -m benchmarks.bench_router            (every request goes to 127.0.0.1)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx

from samplechain.runtime.generation import model_path
from samplechain.server.config import ServerConfig
from samplechain.server.router import RouterConfig
from samplechain.server.router_app import BackgroundRouter

ROOT = Path(__file__).resolve().parents[1]
CHILD = ("-np", "4", "-c", "2048", "-t", "1", "--log-level", "error")
REQUESTS = 24


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def ask(url: str, model: str, i: int, stream: bool) -> str:
    body = {"model": model, "prompt": f"Tell me about the number {i}.", "n_predict": 16, "temperature": 0.8,
            "seed": i, "stream": stream}
    r = httpx.post(url + "/completion", json=body, timeout=600)
    r.raise_for_status()
    if stream:
        return "".join(json.loads(line[6:])["content"] for line in r.text.splitlines() if line.startswith("data: "))
    return r.json()["content"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--third", default=str(ROOT / "tests" / "fixtures" / "models" / "qwen2-Q8_0.gguf"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, path in (("smollm2", model_path("smollm2")), ("gemma3-270m", model_path("gemma3-270m")),
                           ("third", args.third)):
            os.symlink(path, folder / f"{name}.gguf")
        names = ("smollm2", "gemma3-270m", "third")
        jobs = [(names[i % 3], i, i % 2 == 0) for i in range(REQUESTS)]
        alone: dict[tuple[str, int], str] = {}
        memory: dict[str, float] = {}
        load_s: dict[str, float] = {}
        with BackgroundRouter(RouterConfig(server=ServerConfig(port=0), models_dir=str(folder), cache=False,
                                           models_max=1, child_args=CHILD)) as r:
            for name in names:
                t = time.perf_counter()
                for model, i, stream in jobs:
                    if model == name:
                        alone[(model, i)] = ask(r.url, model, i, stream)
                load_s[name] = time.perf_counter() - t
                memory[name] = rss_mib(r.models.table[name].process.pid)
        with BackgroundRouter(RouterConfig(server=ServerConfig(port=0), models_dir=str(folder), cache=False,
                                           models_max=2, child_args=CHILD)) as r:
            router_before = rss_mib(os.getpid())
            t = time.perf_counter()
            with ThreadPoolExecutor(REQUESTS) as pool:
                got = list(pool.map(lambda j: ask(r.url, *j), jobs))
            wall = time.perf_counter() - t
            same = sum(g == alone[(m, i)] for (m, i, _), g in zip(jobs, got, strict=True))
            table = r.models.table
            left = [n for n in names if table[n].process is not None]
            left_mib = sum(rss_mib(table[n].process.pid) for n in left)
            print(f"\n{REQUESTS} concurrent requests (16 tokens, every other streamed) over 3 models, --models-max 2, "
                  f"{os.cpu_count()} cores, 1 thread per model\n")
            print("| model | loads | stops | left running | RSS alone MiB | alone: 8 requests in turn s |")
            print("|---|---|---|---|---|---|")
            for n in names:
                print(f"| {n} | {table[n].loads} | {table[n].stops} | {'yes' if n in left else 'no'} | "
                      f"{memory[n]:.0f} | {load_s[n]:.1f} |")
            print(f"\nanswers equal to the model's text alone: {same}/{REQUESTS}; wall {wall:.1f} s")
            print(f"children left: {len(left)}, RSS {left_mib:.0f} MiB against {sum(memory[n] for n in left):.0f} "
                  f"MiB for those models alone; the router process itself: {router_before:.0f} MiB (this benchmark's "
                  "own process, which runs the router in a thread)")


if __name__ == "__main__":
    main()
