"""`mcp-celery demo`: a private Redis, a worker and the HTTP server, then a walkthrough.

Tier 4. Serves the demo jobs that ship in the package (`mcp_celery/cli/demo_jobs.py`), so it runs
from a plain install. Its Redis is a `redis-server` of its own on a free port (the machine's
binary, else the one `[embedded]` ships), with its files in the demo's temporary folder: a Redis
the machine already runs, or one named by CELERY_BROKER_URL for another project, is never
written to. A shared Redis is used only when named by MCP_CELERY_DEMO_REDIS. Everything it starts
is stopped by pid when it ends, and its temporary folder removed. The walkthrough speaks raw
JSON-RPC, to show the wire. The server signs callers in with tokens the demo makes for "you" and
"bob" (step 6: bob approves your release on the approval page). With `--oidc`, a test OpenID Connect
provider starts too (`mcp_celery.testing.oidc_provider`, on `localhost`), the page signs people in
there, and bob does so in step 6.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from mcp_celery.client._cli import TOKEN_ENV
from mcp_celery.errors import ConfigurationError
from mcp_celery.protocol import TERMINAL_STATUSES, client_capabilities
from mcp_celery.redact import redact
from mcp_celery.server.edge.tokens import new_token
from mcp_celery.testing.approvals import PageClient, approval_path
from mcp_celery.testing.jsonrpc import RawHttpClient
from mcp_celery.testing.oidc_provider import start_provider
from mcp_celery.testing.processes import Process, redis_answers, start_redis

__all__ = ["DEMO_REDIS_ENV", "run_demo"]

#: Names a shared Redis for the demo (databases 0 and 1) instead of a private one.
DEMO_REDIS_ENV = "MCP_CELERY_DEMO_REDIS"
#: Variables that would point the demo's worker and server at another Redis: the demo sets or drops them.
FOUND_REDIS_ENV = ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "MCP_CELERY_REDIS_URL")
DEMO_APP = "mcp_celery.cli.demo_jobs"
#: The demo server's inline window (MCP_CELERY_INLINE_S; 20 s by default), short so step 5 shows a handle.
DEMO_INLINE_S = 2
#: Who calls the tools, and who approves the release (step 6): principals of the demo's tokens file.
CALLER, APPROVER = "you", "bob"


def run_demo(port: int = 8000, keep_serving: bool = False, oidc: bool = False) -> int:
    """Run the demo; 0 when every step did what it shows.

    Raises:
        ConfigurationError: MCP_CELERY_DEMO_REDIS names a Redis that does not answer, or `oidc` without
            the test provider installed.
    """
    if oidc and importlib.util.find_spec("oidc_provider_mock") is None:
        raise ConfigurationError("demo --oidc starts a test provider: pip install oidc-provider-mock")
    named = _named_redis()
    workdir = Path(tempfile.mkdtemp(prefix="mcp-celery-demo-"))
    ok = False
    previous = {sig: signal.signal(sig, _interrupt) for sig in _STOP_SIGNALS}
    try:
        with _processes() as started:
            env = _demo_env(named or _private_redis(started, workdir))
            if oidc:
                env.update(_provider(started, workdir, env))
            ok = _run(env, workdir, started, port, keep_serving)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"the demo's logs are kept in {workdir}", file=sys.stderr)
    return 0 if ok else 1


#: Signals that end the demo as Ctrl-C does (`kill`, a closed terminal), so that it stops what it started.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _named_redis() -> str | None:
    """The shared Redis MCP_CELERY_DEMO_REDIS names, checked; None when unset.

    Raises:
        ConfigurationError: it does not answer.
    """
    ignored = [name for name in FOUND_REDIS_ENV if os.environ.get(name)]
    if ignored:
        print(f"ignoring {', '.join(ignored)} from the environment (name a shared Redis with {DEMO_REDIS_ENV})")
    named = os.environ.get(DEMO_REDIS_ENV, "").rstrip("/")
    if not named:
        return None
    if not redis_answers(named):
        raise ConfigurationError(f"{DEMO_REDIS_ENV}={redact(named)} does not answer; unset it for a private Redis")
    print(f"Redis: {redact(named)} ({DEMO_REDIS_ENV}), databases 0 and 1; the demo's keys stay there")
    return named


def _private_redis(started: list[Process], workdir: Path) -> str:
    """A redis-server of the demo's own on a free port, its files (none: no persistence) in `workdir`."""
    try:
        url, proc = start_redis(workdir / "redis.log", data_dir=workdir / "redis")
    except RuntimeError as exc:
        raise ConfigurationError(f"demo: {exc}; or name a running Redis with {DEMO_REDIS_ENV}") from exc
    started.append(proc)
    print(f"Redis: a private redis-server (pid {proc.pid}, {proc.args[0]}) on {url}; stopped at the end")
    return url


