"""``samplechain serve`` as replicas on Ray Serve: each replica runs the server's engine (its own model, slots and
prompt cache) and the same HTTP API (llama-server's, OpenAI's, Anthropic's ``/v1/messages``, ``/v1/responses``);
a thin front deployment reads each body and sends a conversation to the replica holding its cache.

    from samplechain.integrations.ray_serve import RayOptions, start
    with start(ServerConfig(n_threads=1), RayOptions(replicas=2), port=8000) as app:
        ...  # app.url

or ``samplechain serve --ray --replicas 2 [--ray-address ADDR]``. Needs ``ray[serve]`` (``make test-ray`` installs
it in its own venv, .venv-ray). See docs/ray_serve.md for the affinity rule and what happens when a replica dies.

Without ``address`` a local Ray is started with every socket on loopback (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
and 127.0.0.1 as the node's address; the replicas' gRPC servers too, see ``ray_deployments``).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

APP_NAME = "samplechain"


@dataclass
class RayOptions:
    """The deployment's settings (Serve's names)."""

    replicas: int = 1  # engine replicas (ignored with autoscaling)
    autoscaling: dict[str, Any] | None = None  # Serve's autoscaling_config: min_replicas, max_replicas,
    #                                            target_ongoing_requests, upscale_delay_s, downscale_delay_s, ...
    max_ongoing_requests: int = 64  # per engine replica (the engine queues what its slots cannot take yet)
    health_check_period_s: float = 5.0  # Serve calls check_health this often: a dead engine thread is replaced
    health_check_timeout_s: float = 30.0
    graceful_shutdown_timeout_s: float | None = None  # None: the config's shutdown_grace
    replica_cpus: float = 1.0  # Ray CPUs reserved per engine replica
    replica_resources: dict[str, float] = field(default_factory=dict)  # e.g. {"GPU": 1} with --device cuda
    affinity_patience_s: float = 30.0  # a conversation waits this long for its busy replica, then spills over
    front_replicas: int = 1
    retries: int = 3  # a request no replica accepted yet (dead, unreachable) goes to another, this many times
    start_timeout_s: float = 120.0  # a request no replica accepted in this time is answered 503
    load_timeout_s: float = 600.0  # a replica's model load


def build_app(config: Any, options: RayOptions | None = None) -> Any:
    """The Serve application: the front bound to the engine deployment (``serve.run`` it)."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from samplechain.integrations.ray_deployments import AffinityRouter, SamplechainEngine, SamplechainFront

    o = options or RayOptions()
    grace = config.shutdown_grace if o.graceful_shutdown_timeout_s is None else o.graceful_shutdown_timeout_s
    actor = {"num_cpus": o.replica_cpus, **({"resources": o.replica_resources} if o.replica_resources else {})}
    if "GPU" in o.replica_resources:
        actor = {"num_cpus": o.replica_cpus, "num_gpus": o.replica_resources["GPU"],
                 **({"resources": {k: v for k, v in o.replica_resources.items() if k != "GPU"}}
                    if len(o.replica_resources) > 1 else {})}
    scaling: dict[str, Any] = ({"autoscaling_config": o.autoscaling} if o.autoscaling
                               else {"num_replicas": o.replicas})
    engine = serve.deployment(
        SamplechainEngine, name="SamplechainEngine", max_ongoing_requests=o.max_ongoing_requests,
        health_check_period_s=o.health_check_period_s, health_check_timeout_s=o.health_check_timeout_s,
        graceful_shutdown_timeout_s=max(grace, 0.0), ray_actor_options=actor,
        request_router_config=RequestRouterConfig(request_router_class=AffinityRouter,
                                                  request_router_kwargs={"patience_s": o.affinity_patience_s}),
        **scaling)
    front = serve.deployment(SamplechainFront, name="SamplechainFront", num_replicas=o.front_replicas,
                             max_ongoing_requests=max(1000, o.max_ongoing_requests * 4),
                             ray_actor_options={"num_cpus": 0})
    return front.bind(engine.bind(config, o.load_timeout_s), o.retries, o.start_timeout_s)


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Connect to ``address`` (a cluster's head, ``auto``), or start a local Ray bound to loopback."""
    if address is None:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read when ray is imported: the node IP is loopback
    import ray

    if ray.is_initialized():
        return
    if address is not None:
        ray.init(address=address, log_to_driver=False)
        return
    ray.init(num_cpus=num_cpus or max(4, os.cpu_count() or 1), include_dashboard=False,
             _node_ip_address="127.0.0.1", log_to_driver=False)


class RayServer:
    """A running Serve application (``start``): ``url``, ``replicas()``, ``close()``."""

    def __init__(self, host: str, port: int, owns_ray: bool) -> None:
        self.host, self.port, self.owns_ray = host, port, owns_ray
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}"

    def replicas(self) -> list[dict[str, Any]]:
        """The engine replicas alive now (Serve's named actors), each as its ``/health`` says: ``replica`` (the id
        in ``X-Samplechain-Replica``), ``node``, ``pid``; a replica that does not answer is left out."""
        import json
        import urllib.request

        import ray

        prefix = f"{APP_NAME}#SamplechainEngine#"
        out = []
        for actor in ray.util.list_named_actors(all_namespaces=True):
            name = actor["name"] if isinstance(actor, dict) else actor
            if prefix not in name:
                continue
            rid = name.rsplit("#", 1)[-1]
            try:
                request = urllib.request.Request(self.url + "/health", headers={"X-Samplechain-Replica": rid})
                with urllib.request.urlopen(request, timeout=10) as r:
                    info = json.loads(r.read())
            except (OSError, ValueError):
                continue
            if info.get("replica") == rid:
                out.append({k: info[k] for k in ("replica", "node", "pid")})
        return sorted(out, key=lambda r: r["replica"])

    def close(self) -> None:
        from ray import serve

        serve.shutdown()
        if self.owns_ray:
            import ray

            ray.shutdown()

    def __enter__(self) -> RayServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start(config: Any, options: RayOptions | None = None, *, host: str | None = None, port: int | None = None,
          address: str | None = None, num_cpus: int | None = None, timeout_s: float = 600.0) -> RayServer:
    """Deploy on Ray Serve (a local loopback Ray unless ``address``) and wait until every replica runs; Serve's
    HTTP proxy listens on ``host:port`` (the config's by default)."""
    import ray
    from ray import serve

    owns = not ray.is_initialized() and address is None
    init_ray(address, num_cpus)  # nothing when already connected
    host = host or config.host.split(",")[0].strip()
    port = config.port if port is None else port
    serve.start(http_options={"host": host, "port": port, "request_timeout_s": float(config.timeout)})
    serve.run(build_app(config, options), name=APP_NAME, route_prefix="/", blocking=False)
    deadline = time.monotonic() + timeout_s
    while True:
        status = serve.status().applications.get(APP_NAME)
        if status is not None and status.status == "RUNNING":
            break
        if status is not None and status.status in ("DEPLOY_FAILED", "UNHEALTHY"):
            raise RuntimeError(f"the Serve application failed: {status.message}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Serve application did not start in {timeout_s:g} s")
        time.sleep(0.5)
    return RayServer(host, port, owns)


