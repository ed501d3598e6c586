"""A 100 MB artifact downloaded over HTTP, against copying the same bytes with redis-cli or cp.

    python -m bench.artifact_download [--mb 100] [--rounds 5] [--stores redis,file] [--quick] [--out FILE]

One private redis-server on 127.0.0.1, started and stopped here; for each store in turn a prefork
worker (`-c 1`) and one `mcp-celery serve --http` for `bench.bench_jobs`, both with
`MCP_CELERY_ARTIFACTS` set to the store: `redis` (with `MCP_CELERY_ARTIFACT_MAX_BYTES` above the
artifact's size) or `file://<a fresh directory>`. The job `write_artifact` writes `--mb` MB
(10**6 bytes each) of random bytes to a file and hands it over with `ctx.artifact(name, path=...)`;
then, interleaved round by round (the order reversed every other round), each side copies the
bytes into a new file, checked afterwards (untimed: size, and SHA-256 against the download's
`Repr-Digest`) and removed:

- ours: `GET /artifacts/{taskId}/{name}` by `curl -o FILE` (the download as a user runs it), and
  by a Python client in this process (`http.client`, 1 MiB `readinto` and a write at a time);
- the reference, the same bytes copied by the machine's own tool: for `redis`, `redis-cli --raw GET
  <key>` with its output redirected to a new file (the value and one newline), the fastest way
  redis-cli has to get a value out as bytes, from a key holding the artifact's bytes whole (copied
  once, untimed, from the 4 MiB chunks the store keeps a streamed artifact in); for `file://`, `cp` of the store's file
  to a new file in the same directory (one file system, the source in the page cache for every
  side: the job wrote it and every round reads it);
- for `file://` also the ceiling of any HTTP download on the machine: the same file from
  `bench/sendfile_server.py` (sendfile(2), no Python touching the bytes) to the same two clients.

curl's, redis-cli's and cp's times are their whole process's wall time, start-up included.
Throughput is MB (10**6 bytes) per second of each side's median round; the goal (issue 38) is ours
at least 0.5x the reference's, for each store.

Writes bench/results-artifact-download.md (not with --quick, a smoke test) and prints the same.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from bench import rpc
from bench.procs import BENCH, PY, CpuProbe, start, start_ours_server, start_worker, wait_worker
from bench.redis_tools import BenchRedis, artifact_keys
from bench.results import Machine
from mcp_celery.store.schema import Keys
from mcp_celery.testing.processes import Process, free_port, wait_for

NAME = "blob.bin"
GOAL = 0.5  # ours at least this share of the reference's throughput
STORES = ("redis", "file")
OURS_CURL, OURS_PYTHON = "ours, curl -o", "ours, Python client"
CEILING_CURL, CEILING_PYTHON = "sendfile server, curl -o", "sendfile server, Python client"
REFERENCE = "reference"
REFERENCES = {"redis": "reference: `redis-cli --raw GET key > file`", "file": "reference: `cp` (same file system)"}
TERMINAL = ("completed", "failed", "cancelled")


@dataclass
class StoreFigures:
    """One store's rounds: seconds per copy of `size` bytes, by side (OURS_CURL, ..., REFERENCE)."""

    store: str
    size: int
    seconds: dict[str, list[float]] = field(default_factory=dict)
    foreign_cpu: float = 0.0  # share of the machine's CPU other processes used during the rounds

    def mb_s(self, side: str) -> float:
        """MB/s of the side's median round."""
        return self.size / statistics.median(self.seconds[side]) / 1e6

    def ratio(self, side: str) -> float:
        return self.mb_s(side) / self.mb_s(REFERENCE)