def _provider(started: list[Process], workdir: Path, env: dict[str, str]) -> dict[str, str]:
    """Start the test OpenID Connect provider; returns the server's settings to sign people in there."""
    issuer, proc = start_provider(workdir / "oidc-provider.log", env)
    started.append(proc)
    secret = workdir / "oidc-client-secret"
    secret.write_text(secrets.token_urlsafe(24))
    secret.chmod(0o600)
    print(f"OpenID Connect provider: {issuer} (a test provider: any name signs in; pid {proc.pid})")
    return {
        "MCP_CELERY_OIDC_ISSUER": issuer,
        "MCP_CELERY_OIDC_CLIENT_ID": "mcp-celery-demo",
        "MCP_CELERY_OIDC_CLIENT_SECRET_FILE": str(secret),
        "MCP_CELERY_OIDC_PROVIDER_NAME": "the demo's provider",
    }


def _demo_env(base: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in FOUND_REDIS_ENV}
    # The store's records go with the result backend (MCP_CELERY_REDIS_URL is dropped above).
    env.update(PYTHONUNBUFFERED="1", CELERY_BROKER_URL=f"{base}/0", CELERY_RESULT_BACKEND=f"{base}/1")
    return env


def _run(env: dict[str, str], workdir: Path, started: list[Process], port: int, keep_serving: bool) -> bool:
    url = f"http://127.0.0.1:{port}/mcp"
    tokens = {person: new_token(person, workdir / "tokens") for person in (CALLER, APPROVER)}
    env = {
        **env,
        "MCP_CELERY_PUBLIC_URL": url,  # the workers put the approval page's link in the request
        "RELEASE_APPROVERS": APPROVER,
        "RELEASE_WORK_DIR": str(workdir / "release-build"),
        "RELEASE_PUBLISH_DIR": str(workdir / "releases"),
    }
    worker = Process(
        [sys.executable, "-m", "celery", "-A", DEMO_APP, "worker", "-P", "prefork", "-c", "3", "-n",
         f"demo-{os.getpid()}@%h", "--without-gossip", "--without-mingle", "-l", "INFO"],
        env, workdir / "worker.log",
    )  # fmt: skip
    started.append(worker)
    worker.wait_ready(lambda: "ready." in worker.output(), 60, "the Celery worker")
    print(f"worker ready (celery -A {DEMO_APP} worker), log: {worker.log}")
    server = Process(
        [sys.executable, "-m", "mcp_celery", "serve", "-A", DEMO_APP, "--http", "--port", str(port)],
        {"MCP_CELERY_INLINE_S": str(DEMO_INLINE_S), "MCP_CELERY_AUTH_TOKENS": str(workdir / "tokens"), **env},
        workdir / "server.log",
    )
    started.append(server)
    server.wait_ready(lambda: _http_up(url), 60, "the MCP server")
    print(f"MCP server ready (mcp-celery serve -A {DEMO_APP} --http --port {port}): {url}")
    print(f"tokens for {CALLER!r} (the walkthrough's caller) and {APPROVER!r}: {workdir / 'tokens'}\n")
    client = Walkthrough(url, tokens, env)
    try:
        ok = client.run()
    finally:
        client.close()
    if keep_serving:
        print(f"\nServing {url} until Ctrl-C. It needs a token: call it as {CALLER!r} with")
        print(f"  export {TOKEN_ENV}={tokens[CALLER]}")
        print(f"  mcp-celery call slow_compute --args '{{\"seconds\": 3}}' --url {url}")
        if "MCP_CELERY_OIDC_ISSUER" in env:
            print(f"The approval page, {url.rsplit('/mcp', 1)[0]}/approvals, signs people in at the demo's provider")
        with suppress(KeyboardInterrupt):
            while worker.alive() and server.alive():
                time.sleep(0.5)
    return ok