def serve_ray(config: Any, replicas: int, address: str | None = None, log_level: str = "warning") -> int:
    """``samplechain serve --ray``: deploy, then run until SIGTERM / SIGINT; Serve drains the replicas (running
    requests get ``shutdown_grace`` seconds) and the local Ray stops. Exit status 0, or 1 if it cannot start."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        print("samplechain serve: error: --ray needs ray[serve] (pip install 'ray[serve]'; make test-ray "
              "installs it in .venv-ray)", file=sys.stderr)
        return 1
    if config.n_threads is None:  # the replicas of one machine share its cores
        config = dataclasses.replace(config, n_threads=max(1, (os.cpu_count() or 1) // max(1, replicas)))
    stop = threading.Event()
    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in handled}
    try:
        init_ray(address)
        for sig in handled:  # again: ray.init installs a fatal-signal handler that aborts on SIGTERM
            signal.signal(sig, lambda *_: stop.set())
        app = start(config, RayOptions(replicas=replicas), address=address)
    except Exception as e:
        print(f"samplechain serve: error: {e}", file=sys.stderr)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _shutdown(address is None)
        return 1
    print(f"samplechain serve: listening on {app.url} (Ray Serve: {replicas} replicas of {config.n_slots} slots"
          f"{', cluster ' + address if address else ', local Ray on loopback'})", file=sys.stderr, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _shutdown(address is None)
    return 0


def _shutdown(owns_ray: bool) -> None:
    import ray
    from ray import serve

    try:
        if ray.is_initialized():
            serve.shutdown()
    finally:
        if owns_ray:
            ray.shutdown()
