"""docker-compose.yml without Docker: its very commands, read from the file, run as processes.

No Docker engine runs on these machines, so this test starts each service's `command` with its
`environment` as the compose file gives them, changing only what a container network changes:
the `redis` host name becomes a private redis-server on a free loopback port, the published
ports become free ones, `0.0.0.0` becomes 127.0.0.1 and the volumes become temporary folders.
Each service's healthcheck, translated the same way, must pass; then a task runs end to end
through the MCP server and shows in Flower.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from mcp_celery.testing.jsonrpc import RawHttpClient
from mcp_celery.testing.processes import Process, free_port, wait_for
from tests.support.harness import ROOT

COMPOSE = ROOT / "docker-compose.yml"


class Topology:
    """The compose file's services, with the replacements a container network would have made."""

    def __init__(self, tmp: Path) -> None:
        self.spec = yaml.safe_load(COMPOSE.read_text())
        self.tmp = tmp
        self.redis_port = free_port()
        self.ports = {"8000": str(free_port()), "5555": str(free_port())}
        self.volumes = {"/data/logs": tmp / "logs", "/data/artifacts": tmp / "artifacts"}
        for folder in self.volumes.values():
            folder.mkdir()

    def service(self, name: str) -> dict[str, Any]:
        return dict(self.spec["services"][name])

    def text(self, value: str) -> str:
        value = value.replace("redis://redis:6379", f"redis://127.0.0.1:{self.redis_port}")
        value = value.replace("0.0.0.0", "127.0.0.1")
        for inside, outside in self.volumes.items():
            value = value.replace(inside, str(outside))
        for inside, outside in self.ports.items():
            value = value.replace(inside, outside)
        return value.replace("6379", str(self.redis_port))

    def command(self, name: str) -> list[str]:
        args = [self.text(str(a)) for a in self.service(name)["command"]]
        if name == "redis":  # the container's port and data folder
            args += ["--port", str(self.redis_port), "--bind", "127.0.0.1", "--dir", str(self.tmp)]
        return args

    def environment(self, name: str) -> dict[str, str]:
        env = dict(self.service(name).get("environment") or {})
        return {key: self.text(str(value)) for key, value in env.items()}

    def healthcheck(self, name: str) -> list[str]:
        test = self.service(name)["healthcheck"]["test"]
        assert test[0] == "CMD", test
        return [self.text(str(part)) for part in test[1:]]

    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['8000']}/mcp"

    def flower(self) -> str:
        return f"http://127.0.0.1:{self.ports['5555']}"


def healthy(command: list[str], env: dict[str, str]) -> bool:
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> Iterator[Topology]:
    if shutil.which("redis-cli") is None:
        pytest.fail("redis-cli is needed to run the compose file's redis healthcheck")
    topo = Topology(tmp_path_factory.mktemp("compose"))
    logs = topo.tmp / "process-logs"
    started: list[Process] = []
    base = {k: v for k, v in env.items() if not k.startswith(("CELERY_", "MCP_CELERY_"))}
    try:
        for name in ("redis", "worker", "mcp", "flower"):  # depends_on order
            service_env = {**base, **topo.environment(name)}
            proc = Process(topo.command(name), service_env, logs / f"{name}.log", cwd=ROOT)
            started.append(proc)
            check = topo.healthcheck(name)
            proc.wait_ready(lambda c=check, e=service_env: healthy(c, e), 90, f"the {name} healthcheck")
        yield topo
    finally:
        for proc in reversed(started):
            proc.stop()


def flower_hears_a_worker(topo: Topology) -> bool:
    """Whether Flower's event receiver has heard a worker's heartbeat (`status=true` reads its events state)."""
    with urllib.request.urlopen(f"{topo.flower()}/api/workers?status=true", timeout=5) as reply:
        return any(json.loads(reply.read()).values())


def flower_tasks(topo: Topology, tool: str) -> dict[str, Any]:
    query = urllib.request.quote(f'args:"[mcp tool {tool}]"')
    with urllib.request.urlopen(f"{topo.flower()}/api/tasks?search={query}", timeout=5) as reply:
        return dict(json.loads(reply.read()))


def test_the_compose_services_start_healthy_and_serve_a_task_end_to_end(topology: Topology) -> None:
    services = topology.spec["services"]
    assert set(services) == {"redis", "worker", "mcp", "flower"}
    assert all("healthcheck" in s for s in services.values())  # each one passed in the fixture
    assert "redis-data:/data" in services["redis"]["volumes"]
    store = redis.Redis(port=topology.redis_port)
    config = store.config_get("appendonly") | store.config_get("maxmemory-policy")
    assert config == {"appendonly": "yes", "maxmemory-policy": "noeviction"}  # what the issue asks of Redis
    store.close()
    # Flower's HTTP port answers (its healthcheck) before its event receiver is connected; a task
    # whose first events it missed has no arguments there, and the search below never finds it.
    wait_for(lambda: flower_hears_a_worker(topology), 30, 0.5, "Flower to hear the worker's heartbeat")
    client = RawHttpClient(topology.url())
    try:
        tools = {t["name"] for t in client.result("tools/list")["tools"]}
        assert {"slow_compute", "train", "count_words", "train_model"} <= tools, tools
        task_id = client.start("slow_compute", {"seconds": 1, "label": "compose"})
        done = client.wait(task_id, timeout=60)
    finally:
        client.close()
    assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "compose done after 1 s"
    seen = wait_for(
        lambda: (t := flower_tasks(topology, "slow_compute").get(task_id)) and t["state"] == "SUCCESS" and t,
        30,
        0.5,
        "Flower to show the task",
    )
    assert seen["name"].endswith("slow_compute")
