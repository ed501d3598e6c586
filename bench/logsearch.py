"""python -m bench.logsearch [--size-gb 1]: the `log_search` tool against GNU grep on the same log.

Generates a realistic log (ISO timestamp, level, service, message) into a temporary directory
(deleted afterwards, never committed), starts a private redis-server, a prefork
`celery -A jobs worker` and `mcp-celery serve -A jobs --http`, then times, interleaved, for each
pattern: `grep -F -c` / `grep -E -c` on the file, and our tool from the `tools/call` to the
result, (a) as a task polled with `tasks/get` every POLL_S and (b) as a synchronous call (a client
without the tasks extension: the server answers when the job ends). The page cache is warmed
first, so both read the log from memory. `total_matches` must equal grep's count.
Prints a table and writes bench/results-logsearch.md. Run it with `nice -n 10`.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from bench.procs import BENCH, MY_SESSIONS, start, start_http_server
from bench.redis_tools import BenchRedis
from bench.rpc import parse, request
from jobs._logsearch import available_cpus
from mcp_celery.testing.processes import Process, free_port

POLL_S = 0.005
GOALS = {"literal": 1.5, "regex": 2.0}  # allowed time relative to grep -F -c / grep -E -c
CASES = [  # (kind, pattern, what it models)
    ("literal", "connection reset by peer", "a common message, ~10% of lines"),
    ("literal", "disk usage 99%", "a rare message, ~0.04% of lines"),
    ("regex", "ERROR .*timeout after [0-9]+", "a level then a message, ~0.7% of lines"),
    ("regex", "user=99[0-9]{4} logged in", "a range of user ids, ~0.1% of lines"),
]

LEVELS, LEVEL_WEIGHTS = ["DEBUG", "INFO ", "WARN ", "ERROR", "FATAL"], [20, 60, 12, 7, 1]
SERVICES = ["api", "auth", "billing", "search", "worker", "scheduler", "gateway", "storage"]
MESSAGES = [
    "GET /v1/orders/{n} 200 latency_ms={ms}",
    "POST /v1/payments 201 latency_ms={ms}",
    "cache miss key=user:{n}",
    "user={n} logged in from 10.{a}.{b}.{c}",
    "connection reset by peer host=db-{a} retry={b}",
    "upstream timeout after {ms} ms host=svc-{a}",
    "job {n} finished in {ms} ms",
    "disk usage {a}% on /dev/sd{b}",
    "slow query took {ms} ms: SELECT * FROM orders WHERE id={n}",
    "token refreshed for client {n}",
]


def generate_log(path: Path, size: int, seed: int = 1) -> int:
    """Write about `size` bytes of log lines, a few ms apart; returns the bytes written.

    Lines reuse 200,000 random bodies (level, service, message) behind fresh timestamps: that
    keeps generation under a minute per GB while the text stays varied for the searches."""
    rnd = random.Random(seed)
    bodies = []
    for _ in range(200_000):
        n, a = rnd.randrange(1_000_000), rnd.randrange(256)
        ms = int(rnd.expovariate(1 / 80))
        message = rnd.choice(MESSAGES).format(n=n, ms=ms, a=a, b=rnd.randrange(256), c=rnd.randrange(256))
        bodies.append(f" {rnd.choices(LEVELS, LEVEL_WEIGHTS)[0]} [{rnd.choice(SERVICES)}] {message}\n")
    clock = [f"{h:02d}:{m:02d}:{s:02d}" for h in range(24) for m in range(60) for s in range(60)]
    written, day, clock_ms = 0, datetime(2026, 11, 30, tzinfo=UTC), 0
    with path.open("w", buffering=1 << 20) as out:
        while written < size:
            date = day.strftime("%Y-%m-%d")
            lines = []
            for body, step in zip(rnd.choices(bodies, k=50_000), rnd.choices(range(1, 10), k=50_000), strict=True):
                clock_ms += step
                if clock_ms >= 86_400_000:
                    clock_ms, day = clock_ms - 86_400_000, day + timedelta(days=1)
                    date = day.strftime("%Y-%m-%d")
                second, ms = divmod(clock_ms, 1000)
                lines.append(f"{date}T{clock[second]}.{ms:03d}Z{body}")
            chunk = "".join(lines)
            out.write(chunk)
            written += len(chunk)
    return written


@dataclass
class Stack:
    redis: BenchRedis
    worker: Process
    server: Process
    url: str

    def stop(self) -> None:
        for proc in (self.server, self.worker):
            proc.stop()
        self.redis.stop()


def start_stack(log_root: Path) -> Stack:
    """A private Redis, `celery -A jobs worker` (prefork, 2 processes) and the HTTP server."""
    bench_redis = BenchRedis("logsearch-redis")
    bench_redis.start()
    env = {
        "CELERY_BROKER_URL": f"{bench_redis.url}/0",
        "CELERY_RESULT_BACKEND": f"{bench_redis.url}/1",
        "JOBS_LOG_ROOT": str(log_root),
        "MCP_CELERY_SYNC_TIMEOUT_S": "300",
        # One search at a time, as grep runs: it may use every CPU (the worker's default is CPUs / concurrency).
        "JOBS_LOG_SEARCH_PROCESSES": str(available_cpus()),
    }
    worker_args = ["-m", "celery", "-A", "jobs", "worker", "-P", "prefork", "-c", "2", "--without-gossip"]
    worker = start("logsearch-worker", [sys.executable, *worker_args, "--without-mingle", "-l", "INFO"], env)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    server_args = [sys.executable, "-m", "mcp_celery", "serve", "-A", "jobs", "--http", "--port", str(port)]
    server = start_http_server("logsearch-server", server_args, url, env)
    stack = Stack(bench_redis, worker, server, url)
    deadline = time.monotonic() + 60
    while "ready." not in worker.log.read_text(errors="replace"):
        if time.monotonic() > deadline or not worker.alive():
            stack.stop()
            raise RuntimeError(f"the worker did not start:\n{worker.tail()}")
        time.sleep(0.2)
    return stack


class Caller:
    """Our tool over Streamable HTTP, timed from the tools/call request to the result."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(timeout=httpx.Timeout(600.0))

    def rpc(self, method: str, params: dict[str, Any], name: str, declare: bool = True) -> dict[str, Any]:
        headers, body = request(method, params, name, declare)
        return parse(self.http.post(self.url, content=body, headers=headers))

    def as_task(self, args: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        started = time.perf_counter()
        created = self.rpc("tools/call", {"name": "log_search", "arguments": args}, "log_search")
        task_id = created["taskId"]
        while (task := self.rpc("tasks/get", {"taskId": task_id}, task_id))["status"] not in (
            "completed", "failed", "cancelled",
        ):  # fmt: skip
            time.sleep(POLL_S)
        elapsed = time.perf_counter() - started
        if task["status"] != "completed" or task["result"].get("isError"):
            raise RuntimeError(f"log_search did not complete: {task}")
        return elapsed, task["result"]["structuredContent"]

    def synchronous(self, args: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        started = time.perf_counter()
        result = self.rpc("tools/call", {"name": "log_search", "arguments": args}, "log_search", declare=False)
        elapsed = time.perf_counter() - started
        if result.get("isError"):
            raise RuntimeError(f"log_search failed: {result}")
        return elapsed, result["structuredContent"]


def run_grep(flag: str, pattern: str, path: Path) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run(["grep", flag, "-c", "--", pattern, str(path)], capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise RuntimeError(f"grep failed: {done.stderr}")
    return elapsed, int(done.stdout)


def cpu_sample() -> tuple[float, int, int]:
    """(time, busy ticks of the machine, ticks of our processes and their waited-for children).

    Unlike bench.procs.CpuProbe this counts children that have exited (grep, rg): their time
    moves into their parent's cutime/cstime, which would otherwise look like another user's."""
    busy = sum(int(v) for i, v in enumerate(Path("/proc/stat").read_text().split()[1:9]) if i not in (3, 4))
    mine = 0
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if entry.name == str(os.getpid()) or int(fields[3]) in MY_SESSIONS:
            mine += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return time.monotonic(), busy, mine


def foreign_share(before: tuple[float, int, int], after: tuple[float, int, int]) -> float:
    """Share of the machine's CPU capacity used by other processes between the two samples."""
    capacity = (after[0] - before[0]) * os.sysconf("SC_CLK_TCK") * (os.cpu_count() or 1)
    return max(0.0, ((after[1] - before[1]) - (after[2] - before[2])) / capacity) if capacity > 0 else 0.0


@dataclass
class Row:
    kind: str
    pattern: str
    about: str
    grep_s: list[float]
    task_s: list[float]
    sync_s: list[float]
    grep_count: int
    counts: set[int]

    def ratio(self, times: list[float]) -> float:
        return statistics.median(times) / statistics.median(self.grep_s)

    @property
    def verdict(self) -> str:
        ok = max(self.ratio(self.task_s), self.ratio(self.sync_s)) <= GOALS[self.kind]
        same = self.counts == {self.grep_count}
        return ("met" if ok else "MISSED") + ("" if same else f" (COUNT MISMATCH {sorted(self.counts)})")


def measure(caller: Caller, path: Path, reps: int, note: Callable[[str], None]) -> list[Row]:
    rows = []
    for kind, pattern, about in CASES:
        args = {"paths": path.name, "pattern": pattern, "regex": kind == "regex"}
        row = Row(kind, pattern, about, [], [], [], 0, set())
        caller.as_task(args)  # warm-up: the worker process imports, rg's binary is cached
        for _ in range(reps):
            seconds, row.grep_count = run_grep("-F" if kind == "literal" else "-E", pattern, path)
            row.grep_s.append(seconds)
            for times, call in ((row.task_s, caller.as_task), (row.sync_s, caller.synchronous)):
                seconds, result = call(args)
                times.append(seconds)
                row.counts.add(result["total_matches"])
        note(f"{kind:8} {pattern!r}: grep {statistics.median(row.grep_s):.3f} s, "
             f"task {statistics.median(row.task_s):.3f} s, sync {statistics.median(row.sync_s):.3f} s")  # fmt: skip
        rows.append(row)
    return rows


def table(rows: list[Row], size: int) -> list[str]:
    def rate(times: list[float]) -> str:
        return f"{statistics.median(times):.3f} s ({size / statistics.median(times) / 1e9:.2f} GB/s)"

    head = "| kind | pattern | matching lines | grep -c | ours, task + tasks/get | ours, synchronous | ratio | goal |"
    return [head, "|---|---|---:|---:|---:|---:|---:|---|"] + [
        f"| {r.kind} | `{r.pattern}` ({r.about}) | {r.grep_count:,} | {rate(r.grep_s)} | {rate(r.task_s)} | "
        f"{rate(r.sync_s)} | {r.ratio(r.task_s):.2f}x / {r.ratio(r.sync_s):.2f}x | <= {GOALS[r.kind]}x: {r.verdict} |"
        for r in rows
    ]


def describe_machine() -> list[str]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())  # fmt: skip
    grep = subprocess.run(["grep", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    from jobs._ripgrep import rg_binary

    rg = subprocess.run([rg_binary(), "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return [
        f"- Machine: {cpu}, {os.cpu_count()} cores; Python {platform.python_version()}; {grep}; {rg}; "
        f"locale LANG={os.environ.get('LANG', '')!r} LC_ALL={os.environ.get('LC_ALL', '')!r}."
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.logsearch", description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="size of the generated log (default 1)")
    parser.add_argument("--reps", type=int, default=5, help="timed runs of each tool per pattern (default 5)")
    parser.add_argument("--out", type=Path, default=BENCH / "results-logsearch.md")
    options = parser.parse_args(argv)
    if shutil.which("grep") is None:
        raise SystemExit("GNU grep is needed for the comparison")
    workdir = Path(tempfile.mkdtemp(prefix="logsearch-bench-"))
    try:
        return _run(options, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run(options: argparse.Namespace, workdir: Path) -> int:
    path = workdir / "app.log"
    started = time.monotonic()
    size = generate_log(path, int(options.size_gb * 1e9))
    lines = sum(1 for _ in path.open("rb"))
    print(f"generated {path} ({size / 1e9:.2f} GB, {lines:,} lines) in {time.monotonic() - started:.0f} s")
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # into the page cache
    stack = start_stack(workdir)
    MY_SESSIONS.add(os.getsid(0))  # grep runs in ours: its CPU is not another user's
    try:
        probe = cpu_sample()
        rows = measure(Caller(stack.url), path, options.reps, print)
        foreign = foreign_share(probe, cpu_sample())
    finally:
        stack.stop()
    report = _report(rows, options.size_gb, size, lines, options.reps, foreign)
    print("\n".join(report))
    options.out.write_text("\n".join(report) + "\n")
    print(f"wrote {options.out}")
    return 0 if all(r.verdict == "met" for r in rows) else 1


def _report(rows: list[Row], size_gb: float, size: int, lines: int, reps: int, foreign: float) -> list[str]:
    return [
        "# log_search against GNU grep",
        "",
        f"`python -m bench.logsearch --size-gb {size_gb:g}`: a generated {size / 1e9:.2f} GB log "
        f"({lines:,} lines: ISO timestamp, level, service, message), read from the page cache by both tools.",
        f"Medians of {reps} interleaved runs per tool. grep: `grep -F -c` (literal) or `grep -E -c` (regex) on the "
        "file. Ours: `log_search` through `mcp-celery serve -A jobs --http` and a prefork `celery -A jobs worker` "
        f"(2 processes; `JOBS_LOG_SEARCH_PROCESSES={available_cpus()}`, since one search runs at a time), from the "
        f"`tools/call` request to the result: as a task polled every {POLL_S * 1000:.0f} ms "
        "with `tasks/get`, and as a synchronous call. GB/s is the log's size over that time.",
        "",
        *describe_machine(),
        f"- Other processes used {foreign:.0%} of the machine's CPU during the timed runs (the cores are shared; "
        f"load average {os.getloadavg()[0]:.1f} at the end).",
        "",
        *table(rows, size),
        "",
        "`matching lines` is grep's count; `goal` also checks that every run's `total_matches` equalled it. "
        "`ratio` is ours over grep's median time (task / synchronous).",
    ]


if __name__ == "__main__":
    raise SystemExit(main())
