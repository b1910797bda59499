"""Ray Serve (``samplechain serve --ray``) against a bare ``samplechain serve``, on this machine's cores.

1. Throughput: 16 concurrent chat requests (one client thread each, 64 tokens each, ignore_eos) on a bare server,
   Ray with 1 replica (all the cores), Ray with 1 replica of half the cores, and Ray with 2 replicas (the cores
   split between them). "vs 1 replica" compares with one replica of the same threads (the scaling of replicas:
   issue 34's floor, 2 replicas >= 1.4x); "vs bare" with the bare server on every core. The same split without Ray,
   two bare servers of half the cores against one (the requests alternated between them), is what the machine
   itself gives two replicas: the ceiling of Ray's figure.
2. Overhead: one short request at a time (1 token), median latency, bare vs Ray (proxy + front + handle hops).

    make bench-ray     (in .venv-ray; every request goes to 127.0.0.1)
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import argparse
import collections
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

CONCURRENT = 16
TOKENS = 64
SLOTS = 8
PROBES = 40


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def body(i: int, tokens: int) -> dict:
    return {"messages": [{"role": "system", "content": f"You are assistant {i}."},
                         {"role": "user", "content": f"Tell me about the number {i}."}],
            "max_tokens": tokens, "ignore_eos": True, "temperature": 0.8, "seed": i}


def throughput(*urls: str) -> tuple[float, float, collections.Counter]:
    """(tokens per second, wall seconds, requests per replica) for CONCURRENT requests at once (request i to
    ``urls[i % len(urls)]``: several bare servers split them evenly)."""
    def one(i: int) -> tuple[int, str]:
        url = urls[i % len(urls)]
        r = httpx.post(url + "/v1/chat/completions", json=body(i, TOKENS), timeout=600)
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"], r.headers.get("x-samplechain-replica", url[-5:])

    for k in range(len(urls)):
        one(1000 * len(urls) + k)  # warm each server
    start = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENT) as pool:
        got = list(pool.map(one, range(CONCURRENT)))
    wall = time.perf_counter() - start
    return sum(n for n, _ in got) / wall, wall, collections.Counter(r for _, r in got)


def latency(url: str) -> float:
    """Median seconds of a 1-token request, one at a time (the same prompt: a cached prefix each time)."""
    times = []
    for _ in range(PROBES + 2):
        t = time.perf_counter()
        httpx.post(url + "/v1/chat/completions", json=body(0, 1), timeout=120).raise_for_status()
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def bare(threads: int, servers: int = 1) -> tuple[tuple, float]:
    """``servers`` bare ``samplechain serve`` processes of ``threads`` threads each (the requests split evenly):
    one is the anchor; two of one thread each are what this machine gives two replicas without Ray."""
    procs, urls = [], []
    try:
        for _ in range(servers):
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, "-m", "samplechain", "serve", "--port", str(port), "-t",
                                           str(threads), "-np", str(SLOTS), "-c", str(SLOTS * 512)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(procs, urls, strict=True):
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(url + "/health", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the bare server did not start")
                time.sleep(0.5)
        return throughput(*urls), latency(urls[0])
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)


def on_ray(replicas: int, threads: int) -> tuple[tuple, float]:
    from ray import serve

    from samplechain.integrations.ray_serve import RayOptions, start
    from samplechain.server.config import ServerConfig

    config = ServerConfig(n_threads=threads, n_slots=SLOTS, n_ctx=SLOTS * 512)
    app = start(config, RayOptions(replicas=replicas, replica_cpus=1), host="127.0.0.1", port=free_port())
    try:
        return throughput(app.url), latency(app.url)
    finally:
        serve.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="cores for the model, in all")
    args = parser.parse_args()
    import ray

    from samplechain.integrations.ray_serve import init_ray

    rows = []
    (tps, wall, _), lat = bare(args.threads)
    rows.append(("bare samplechain serve", args.threads, tps, wall, lat, "-"))
    half = max(1, args.threads // 2)
    for servers in (1, 2):  # the machine's own scaling from one to two servers, without Ray
        (tps, wall, split), lat = bare(half, servers)
        rows.append((f"{servers} bare server{'s' * (servers > 1)}", half, tps, wall, lat,
                     "/".join(str(n) for _, n in sorted(split.items())) if servers > 1 else "-"))
    init_ray(num_cpus=4)
    try:
        for replicas, threads in ((1, args.threads), (1, half), (2, half)):
            (tps, wall, split), lat = on_ray(replicas, threads)
            rows.append((f"Ray Serve, {replicas} replica{'s' * (replicas > 1)}", threads, tps, wall, lat,
                         "/".join(str(n) for _, n in sorted(split.items()))))
    finally:
        ray.shutdown()
    base_tps, base_lat = rows[0][2], rows[0][4]
    one = {threads: tps for name, threads, tps, *_ in rows[1:] if "1 replica" in name}
    one_bare = {threads: tps for name, threads, tps, *_ in rows if name == "1 bare server"}
    print(f"\n{CONCURRENT} concurrent chat requests x {TOKENS} tokens (one client thread each), {SLOTS} slots per "
          f"server, {os.cpu_count()} cores; latency: median of {PROBES} one-token requests one at a time\n")
    print("| setup | threads/replica | tokens/s | wall s | vs bare | vs 1 replica (bare: vs 1 server) | "
          "1-token latency ms | "
          "overhead ms | requests per replica |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, threads, tps, wall, lat, split in rows:
        base = one_bare if "bare server" in name else one
        vs_one = f"{tps / base[threads]:.2f}x" if threads in base and name != rows[0][0] else "-"
        print(f"| {name} | {threads} | {tps:.1f} | {wall:.2f} | {tps / base_tps:.2f}x | {vs_one} | "
              f"{lat * 1000:.1f} | {(lat - base_lat) * 1000:+.1f} | {split} |")


if __name__ == "__main__":
    main()
