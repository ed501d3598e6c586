"""python -m bench.logsearch [--size-gb 0.365]: `log_search` with every match delivered, against `grep -n > out`.

Generates a realistic log (ISO timestamp, level, service, message) into a temporary directory
(deleted afterwards, never committed), starts a private redis-server, a prefork
`celery -A jobs worker -c 2` and `mcp-celery serve -A jobs --http`, then times, interleaved, for
patterns matching about 1 k, 100 k, 500 k and 1.4 M lines: `grep -n PATTERN FILE > out` (the
reference: every matching line, numbered, written to a file), and our tool from the `tools/call` to
the completed task (polled with `tasks/get` every POLL_S), its first 1000 matches inline and every
match in the `matches.jsonl` artifact, in Redis. The page cache is warmed first, so both read the log
from memory. Each case checks that `total_matches` and `matches_in_artifact` equal grep's count, and
(once, outside the timing) that the downloaded artifact has that many lines.

Memory: the worker's pool processes' peak RSS (VmHWM) after the 1 k case and after all, and Redis's
`used_memory` before and after one delivery per stored match (the artifact is deleted after each run).
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
GOAL = 1.5  # our time over grep -n > out's, at each size
RSS_GOAL = 1.2  # the worker's peak RSS after every case over its peak after the 1 k case
CASES = [  # (kind, pattern, what it models); on the default 0.365 GB log
    ("literal", "disk usage 99%", "a rare message, about 1 k lines: the memory baseline"),
    ("regex", "ERROR .*(timeout|reset|slow)", "a level then some messages, about 100 k lines"),
    ("literal", "WARN", "a level, about 500 k lines"),
    ("literal", " ms", "every timing, about 1.4 M lines"),
]
#: The artifact of 1.4 M matches is about 200 MB: more than the default quota of artifacts in Redis.
ARTIFACT_MAX_BYTES = 512 << 20

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
        "MCP_CELERY_ARTIFACT_MAX_BYTES": str(ARTIFACT_MAX_BYTES),
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
        """Seconds from the `tools/call` to the completed task, and the task."""
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
        return elapsed, task

    def artifact_lines(self, task: dict[str, Any]) -> int:
        """The lines of the task's `matches.jsonl`, downloaded over HTTP a chunk at a time."""
        (link,) = [c for c in task["result"]["content"] if c.get("name") == "matches.jsonl"]
        url = self.url.removesuffix("/mcp") + f"/artifacts/{task['taskId']}/matches.jsonl"
        lines = 0
        with self.http.stream("GET", url) as answer:
            answer.raise_for_status()
            for chunk in answer.iter_bytes(1 << 20):
                lines += chunk.count(b"\n")
        assert link["size"] > 0
        return lines