def _children_cpu_s() -> float:
    """CPU seconds of this process's children that have ended (curl, redis-cli, cp)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], stdout: Path | None = None) -> float:
    """Run `argv` to its end (stdout into a file, if given) and return its wall time in seconds."""
    with open(stdout or os.devnull, "wb") as out:
        started = time.perf_counter()
        run = subprocess.run(argv, stdout=out, stderr=subprocess.PIPE, check=False)
        seconds = time.perf_counter() - started
    if run.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited with {run.returncode}: {run.stderr.decode(errors='replace')}")
    return seconds


def python_get(url: str, dest: Path) -> tuple[float, str]:
    """GET `url` into a new file with the standard library, 1 MiB a read (`readinto`) and a write:
    (seconds, the answer's Repr-Digest header)."""
    parts = urlsplit(url)
    started = time.perf_counter()
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port)
    try:
        connection.request("GET", parts.path)
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"GET {url}: HTTP {response.status}")
        buffer = memoryview(bytearray(1 << 20))
        with dest.open("wb", buffering=0) as out:
            while read := response.readinto(buffer):
                out.write(buffer[:read])
    finally:
        connection.close()
    return time.perf_counter() - started, response.headers.get("repr-digest", "")


def sha256_of(path: Path, size: int) -> bytes:
    """SHA-256 of the first `size` bytes of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        left = size
        while left > 0 and (chunk := file.read(min(8 << 20, left))):
            digest.update(chunk)
            left -= len(chunk)
    return digest.digest()


def repr_digest(value: str) -> bytes:
    """The SHA-256 of a `Repr-Digest: sha-256=:...:` header's value."""
    return base64.b64decode(value.strip().removeprefix("sha-256=:").removesuffix(":"))


def header_in(dump: Path, name: str) -> str:
    """A header's value in a header dump of curl's (-D)."""
    for line in dump.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == name:
            return value.strip()
    raise RuntimeError(f"no {name} in the answer:\n{dump.read_text()}")


class Sides:
    """The copies of one store's artifact, each into a new file that is checked (untimed) and removed."""

    def __init__(self, store: str, url: str, source: str, tmp: Path, size: int) -> None:
        self.store, self.url, self.source, self.tmp, self.size = store, url, source, tmp, size
        self.ceiling_url = ""  # the sendfile server's, for the file store
        self.digest = b""  # the artifact's SHA-256, from the first download

    def run(self, side: str) -> float:
        dest = self.tmp / "copy.bin"
        if side in (OURS_CURL, CEILING_CURL):
            dump = self.tmp / "headers.txt"
            url = self.url if side == OURS_CURL else self.ceiling_url
            seconds = timed(["curl", "-sSf", "--noproxy", "*", "-D", str(dump), "-o", str(dest), url])
            digest = header_in(dump, "repr-digest") if side == OURS_CURL else ""
        elif side in (OURS_PYTHON, CEILING_PYTHON):
            seconds, digest = python_get(self.url if side == OURS_PYTHON else self.ceiling_url, dest)
        elif self.store == "redis":  # REFERENCE
            port, key = self.source.split(" ", 1)
            seconds, digest = timed(["redis-cli", "-p", port, "--raw", "GET", key], stdout=dest), ""
        else:
            seconds, digest = timed(["cp", self.source, str(dest)]), ""
        if digest:
            self.digest = repr_digest(digest)
        expected = self.size + (side == REFERENCE and self.store == "redis")  # redis-cli --raw adds a newline
        if dest.stat().st_size != expected or sha256_of(dest, self.size) != self.digest:
            raise RuntimeError(f"{side} ({self.store}): the copy does not hold the artifact's bytes")
        dest.unlink()
        return seconds


def make_artifact(url: str, mb: int) -> str:
    """Run `write_artifact` as a task and return its id once it completed."""
    client = rpc.SyncClient(url, {"extensions": {rpc.TASKS_EXT: {}}})
    try:
        task_id = client.start("write_artifact", {"mb": mb})
        task = wait_for(lambda: (t := client.get(task_id))["status"] in TERMINAL and t, 300, 0.1, "write_artifact")
        if task["status"] != "completed":
            raise RuntimeError(f"write_artifact ended {task['status']}: {task}")
        return task_id
    finally:
        client.close()


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def start_sendfile_server(path: str) -> tuple[Process, str]:
    """`bench.sendfile_server` on a spare port, serving `path`; its URL once it answers."""
    port = free_port()
    proc = start("sendfile-server", [PY, "-m", "bench.sendfile_server", str(port), path])
    url = f"http://127.0.0.1:{port}/{NAME}"
    proc.wait_ready(lambda: _listens(port), 20, "the sendfile server")
    return proc, url


