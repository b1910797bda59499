"""``samplechain serve --ray --replicas N``: the command line starts a local loopback Ray, serves, and stops on
SIGTERM (exit 0, its Ray gone)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests_ray.conftest import descendants, free_port, listeners, on_loopback


def test_replicas_and_ray_address_need_ray():
    r = subprocess.run([sys.executable, "-m", "samplechain", "serve", "--replicas", "2"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "--replicas / --ray-address need --ray" in r.stderr


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_serve_ray_from_the_command_line(tmp_path):
    port = free_port()
    log = open(tmp_path / "stderr.txt", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "samplechain", "serve", "--ray", "--replicas", "1", "--port",
                             str(port), "-t", "1", "-np", "2", "-c", "2048"],
                            stdout=subprocess.DEVNULL, stderr=log, text=True,
                            env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "not serving after 300 s"
            time.sleep(1)
        tree = descendants(proc.pid)
        mine = listeners(tree)
        assert any(local.endswith(f":{port}") for local, _ in mine)
        assert [s for s in mine if not on_loopback(s[0])] == []
        health = httpx.get(url + "/health", timeout=30).json()
        assert health["status"] == "ok" and health["node"] == "127.0.0.1"
        r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi."}],
                                                           "max_tokens": 4}, timeout=120)
        assert r.status_code == 200 and r.headers["x-samplechain-replica"] == health["replica"]
        assert r.json()["usage"]["completion_tokens"] >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
        err = (tmp_path / "stderr.txt").read_text()
        assert f"listening on {url} (Ray Serve: 1 replicas of 2 slots, local Ray on loopback)" in err
        deadline = time.monotonic() + 60
        while [p for p in tree if alive(p) and p != proc.pid] and time.monotonic() < deadline:
            time.sleep(0.5)
        left = [p for p in tree if alive(p) and p != proc.pid]
        assert left == [], "Ray's processes outlived the server"
    finally:
        log.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
            pytest.fail("the server did not stop")
