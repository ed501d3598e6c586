"""Process helpers: spare ports, subprocess start/stop by pid, readiness waits, a private Redis."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent  # the repository root
BENCH = ROOT / "bench"
LOGS = BENCH / ".logs"


def spare_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, deadline_s: float, proc: subprocess.Popen[Any] | None = None) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.pid} exited with {proc.returncode} before port {port} opened")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open within {deadline_s}s")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[Any]
    log: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the pid we started, then SIGKILL its own process group (created by us) if needed."""
        p = self.popen
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the session we created with start_new_session
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        # leftovers of our own process group (e.g. prefork children orphaned by a crash)
        try:
            os.killpg(p.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


MY_SESSIONS: set[int] = set()  # session ids of the processes we started (start_new_session: sid == pid)


class CpuProbe:
    """CPU used on the machine by processes that are not ours (other users of the shared cores)."""

    hz = os.sysconf("SC_CLK_TCK")
    ncpu = os.cpu_count() or 1

    @staticmethod
    def sample() -> tuple[float, int, int]:
        with open("/proc/stat") as fh:
            parts = fh.readline().split()[1:]
        v = [int(x) for x in parts]
        busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)  # user nice system irq softirq steal
        me, mine = os.getpid(), 0
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as fh:
                    st = fh.read()
            except OSError:
                continue
            f = st[st.rindex(")") + 2 :].split()
            if int(d) == me or int(f[3]) in MY_SESSIONS:
                mine += int(f[11]) + int(f[12])
        return time.monotonic(), busy, mine

    @classmethod
    def foreign(cls, a: tuple[float, int, int], b: tuple[float, int, int]) -> float:
        """Share of the machine's CPU capacity used by other processes between samples a and b."""
        wall = (b[0] - a[0]) * cls.hz * cls.ncpu
        return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / wall) if wall > 0 else 0.0


def start(name: str, argv: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> Proc:
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{name}.log"
    fh = open(log, "wb")
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env["PYTHONUNBUFFERED"] = "1"
    if env:
        full_env.update(env)
    popen = subprocess.Popen(
        argv,
        stdout=fh,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=full_env,
        cwd=str(cwd),
        start_new_session=True,
    )
    fh.close()
    MY_SESSIONS.add(popen.pid)
    return Proc(name, popen, log)


def redis_server_binary() -> str:
    # Prefer the Debian jemalloc build (what production Redis looks like); fall back to PATH.
    for cand in ("/usr/bin/redis-server",):
        if os.path.exists(cand):
            return cand
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("redis-server not found")
    return found


class BenchRedis:
    """A private redis-server on a spare loopback port, stopped by pid."""

    def __init__(self, name: str = "redis") -> None:
        self.name = name  # also the log file's name under bench/.logs
        self.port = spare_port()
        self.binary = redis_server_binary()
        self.proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = start(
            self.name,
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--maxmemory-policy",
                "noeviction",
                "--enable-debug-command",
                "local",
            ],
        )
        wait_port(self.port, 10, self.proc.popen)
        r = self.client()
        end = time.monotonic() + 10
        while True:
            try:
                r.ping()
                break
            except redis.exceptions.BusyLoadingError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, db=db, decode_responses=False)

    def stop(self) -> None:
        if self.proc:
            self.proc.stop()

    def flush(self) -> None:
        self.client().flushall()

    def settle(self, deadline_s: float = 90.0) -> float:
        """Wait until no keyspace dict of any db is still rehashing (after a bulk load). Returns seconds waited."""
        t0 = time.monotonic()
        r = self.client()
        dbs = [int(k[2:]) for k in r.info("keyspace") if k.startswith("db")]
        while time.monotonic() - t0 < deadline_s:
            try:
                busy = any(b"rehashing" in r.execute_command("DEBUG", "HTSTATS", db) for db in dbs)
            except redis.exceptions.ResponseError:
                time.sleep(5)
                return time.monotonic() - t0
            if not busy:
                return time.monotonic() - t0
            time.sleep(0.2)
        return time.monotonic() - t0

    def version(self) -> str:
        return str(self.client().info("server").get("redis_version"))


# Commands the bench itself issues for bookkeeping; excluded from counts.
BENCH_COMMANDS = {"info"}  # only INFO is issued by the bench inside a counting window


def commandstats(r: redis.Redis) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v in r.info("commandstats").items():
        name = k[len("cmdstat_") :] if k.startswith("cmdstat_") else k
        out[name] = int(v["calls"])
    return out


def cmd_delta(before: dict[str, int], after: dict[str, int], exclude: set[str] = BENCH_COMMANDS) -> dict[str, int]:
    d = {}
    for k, v in after.items():
        if k.split("|")[0] in exclude:
            continue
        diff = v - before.get(k, 0)
        if diff:
            d[k] = diff
    return d


def connections_received(r: redis.Redis) -> int:
    return int(r.info("stats").get("total_connections_received", 0))


def reads_processed(r: redis.Redis) -> int:
    return int(r.info("stats").get("total_reads_processed", 0))


def python_exe() -> str:
    return sys.executable