def copy_whole(rds: BenchRedis, task_id: str) -> str:
    """A new key holding the artifact's bytes whole, copied (untimed) from the chunks the store keeps them
    in: what the reference, `redis-cli GET`, reads."""
    key, client = f"bench:reference:{task_id}", rds.client()
    client.set(key, b"".join(client.get(chunk) or b"" for chunk in artifact_keys(client, task_id, NAME)))
    return key


def measure_store(rds: BenchRedis, store: str, mb: int, rounds: int, tmp: Path) -> StoreFigures:
    """Start a worker and a server for `store`, have the job write the artifact, and time every side."""
    size = mb * 10**6
    files = tmp / "store"
    setting = "redis" if store == "redis" else f"file://{files}"
    env = {"MCP_CELERY_ARTIFACTS": setting, "MCP_CELERY_ARTIFACT_MAX_BYTES": str(size + 10**6)}
    started: list[Process] = []
    try:
        from bench import bench_jobs  # imported late: it reads BENCH_REDIS_URL

        worker = start_worker(rds.url, f"worker-artifact-{store}", concurrency=1, env=env)
        started.append(worker)
        wait_worker(bench_jobs.app, worker)
        server, mcp_url = start_ours_server(rds.url, f"server-artifact-{store}", env)
        started.append(server)
        task_id = make_artifact(mcp_url, mb)
        url = mcp_url.removesuffix("/mcp") + f"/artifacts/{task_id}/{NAME}"
        reference = copy_whole(rds, task_id) if store == "redis" else ""
        # An fsspec store keeps a task's files under the deployment's folder, named after its key prefix.
        source = f"{rds.port} {reference}" if store == "redis" else str(files / Keys().prefix / task_id / NAME)
        sides = Sides(store, url, source, tmp, size)
        names = [OURS_CURL, OURS_PYTHON, REFERENCE]
        if store == "file":
            ceiling, sides.ceiling_url = start_sendfile_server(source)
            started.append(ceiling)
            names += [CEILING_CURL, CEILING_PYTHON]
        for side in names:  # warm-up: the digest known, the file in the page cache, every client run once
            sides.run(side)
        figures = StoreFigures(store, size, {side: [] for side in names})
        before, children = CpuProbe.sample(), _children_cpu_s()
        for round_ in range(rounds):
            for side in names if round_ % 2 == 0 else reversed(names):
                figures.seconds[side].append(sides.run(side))
        after = CpuProbe.sample()
        # curl, redis-cli and cp ran in this process's session, which CpuProbe does not know: theirs is ours too.
        ours_share = (_children_cpu_s() - children) / ((after[0] - before[0]) * CpuProbe.ncpu)
        figures.foreign_cpu = max(0.0, CpuProbe.foreign(before, after) - ours_share)
        if store == "redis":
            rds.client().delete(reference, *artifact_keys(rds.client(), task_id, NAME))
        return figures
    finally:
        for proc in reversed(started):
            proc.stop()


