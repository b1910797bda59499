"""Ray Serve tests (``make test-ray``, in .venv-ray): a local Ray with every socket on loopback, torn down at the end
of each module. Only traffic to 127.0.0.1; every wait is bounded."""

from __future__ import annotations

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before ray is imported: the node's address is 127.0.0.1

import ipaddress
import re
import socket
import subprocess

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(root: int) -> set[int]:
    """``root`` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


def listeners(pids: set[int]) -> list[tuple[str, int]]:
    """(local address, pid) of every listening TCP socket of ``pids``, from ``ss -ltnpH``."""
    out = []
    for line in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines():
        fields = line.split()
        local = fields[3]
        for pid in re.findall(r"pid=(\d+)", line):
            if int(pid) in pids:
                out.append((local, int(pid)))
    return out


def on_loopback(local: str) -> bool:
    host = local.rsplit(":", 1)[0].strip("[]")
    if host.startswith("::ffff:"):
        host = host[len("::ffff:"):]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", "0.0.0.0" and names are not loopback


@pytest.fixture(scope="module")
def cluster():
    """2 replicas of SmolLM2 (1 thread, 5 slots of 1024 cells each), /metrics on."""
    from samplechain.integrations.ray_serve import RayOptions, start
    from samplechain.server.config import ServerConfig

    config = ServerConfig(n_threads=1, n_slots=5, n_ctx=5120, metrics=True, shutdown_grace=2.0)
    app = start(config, RayOptions(replicas=2, health_check_period_s=2.0, health_check_timeout_s=20.0),
                host="127.0.0.1", port=free_port(), num_cpus=4, timeout_s=300)
    try:
        yield app
    finally:
        app.close()