def run_grep(kind: str, pattern: str, path: Path, out: Path) -> tuple[float, int]:
    """`grep -n PATTERN FILE > out` (-F or -E): seconds, and the lines it wrote."""
    flag = "-F" if kind == "literal" else "-E"
    started = time.perf_counter()
    with out.open("wb") as sink:
        done = subprocess.run(["grep", flag, "-n", "--", pattern, str(path)], stdout=sink, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise RuntimeError(f"grep failed with {done.returncode}")
    with out.open("rb") as written:
        lines = sum(block.count(b"\n") for block in iter(lambda: written.read(1 << 20), b""))
    return elapsed, lines


def pool_peak_rss(worker_pid: int) -> int:
    """The highest peak RSS (VmHWM, bytes) of the worker's pool processes so far."""
    children = []
    for task in Path(f"/proc/{worker_pid}/task").iterdir():
        children += (task / "children").read_text().split()
    peaks = [0]
    for child in children:
        status = Path(f"/proc/{child}/status").read_text()
        peaks += [int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")]
    return max(peaks)


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
    ours_s: list[float]
    grep_count: int
    counts: set[tuple[int, int]]  # (total_matches, matches_in_artifact) of each run
    artifact_lines: int
    artifact_bytes: int
    redis_bytes: int  # Redis's used_memory grown by one delivery

    @property
    def ratio(self) -> float:
        return statistics.median(self.ours_s) / statistics.median(self.grep_s)

    @property
    def verdict(self) -> str:
        same = self.counts == {(self.grep_count, self.grep_count)} and self.artifact_lines == self.grep_count
        verdict = "met" if self.ratio <= GOAL else "MISSED"
        return verdict + ("" if same else f" (COUNT MISMATCH {sorted(self.counts)}, {self.artifact_lines} lines)")


@dataclass
class Memory:
    idle: int  # the pool processes' peak RSS before the first search
    after_1k: int  # ... after the 1 k case
    after_all: int  # ... after every case

    @property
    def ratio(self) -> float:
        return self.after_all / self.after_1k


def measure(
    caller: Caller, stack: Stack, path: Path, reps: int, note: Callable[[str], None]
) -> tuple[list[Row], Memory]:
    rows, worker = [], stack.worker.pid
    memory = Memory(pool_peak_rss(worker), 0, 0)
    redis = stack.redis.client(1)  # the store follows Celery's results: database 1
    for kind, pattern, about in CASES:
        args = {"paths": path.name, "pattern": pattern, "regex": kind == "regex", "max_matches": 1000}
        row = Row(kind, pattern, about, [], [], 0, set(), 0, 0, 0)
        for rep in range(reps):
            seconds, row.grep_count = run_grep(kind, pattern, path, path.with_name("grep.out"))
            row.grep_s.append(seconds)
            before = int(redis.info("memory")["used_memory"])
            seconds, task = caller.as_task(args)
            row.ours_s.append(seconds)
            result = task["result"]["structuredContent"]
            row.counts.add((result["total_matches"], result["matches_in_artifact"] or 0))
            if rep == 0:  # outside the timing: what the artifact holds, and what it costs Redis
                row.redis_bytes = int(redis.info("memory")["used_memory"]) - before
                row.artifact_lines = caller.artifact_lines(task)
                row.artifact_bytes = next(
                    c["size"] for c in task["result"]["content"] if c.get("name") == "matches.jsonl"
                )
            redis.delete(f"mcp-celery:task:{{{task['taskId']}}}:artifact:matches.jsonl")
        if not rows:
            memory.after_1k = pool_peak_rss(worker)
        note(f"{kind:8} {pattern!r}: {row.grep_count:,} lines, grep -n {statistics.median(row.grep_s):.3f} s, "
             f"ours {statistics.median(row.ours_s):.3f} s ({row.ratio:.2f}x)")  # fmt: skip
        rows.append(row)
    memory.after_all = pool_peak_rss(worker)
    return rows, memory


def table(rows: list[Row], size: int) -> list[str]:
    def rate(times: list[float]) -> str:
        return f"{statistics.median(times):.3f} s ({size / statistics.median(times) / 1e9:.2f} GB/s)"

    head = "| pattern | matching lines | grep -n > out | ours, every match delivered | ratio | goal |"
    return [head, "|---|---:|---:|---:|---:|---|"] + [
        f"| `{r.pattern}` ({r.kind}; {r.about}) | {r.grep_count:,} | {rate(r.grep_s)} | {rate(r.ours_s)} | "
        f"{r.ratio:.2f}x | <= {GOAL}x: {r.verdict} |"
        for r in rows
    ]


def memory_lines(rows: list[Row], memory: Memory) -> list[str]:
    mib = 1 << 20
    verdict = "met" if memory.ratio <= RSS_GOAL else "MISSED"
    lines = [
        f"- The worker's pool processes' peak RSS (VmHWM): {memory.idle / mib:.0f} MiB idle, "
        f"{memory.after_1k / mib:.0f} MiB after the {rows[0].grep_count:,}-match case, "
        f"{memory.after_all / mib:.0f} MiB after all of them ({rows[-1].grep_count:,} matches the most): "
        f"{memory.ratio:.2f}x, goal <= {RSS_GOAL}x: {verdict}.",
        "- Redis memory per stored match (`used_memory` grown by one delivery, over the matches; "
        "the artifact's own bytes per match beside it):",
    ]
    for r in rows:
        per = r.redis_bytes / r.grep_count if r.grep_count else 0.0
        lines.append(
            f"    - `{r.pattern}`: {per:.0f} B per match ({r.redis_bytes / mib:.1f} MiB for {r.grep_count:,}); "
            f"the artifact {r.artifact_bytes / r.grep_count if r.grep_count else 0:.0f} B per match"
        )
    return lines


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
    parser.add_argument("--size-gb", type=float, default=0.365, help="size of the generated log (default 0.365)")
    parser.add_argument("--reps", type=int, default=3, help="timed runs of each tool per pattern (default 3)")
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
        caller = Caller(stack.url)
        caller.as_task({"paths": path.name, "pattern": "FATAL"})  # warm-up: imports, rg's binary cached
        probe = cpu_sample()
        rows, memory = measure(caller, stack, path, options.reps, print)
        foreign = foreign_share(probe, cpu_sample())
    finally:
        stack.stop()
    report = _report(rows, memory, options, size, lines, foreign)
    print("\n".join(report))
    options.out.write_text("\n".join(report) + "\n")
    print(f"wrote {options.out}")
    ok = all(r.verdict == "met" for r in rows) and memory.ratio <= RSS_GOAL
    return 0 if ok else 1


def _report(
    rows: list[Row], memory: Memory, options: argparse.Namespace, size: int, lines: int, foreign: float
) -> list[str]:
    return [
        "# log_search, every match delivered, against grep -n",
        "",
        f"`python -m bench.logsearch --size-gb {options.size_gb:g}`: a generated {size / 1e9:.2f} GB log "
        f"({lines:,} lines: ISO timestamp, level, service, message), read from the page cache by both tools. "
        f"Medians of {options.reps} interleaved runs per tool. The reference is `grep -F -n PATTERN FILE > out` "
        "(`-E` for the regex): every matching line, numbered, written to a file. Ours: `log_search` "
        "(`max_matches` 1000) through `mcp-celery serve -A jobs --http` and a prefork `celery -A jobs worker -c 2` "
        f"(`JOBS_LOG_SEARCH_PROCESSES={available_cpus()}`, since one search runs at a time), from the "
        f"`tools/call` request to the completed task (polled every {POLL_S * 1000:.0f} ms with `tasks/get`): "
        "the count and the first 1000 matches inline, every match in the `matches.jsonl` artifact (JSON Lines) "
        "in Redis. GB/s is the log's size over that time.",
        "",
        *describe_machine(),
        f"- Other processes used {foreign:.0%} of the machine's CPU during the timed runs (the cores are shared; "
        f"load average {os.getloadavg()[0]:.1f} at the end).",
        "",
        *table(rows, size),
        "",
        "`matching lines` is grep's; `goal` also checks that every run's `total_matches` and `matches_in_artifact` "
        "equalled it, and that the artifact, downloaded, has that many lines. `ratio` is ours over grep's median.",
        "",
        *memory_lines(rows, memory),
    ]


if __name__ == "__main__":
    raise SystemExit(main())