class Walkthrough(RawHttpClient):
    """The demo's client: raw JSON-RPC, as any 2026-07-28 client sends it, printing what it sees.

    It calls as `CALLER`; `tokens` holds the demo's tokens by principal.
    """

    def __init__(self, url: str, tokens: dict[str, str], env: dict[str, str]) -> None:
        super().__init__(url)
        self.tokens = tokens
        self.env = env  # the server's settings
        self.extra_headers["Authorization"] = f"Bearer {tokens[CALLER]}"

    def rpc(self, method: str, params: dict[str, Any], declare: bool = True) -> dict[str, Any]:
        reply = self.call(method, params, capabilities=client_capabilities(declare, elicitation={}))
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return dict(reply["result"])

    def poll(self, task_id: str, until: set[str], show: bool = True) -> dict[str, Any]:
        last = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            task = self.rpc("tasks/get", {"taskId": task_id})
            line = f"  {task['status']:<15} {task.get('statusMessage', '')}"
            if show and line != last:
                print(line)
                last = line
            if task["status"] in until:
                return task
            time.sleep(0.2)
        raise RuntimeError(f"task {task_id} did not reach {until} within 60 s")

    def watch(self, task_id: str) -> dict[str, Any]:
        """Follow a task through `subscriptions/listen` (no polling) until it ends; returns its last state."""
        stream = self.stream("subscriptions/listen", {"notifications": {"taskIds": [task_id]}})
        last: dict[str, Any] = {}
        try:
            while (message := stream.next(timeout=60)) is not None and message.get("id") != stream.request_id:
                if message["method"] == "notifications/tasks":
                    last = message["params"]
                    print(f"  {last['status']:<15} {last.get('statusMessage', '')}   (notifications/tasks)")
        finally:
            stream.close()
        if last.get("status") not in TERMINAL_STATUSES:
            raise RuntimeError(f"the listen stream for {task_id} ended before the task did: {last}")
        return last

    def run(self) -> bool:
        return _walkthrough(self)


def _walkthrough(client: Walkthrough) -> bool:
    terminal = set(TERMINAL_STATUSES)
    tools = [t["name"] for t in client.rpc("tools/list", {})["tools"]]
    print(f"tools/list: {tools}\n")

    print("1. slow_compute as a task: the handle comes back at once, then the server pushes every change")
    handle = client.rpc("tools/call", {"name": "slow_compute", "arguments": {"seconds": 2, "label": "demo"}})
    print(f"  tools/call -> resultType={handle['resultType']} taskId={handle['taskId'][:12]}...")
    done = client.watch(handle["taskId"])
    print(f"  result: {done['result']['content'][0]['text']}\n")

    print("2. train asks a question halfway (input_required), we answer with tasks/update")
    handle = client.rpc("tools/call", {"name": "train", "arguments": {"epochs": 3}})
    waiting = client.poll(handle["taskId"], {"input_required"} | terminal)
    key, request = next(iter(waiting["inputRequests"].items()))
    print(f"  question [{key}]: {request['params']['message']}  -> answering yes")
    answer = {"action": "accept", "content": {"confirm": True}}
    client.rpc("tasks/update", {"taskId": handle["taskId"], "inputResponses": {key: answer}})
    done = client.poll(handle["taskId"], terminal)
    print(f"  result: {done['result']['structuredContent']}\n")

    print("3. a long slow_compute, cancelled after a moment")
    handle = client.rpc("tools/call", {"name": "slow_compute", "arguments": {"seconds": 60}})
    client.poll(handle["taskId"], {"working"}, show=False)
    time.sleep(1)
    client.rpc("tasks/cancel", {"taskId": handle["taskId"]})
    done = client.poll(handle["taskId"], terminal)
    print()

    print("4. an existing Celery task (count_words), progress reported the Celery way")
    handle = client.rpc("tools/call", {"name": "count_words", "arguments": {"text": "the quick brown fox jumps over"}})
    words = client.poll(handle["taskId"], terminal)
    print(f"  result: {words['result']['content'][0]['text']} words\n")

    plain = _plain_client(client)
    released = _release(client)
    return bool(
        done["status"] == "cancelled"
        and words["status"] == "completed"
        and plain["status"] == "completed"
        and released["status"] == "completed"
    )