def report(cmdline: str, machine: Machine, mb: int, rounds: int, figures: list[StoreFigures]) -> str:
    lines = [
        "# Artifact download (`python -m bench.artifact_download`)",
        "",
        f"`{cmdline}`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC. {machine.cpu} x {machine.cores} cores shared by "
        f"everything; {machine.memory} memory; {machine.os}; Python {machine.python}, uvicorn "
        f"{machine.packages.get('uvicorn')}, starlette {machine.packages.get('starlette')}; one private redis-server "
        f"{machine.redis_server} on 127.0.0.1 (no persistence); the machine's curl, redis-cli and cp.",
        "",
        f"A job (`bench_jobs.write_artifact`) wrote {mb} MB ({mb * 10**6:,} bytes) of random bytes and handed them "
        "over with `ctx.artifact(name, path=...)`; one prefork worker and one `mcp-celery serve --http` ran with "
        "`MCP_CELERY_ARTIFACTS` set to the store. Each side copies the artifact's bytes into a new file, checked "
        "afterwards (untimed) against the download's `Repr-Digest`. Ours: `GET /artifacts/{taskId}/{name}` by "
        "`curl -o FILE`, and by a Python client (`http.client`, 1 MiB `readinto` and a write at a time, in the "
        "bench's process). The reference, the same bytes copied by the machine's own tool: "
        "`redis-cli --raw GET <key> > FILE` (the value and a newline) for redis, `cp` to a new file in the same "
        "directory for file:// (one file system, the source in the page cache for every side). For file:// also the "
        "ceiling of any HTTP download here: the same file from `bench/sendfile_server.py`, which answers with "
        "sendfile(2) (no Python touches the bytes), to the same two clients. The sides run interleaved, round by "
        f"round, the order reversed every other round; {rounds} rounds after one warm-up of each; curl's, "
        "redis-cli's and cp's times are their whole process's, start-up included; MB/s of the median round.",
        "",
        "| store | side | MB/s | / reference | goal: ours at least 0.5x |",
        "|---|---|---|---|---|",
    ]
    for f in figures:
        for side in f.seconds:
            verdict = ""
            if side in (OURS_CURL, OURS_PYTHON):
                verdict = "MET" if f.ratio(side) >= GOAL else "MISSED"
            ratio = "1" if side == REFERENCE else f"{f.ratio(side):.2f}x"
            label = REFERENCES[f.store] if side == REFERENCE else side
            lines.append(f"| {f.store} | {label} | {f.mb_s(side):,.0f} | {ratio} | {verdict} |")
    lines += ["", "Each round, in order (MB/s):", ""]
    for f in figures:
        for side, seconds in f.seconds.items():
            label = REFERENCES[f.store] if side == REFERENCE else side
            lines.append(f"- {f.store}, {label}: {', '.join(f'{f.size / s / 1e6:,.0f}' for s in seconds)}")
        lines.append(f"- {f.store}: other processes used {f.foreign_cpu:.0%} of the machine's CPU meanwhile.")
    for f in figures:
        if CEILING_CURL in f.seconds:
            lines += [
                "",
                f"What bounds {f.store}: ours is {f.mb_s(OURS_CURL) / f.mb_s(CEILING_CURL):.2f}x the sendfile "
                f"server with curl and {f.mb_s(OURS_PYTHON) / f.mb_s(CEILING_PYTHON):.2f}x with the Python client. "
                "With curl the client bounds both servers (curl 7.88 writes the file in 4 to 16 KiB pieces, about "
                "12,000 write(2) calls per 100 MB); no HTTP download into a file over loopback reaches cp here, "
                "which copies page cache to page cache inside the kernel (copy_file_range) with no socket between.",
            ]
    return "\n".join(lines) + "\n"


def main() -> None:
    doc = (__doc__ or "").split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.artifact_download", description=doc)
    parser.add_argument("--mb", type=int, default=100, help="the artifact's size in MB (10**6 bytes)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stores", default=",".join(STORES), help="comma-separated: redis, file")
    parser.add_argument("--quick", action="store_true", help="8 MB, 2 rounds: a smoke test, writes nothing")
    parser.add_argument("--out", type=Path, default=BENCH / "results-artifact-download.md")
    args = parser.parse_args()
    mb, rounds = (8, 2) if args.quick else (args.mb, args.rounds)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if unknown := set(stores) - set(STORES):
        parser.error(f"unknown store(s): {', '.join(sorted(unknown))}")
    for tool in ("curl", "redis-cli", "cp"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not installed")
    rds = BenchRedis("redis-artifact")
    rds.start()
    tmp = Path(tempfile.mkdtemp(prefix="artifact-bench-"))
    try:
        os.environ["BENCH_REDIS_URL"] = rds.url
        figures = [measure_store(rds, store, mb, rounds, tmp) for store in stores]
        machine = Machine.collect(rds.version())
    finally:
        rds.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    cmdline = " ".join(["python -m bench.artifact_download", *sys.argv[1:]])
    text = report(cmdline, machine, mb, rounds, figures)
    print(text)
    if not args.quick:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
