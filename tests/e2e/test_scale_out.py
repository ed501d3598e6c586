"""Several server processes serve the same tasks: no task state lives in a server's memory.

Which `--workers 2` process served a request is read from the kernel, not guessed: the server end
of the test's one open connection belongs to exactly one of them (/proc/PID/fd and /proc/net/tcp).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest

from tests.support.harness import HttpClient, Process, live_processes, start_http_server, wait_for

T = TypeVar("T")
ESTABLISHED, LISTEN = "01", "0A"  # TCP states as /proc/net/tcp writes them


@pytest.fixture
def two_process_server(env: dict[str, str], worker: Process, logs: Path) -> Iterator[tuple[str, Process]]:
    url, server = start_http_server(env, logs / "http-two-workers.log", "--workers", "2")
    yield url, server
    server.stop()


def serving_processes(pid: int, port: int, count: int) -> list[int] | None:
    """The `count` children of server `pid` that accept connections on `port` (uvicorn's worker processes;
    multiprocessing's resource tracker is a child too), once they all do; else None."""
    kids = [kid for kid, _, parent, _ in live_processes() if parent == pid and (port, 0) in sockets(kid, LISTEN)]
    return kids if len(kids) == count else None


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def sockets(pid: int, state: str) -> set[tuple[int, int]]:
    """(local port, remote port) of the IPv4 TCP sockets in `state` that `pid` holds."""
    mine = socket_inodes(pid)
    pairs = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], int(fields[9])
        if inode in mine and fields[3] == state:
            pairs.add((int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)))
    return pairs


def serving_process(port: int, processes: list[int]) -> int:
    """Which of `processes` holds the server end of this test process's one open connection to `port`."""
    (client_port,) = [local for local, remote in sockets(os.getpid(), ESTABLISHED) if remote == port]
    (pid,) = [pid for pid in processes if (port, client_port) in sockets(pid, ESTABLISHED)]
    return pid


@pytest.mark.broker
def test_a_task_created_on_one_process_is_served_by_any(
    two_process_server: tuple[str, Process], client: HttpClient
) -> None:
    url, server = two_process_server
    port = urlsplit(url).port
    assert port is not None
    processes = wait_for(lambda: serving_processes(server.proc.pid, port, 2), 30, 0.05, "the two server processes")

    def on_a_new_connection(request: Callable[[HttpClient], T]) -> tuple[int, T]:
        """`request` on a connection of its own (the kernel hands it to either process), and who served it."""
        c = HttpClient(url)
        try:
            answer = request(c)
            return serving_process(port, processes), answer  # the kept-alive connection is still open
        finally:
            c.close()

    created: dict[int, list[str]] = {pid: [] for pid in processes}

    def each_process_created_one() -> bool:
        pid, task_id = on_a_new_connection(lambda c: c.start("echo", {"text": "spread"}))
        created[pid].append(task_id)
        return all(created.values())

    def read_by_another(task_id: str, creator: int) -> dict[str, Any] | None:
        pid, task = on_a_new_connection(lambda c: c.get(task_id))
        return task if pid != creator else None

    wait_for(each_process_created_one, 60, 0, "each server process to create a task")
    for creator, task_ids in created.items():
        for task_id in task_ids:
            # The single-process test server, a separate process again, reads them too.
            assert client.wait(task_id)["result"]["content"][0]["text"] == "spread"
        first = task_ids[0]
        task = wait_for(functools.partial(read_by_another, first, creator), 60, 0, f"another process to serve {first}")
        assert task["status"] == "completed" and task["result"]["content"][0]["text"] == "spread", task