def _plain_client(client: Walkthrough) -> dict[str, Any]:
    """Step 5: a client without the tasks extension; returns the task it followed."""
    print(f"5. a client without the tasks extension (most hosts today); the demo's inline window is {DEMO_INLINE_S} s")
    quick = client.rpc("tools/call", {"name": "slow_compute", "arguments": {"seconds": 1}}, declare=False)
    print(f"  a 1 s job answers within the window, as a plain result: {quick['content'][0]['text']}")
    running = client.rpc("tools/call", {"name": "slow_compute", "arguments": {"seconds": 5}}, declare=False)
    handle = running["_meta"]["mcp-celery/task"]
    print(f"  a 5 s job runs on as task {handle['taskId'][:12]}...; the model reads:")
    print("    " + running["content"][0]["text"].replace("\n", "\n    "))
    while True:
        arguments = {"task_id": handle["taskId"], "wait_seconds": 2}
        status = client.rpc("tools/call", {"name": "task_status", "arguments": arguments}, declare=False)
        task: dict[str, Any] = status["structuredContent"]
        print(f"  task_status(wait_seconds=2) -> {task['status']:<10} {task.get('statusMessage', '')}")
        if task["status"] in TERMINAL_STATUSES:
            print(f"  result: {status['content'][-1]['text']}")
            return task


def _release(client: Walkthrough) -> dict[str, Any]:
    """Step 6: a release that another person approves on the server's page; returns the ended task."""
    print(f"\n6. release builds, then asks {APPROVER!r} to approve on the server's page; the job parks meanwhile")
    handle = client.rpc("tools/call", {"name": "release", "arguments": {"version": "1.0.0"}})
    waiting = client.poll(handle["taskId"], {"input_required"} | set(TERMINAL_STATUSES))
    if waiting["status"] != "input_required":
        raise RuntimeError(f"the release did not ask for approval: {waiting}")
    path = approval_path(waiting)
    base = client.url.rsplit("/mcp", 1)[0]
    print(f"  {APPROVER} signs in at {base}/approvals and approves {path}")
    page = PageClient(base)
    oidc = "MCP_CELERY_OIDC_ISSUER" in client.env
    if oidc:
        print(f"  ({APPROVER} signs in at the OpenID Connect provider, typing his name on its page)")
    try:
        signed_in = page.sign_in_with_provider(APPROVER, path) if oidc else page.sign_in(client.tokens[APPROVER])
        for answer in (signed_in, page.decide(path, "approve", "digest checked")):
            if answer.status_code >= 400:
                raise RuntimeError(f"the approval page answered {answer.status_code}: {answer.text[:300]}")
    finally:
        page.close()
    done = client.poll(handle["taskId"], set(TERMINAL_STATUSES))
    report = done.get("result", {}).get("structuredContent") or {}
    print(f"  result: {report.get('decision')}; published {Path(report.get('published') or '-').name}")
    return done


@contextmanager
def _processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    try:
        yield started
    finally:
        for proc in reversed(started):
            proc.stop()


def _http_up(url: str) -> bool:
    client = RawHttpClient(url, timeout=1)
    try:
        client.send_raw(b"{}", {"Content-Type": "application/json"})
    except OSError:
        return False
    finally:
        client.close()
    return True
