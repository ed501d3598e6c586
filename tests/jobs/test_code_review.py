"""`code_review` (jobs/code_review.py): its parts without Celery, then the job end to end through a real
`mcp-celery serve --http` and a real prefork `celery -A jobs worker`, with the client's model played by
a scripted sampling handler in the client (deterministic replies, tool use included), by a command
(`--sampling-command`), by an OpenAI-compatible HTTP server this test starts on 127.0.0.1
(`--sampling-url`), and by a person typing at a terminal.

The end-to-end tests use Redis databases 10 and 11 (as the other real jobs' tests) and a repository
of their own, with planted duplicates and house-rule violations, in a temporary directory.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pexpect
import pytest
import redis
from mcp.client import ClientRequestContext
from mcp_types import (
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateMessageResultWithTools,
    TextContent,
    ToolUseContent,
)

from jobs._duplicates import find_duplicates
from jobs._lint import lint
from jobs._repofiles import ReviewError, list_sources, read_lines
from jobs._review_agent import ReviewAgent
from jobs._review_tools import Toolbox
from jobs._rules import check_file, load_rules
from mcp_celery.client import (
    SAMPLING_WITH_TOOLS,
    ServerTarget,
    TaskFailedError,
    TasksExtension,
    connect,
)
from mcp_celery.inputs import SAMPLING_USAGE_META, declined_sampling
from tests.support.harness import ROOT, HttpClient, Process, free_port, start_http_server, start_jobs_worker, wait_for
from tests.support.harness import jobs_env as jobs_env_for
from tests.support.review_repo import INVOICES, ORDERS, UTIL, UTIL_EXCEPT_LINE, make_repo

SamplingAnswer = CreateMessageResult | CreateMessageResultWithTools
TOOL_NAMES = {"search", "read", "duplicates", "lint", "house_rules", "submit_review"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("review"))


# --- the parts, no Celery -------------------------------------------------------------------------


def test_duplicates_exact_and_renamed_blocks_are_found_and_short_or_trivial_ones_are_not() -> None:
    five = "a = f(x, 1)\nb = g(a, 2)\nc = h(b, 3)\nd = i(c, 4)\ne = j(d, 5)\n"
    brackets = "foo(\n    1,\n)\n" * 4
    sources = {
        "orders.py": ORDERS,
        "invoices.py": INVOICES,
        "copy.py": "# a copy, comments and blank lines between\n" + ORDERS.replace("\n    ", "\n\n    # note\n    "),
        "five.py": five + "\n" + five,  # 5 lines repeat: under the six-line minimum
        "brackets.py": brackets,  # repeats, but made of short lines only
    }
    found = find_duplicates(sources)
    assert len(found) == 1, found
    (block,) = found
    assert block.kind == "renamed" and block.lines == 8  # the imports and the docstring's line aside
    assert [(o.file, o.start_line) for o in block.occurrences] == [("copy.py", 7), ("invoices.py", 6), ("orders.py", 6)]
    exact = find_duplicates({"a.py": ORDERS, "b.py": ORDERS})
    assert [(d.kind, d.lines) for d in exact] == [("exact", 8)]


def test_duplicates_within_one_file_do_not_overlap() -> None:
    body = "".join(f"value_{i} = compute(value_{i - 1}, {i})\n" for i in range(1, 7))
    found = find_duplicates({"one.py": body + "\nprint('between')\n" + body})
    assert [(d.lines, [(o.start_line, o.end_line) for o in d.occurrences]) for d in found] == [(6, [(1, 6), (9, 14)])]


def test_paths_are_confined_to_the_repository_root(repo: Path) -> None:
    listing = list_sources(repo, "pkg")
    assert [f.name for f in listing.files] == [
        "pkg/invoices.py",
        "pkg/orders.py",
        "pkg/util.py",
    ]  # no leak, no generated
    for path, message in [
        ("../outside", "escapes the repository root"),
        ("/etc", "is absolute"),
        ("escape", "outside the repository root"),
        ("pkg/leak.py", "outside the repository root"),
        ("nothing", "no file or directory"),
    ]:
        with pytest.raises(ReviewError, match=message):
            list_sources(repo, path)
    text, first, last, total = read_lines(repo, "pkg/util.py", 10, 11)
    assert (first, last, total) == (10, 11, 12) and text.splitlines()[1].endswith("except Exception:")


def test_house_rules_are_read_and_their_checks_run(repo: Path, tmp_path: Path) -> None:
    rules = load_rules(repo, repo / "pkg" / "util.py")
    assert rules.files == [".review.md"] and "never `Exception`" in rules.text
    found = check_file(rules.checks, "pkg/util.py", UTIL + "x = '" + "y" * 100 + "'\n")
    assert [(f.rule, f.line) for f in found] == [("max-line-length", 13), ("no-broad-except", UTIL_EXCEPT_LINE)]
    # A nearer file overrides a farther one's numbers; a block that does not parse is a finding.
    (tmp_path / "sub").mkdir()
    (tmp_path / "STYLE.md").write_text("```review-rules\nmax_file_lines = 3\nmax_function_lines = 2\n```\n")
    (tmp_path / "sub" / "CONTRIBUTING.md").write_text("```review-rules\nmax_file_lines = 100\n```\n")
    (tmp_path / "sub" / ".review.md").write_text("```review-rules\nmax_lines = 1\n```\n")
    near = load_rules(tmp_path, tmp_path / "sub")
    assert near.files == ["sub/.review.md", "sub/CONTRIBUTING.md", "STYLE.md"]
    assert (near.checks.max_file_lines, near.checks.max_function_lines) == (100, 2)
    assert [(p.file, p.rule) for p in near.problems] == [("sub/.review.md", "review-rules")]
    assert "max_lines" in near.problems[0].message
    assert [f.rule for f in check_file(near.checks, "sub/util.py", UTIL)] == ["max-function-lines"]


def test_lint_runs_ruff_with_the_repositorys_configuration(repo: Path) -> None:
    result = lint(repo, list_sources(repo, "pkg").files)
    assert result.error is None and result.files == 3
    assert [(f.file, f.line, f.rule) for f in result.findings] == [
        ("pkg/util.py", 3, "F401"),
        ("pkg/util.py", 4, "F401"),
    ]
    assert result.findings[0].suggestion and "os" in result.findings[0].suggestion


class Stop(BaseException):
    pass


def test_a_cancel_stops_a_tool_inside_it(tmp_path: Path) -> None:
    """The tools call the job's cancel checkpoint while they run; what it raises stops them (rg, ruff killed)."""
    (tmp_path / "big.txt").write_text("some text that does not match\n" * 30_000)
    for i in range(60):
        (tmp_path / f"m{i}.py").write_text(UTIL)
    listing = list_sources(tmp_path, ".")

    def stop() -> None:
        raise Stop

    toolbox = Toolbox(tmp_path, listing, load_rules(tmp_path, tmp_path), stop)
    for name, arguments in [("search", {"pattern": "needle"}), ("lint", {}), ("duplicates", {})]:
        with pytest.raises(Stop):
            toolbox.run(name, arguments)
    children = subprocess.run(["ps", "--ppid", str(os.getpid()), "-o", "comm="], capture_output=True, text=True)
    assert not {"rg", "ruff"} & set(children.stdout.split())


def test_the_agent_runs_the_tools_the_model_asks_for_and_reports_each_turn(repo: Path) -> None:
    listing = list_sources(repo, "pkg")
    toolbox = Toolbox(repo, listing, load_rules(repo, repo / "pkg"), lambda: None)
    replies = iter([use("read", "r1", file="pkg/util.py", start=1, end=80), use("read", "r2", file="../x"),
                    submit("done", {"file": "pkg/util.py", "line": 11, "message": "broad", "severity": "high"},
                           {"file": "pkg/nowhere.py", "message": "made up"})])  # fmt: skip
    statuses: list[str] = []
    agent = ReviewAgent(toolbox, lambda *_: next(replies), statuses.append, 8, lambda n: (repo / n).is_file())
    outcome = agent.run("review pkg", "system", use_tools=True)
    assert statuses == [
        "turn 1/8: waiting for the model", "turn 1/8: reading pkg/util.py lines 1-80",
        "turn 2/8: waiting for the model", "turn 2/8: reading ../x",
        "turn 3/8: waiting for the model",
    ]  # fmt: skip
    results = [m["content"][0] for m in agent.messages if m["role"] == "user" and isinstance(m["content"], list)]
    assert results[0]["toolUseId"] == "r1" and "except Exception" in results[0]["content"][0]["text"]
    assert results[1]["isError"] is True and "escapes the repository root" in results[1]["content"][0]["text"]
    assert (outcome.state, outcome.turns, outcome.summary, outcome.dropped) == ("completed", 3, "done", 1)
    assert [(f.file, f.line, f.severity, f.source) for f in outcome.findings] == [("pkg/util.py", 11, "error", "model")]


# --- end to end: the job on a prefork worker behind a real server -----------------------------------


@pytest.fixture(scope="module")
def jobs_env(env: dict[str, str], repo: Path) -> dict[str, str]:
    # Every model turn parks the job (MCP_CELERY_PARK_AFTER_S=0): the review resumes from the top each time,
    # its earlier turns replayed and ruff not run again (`ctx.once`).
    return jobs_env_for(env, JOBS_REPO_ROOT=str(repo), MCP_CELERY_PARK_AFTER_S="0")


@pytest.fixture(scope="module")
def jobs_worker(jobs_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    worker = start_jobs_worker(jobs_env, tmp_path_factory.mktemp("review-logs") / "worker.log", "review")
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def url(jobs_env: dict[str, str], jobs_worker: Process, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    address, server = start_http_server(jobs_env, tmp_path_factory.mktemp("review-logs") / "server.log", app="jobs")
    yield address
    server.stop()


def usage(tokens_in: int, tokens_out: int) -> dict[str, Any]:
    return {SAMPLING_USAGE_META: {"inputTokens": tokens_in, "outputTokens": tokens_out}}


def use(name: str, use_id: str, **arguments: Any) -> CreateMessageResultWithTools:
    """A model turn that calls one tool."""
    block = ToolUseContent(name=name, id=use_id, input=arguments)
    return CreateMessageResultWithTools(role="assistant", content=[block], model="scripted-model",
                                        stop_reason="toolUse", _meta=usage(1000, 20))  # fmt: skip


def submit(summary: str, *findings: dict[str, Any]) -> CreateMessageResultWithTools:
    return use("submit_review", "submit", summary=summary, findings=list(findings))


def text_reply(text: str) -> CreateMessageResult:
    return CreateMessageResult(role="assistant", content=TextContent(type="text", text=text), model="scripted-model",
                               stop_reason="endTurn", _meta=usage(500, 50))  # fmt: skip


Reply = SamplingAnswer | Callable[[CreateMessageRequestParams], SamplingAnswer | Awaitable[SamplingAnswer]]


class ScriptedModel:
    """The client's model in these tests: one scripted reply per turn (the last one repeats), every request kept."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = replies
        self.requests: list[CreateMessageRequestParams] = []

    async def __call__(self, ctx: ClientRequestContext, params: CreateMessageRequestParams) -> SamplingAnswer:
        self.requests.append(params)
        reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
        answer = reply(params) if callable(reply) else reply
        return await answer if inspect.isawaitable(answer) else answer


def review(
    url: str, arguments: dict[str, Any], model: ScriptedModel | None = None, *, tools: bool = True
) -> tuple[dict[str, Any], list[str]]:
    """Run code_review through the client library; returns (structuredContent, the input request keys seen)."""
    target = ServerTarget(url=url)
    extension = TasksExtension()
    keys: list[str] = []
    options: dict[str, Any] = {}
    if model is not None:
        options = {"sampling_callback": model, "sampling_capabilities": SAMPLING_WITH_TOOLS if tools else None}
    out: dict[str, Any] = {}

    async def body() -> None:
        async with connect(target, extension, **options) as client:
            handle = await extension.start(client, "code_review", arguments)
            final = await handle.wait(on_update=lambda task: keys.extend(task.input_requests or {}))
            assert final.status == "completed", final
            result = await handle.result()
            assert not result.is_error, result
            out.update(result.structured_content or {})

    run(body)
    return out, keys


def run(body: Callable[[], Awaitable[None]], timeout: float = 90) -> None:
    async def bounded() -> None:
        with anyio.fail_after(timeout):
            await body()

    anyio.run(bounded)


def by_source(result: dict[str, Any], source: str) -> list[tuple[str, int | None, str]]:
    return [(f["file"], f["line"], f["rule"]) for f in result["findings"] if f["source"] == source]


def test_the_tool_is_listed_with_its_schemas(url: str) -> None:
    async def body() -> None:
        async with connect(ServerTarget(url=url), TasksExtension()) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            schema = tools["code_review"]
            assert schema.input_schema["required"] == ["path"]
            assert {"path", "focus", "max_turns"} == set(schema.input_schema["properties"])
            assert {"findings", "duplicates", "summary", "turns", "tokens", "model_review"} <= set(
                (schema.output_schema or {})["properties"]
            )

    run(body)


def test_without_sampling_the_deterministic_findings_come_back_and_the_model_review_is_skipped(url: str) -> None:
    result, _ = review(url, {"path": "pkg"})
    assert (result["model_review"], result["turns"], result["files_reviewed"]) == ("skipped", 0, 3)
    assert "did not declare the sampling capability" in result["model_review_note"]
    assert (
        result["summary"].startswith("Model review skipped")
        and "1 duplicate block, 2 ruff findings and 1 house-rule finding" in result["summary"]
    )
    (block,) = result["duplicates"]
    assert block["kind"] == "renamed" and block["lines"] == 8
    assert [(o["file"], o["start_line"], o["end_line"]) for o in block["occurrences"]] == [
        ("pkg/invoices.py", 6, 13), ("pkg/orders.py", 6, 13),
    ]  # fmt: skip
    assert by_source(result, "duplicates") == [("pkg/invoices.py", 6, "duplicate-code")]
    assert by_source(result, "lint") == [("pkg/util.py", 3, "F401"), ("pkg/util.py", 4, "F401")]
    assert by_source(result, "rules") == [("pkg/util.py", UTIL_EXCEPT_LINE, "no-broad-except")]
    assert result["house_rules"] == [".review.md"] and result["tokens"] == {"input": 0, "output": 0, "estimated": False}


def test_a_client_that_declines_gets_the_deterministic_findings(url: str) -> None:
    model = ScriptedModel(CreateMessageResult.model_validate(declined_sampling("the user said no")))
    result, _ = review(url, {"path": "pkg"}, model)
    assert result["model_review"] == "skipped" and "the user said no" in result["model_review_note"]
    assert len(model.requests) == 1 and by_source(result, "rules") and by_source(result, "model") == []


def test_a_multi_turn_review_runs_the_tools_the_model_asks_for(url: str) -> None:
    model = ScriptedModel(
        use("read", "read-1", file="pkg/orders.py", start=1, end=20),
        use("search", "search-1", pattern="except Exception", path="."),
        submit("Extract the shared loader; narrow the except.",
               {"file": "pkg/util.py", "line": UTIL_EXCEPT_LINE, "rule": "no-broad-except", "severity": "warning",
                "message": "hides the real error", "suggestion": "catch OSError"},
               {"file": "pkg/imaginary.py", "line": 1, "message": "a file that does not exist"}),
    )  # fmt: skip
    result, keys = review(url, {"path": "pkg", "focus": "error handling", "max_turns": 5}, model)
    assert (result["model_review"], result["turns"], result["model"]) == ("completed", 3, "scripted-model")
    assert result["summary"] == "Extract the shared loader; narrow the except."
    assert by_source(result, "model") == [("pkg/util.py", UTIL_EXCEPT_LINE, "no-broad-except")]
    assert result["dropped_findings"] == 1
    assert result["tokens"] == {"input": 3000, "output": 60, "estimated": False}
    first, second, third = model.requests
    assert {tool.name for tool in first.tools or []} == TOOL_NAMES
    assert all(r.tool_choice and r.tool_choice.mode == "auto" for r in model.requests)
    assert "error handling" in first.messages[0].content_as_list[0].text  # type: ignore[union-attr]
    assert "no-broad-except" in first.messages[0].content_as_list[0].text  # type: ignore[union-attr]
    # Each turn carries the conversation: the model's tool_use, then the worker's tool_result.
    assert [m.role for m in third.messages] == ["user", "assistant", "user", "assistant", "user"]
    read_result = second.messages[-1].content_as_list[0]
    assert read_result.type == "tool_result" and read_result.tool_use_id == "read-1"
    assert "def order_total(path):" in read_result.content[0].text  # type: ignore[union-attr]
    search_result = third.messages[-1].content_as_list[0]
    assert f"pkg/util.py:{UTIL_EXCEPT_LINE}:" in search_result.content[0].text  # type: ignore[union-attr]
    # Every turn was a sampling request of its own in inputRequests, seen while the task was input_required.
    assert sorted(set(keys)) == ["sample-1", "sample-2", "sample-3"]


def test_the_review_ends_when_max_turns_runs_out(url: str) -> None:
    model = ScriptedModel(use("read", "again", file="pkg/util.py"))  # never submits, even when told to stop
    result, _ = review(url, {"path": "pkg/util.py", "max_turns": 3}, model)
    assert (result["model_review"], result["turns"]) == ("max_turns", 3)
    assert "still using tools after 3 turns" in result["model_review_note"]
    assert [r.tool_choice.mode for r in model.requests if r.tool_choice] == ["auto", "auto", "none"]
    assert "last turn" in (model.requests[-1].system_prompt or "")
    assert len(model.requests[-1].messages) == 5  # the last turn's tool call was not run: no sixth message
    assert by_source(result, "rules") == [("pkg/util.py", UTIL_EXCEPT_LINE, "no-broad-except")]


def test_a_client_that_samples_without_tools_gets_one_turn_with_the_code(url: str) -> None:
    answer = {"summary": "Narrow the except.", "findings": [{"file": "pkg/util.py", "line": 11, "message": "broad"}]}
    model = ScriptedModel(text_reply(f"Here it is:\n```json\n{json.dumps(answer)}\n```"))
    result, _ = review(url, {"path": "pkg/util.py"}, model, tools=False)
    assert (result["model_review"], result["turns"], result["summary"]) == ("completed", 1, "Narrow the except.")
    (request,) = model.requests
    assert request.tools is None and request.tool_choice is None
    assert "11     except Exception:" in request.messages[0].content_as_list[0].text  # type: ignore[union-attr]
    assert by_source(result, "model") == [("pkg/util.py", 11, "review")]


def celery_status(env: dict[str, str], task_id: str) -> str | None:
    from jobs import app

    raw = redis.Redis.from_url(env["CELERY_RESULT_BACKEND"]).get(app.backend.get_key_for_task(task_id))
    return json.loads(raw)["status"] if raw else None


def test_a_cancel_during_a_turn_stops_the_job(url: str, jobs_env: dict[str, str]) -> None:
    handles: list[Any] = []
    cancelled_at: list[float] = []

    async def cancel(params: CreateMessageRequestParams) -> SamplingAnswer:
        await handles[0].cancel()  # while the model "thinks" in turn 2
        cancelled_at.append(time.monotonic())
        return submit("too late")

    model = ScriptedModel(use("read", "r", file="pkg/util.py"), cancel)
    extension = TasksExtension()

    async def body() -> None:
        async with connect(ServerTarget(url=url), extension, sampling_callback=model,
                           sampling_capabilities=SAMPLING_WITH_TOOLS) as client:  # fmt: skip
            handles.append(await extension.start(client, "code_review", {"path": "pkg"}))
            final = await handles[0].wait()
            assert final.status == "cancelled", final

    run(body)
    task_id = handles[0].task_id
    wait_for(lambda: celery_status(jobs_env, task_id) == "REVOKED", 10, 0.01, "the job to stop")
    assert len(model.requests) == 2  # no third turn


def test_the_server_accepts_tool_use_answers_only_for_the_tools_offered(url: str) -> None:
    """Answers reach the job through the server's one validation path (CreateMessageResultWithTools here)."""
    client = HttpClient(url)
    try:
        task_id = client.start("code_review", {"path": "pkg/util.py"}, sampling={"tools": {}})
        task = client.wait(task_id, {"input_required"}, timeout=30)
        ((key, request),) = task["inputRequests"].items()
        assert request["method"] == "sampling/createMessage" and request["params"]["toolChoice"] == {"mode": "auto"}
        bad = {
            "role": "assistant",
            "model": "m",
            "content": [{"type": "tool_use", "id": "x", "name": "rm", "input": {}}],
        }
        client.result("tasks/update", {"taskId": task_id, "inputResponses": {key: bad}})
        assert list(client.get(task_id)["inputRequests"]) == [key]  # refused: still outstanding
        good = {"role": "assistant", "model": "m", "content": [{"type": "text", "text": '{"summary": "fine"}'}]}
        client.result("tasks/update", {"taskId": task_id, "inputResponses": {key: good}})
        result = client.wait(task_id, timeout=30)["result"]["structuredContent"]
        assert (result["model_review"], result["summary"], result["turns"]) == ("completed", "fine", 1)
    finally:
        client.close()


def test_a_path_outside_the_root_fails_with_invalid_params(url: str) -> None:
    async def body() -> None:
        async with connect(ServerTarget(url=url), TasksExtension()) as client:
            for path, message in [("../outside", "escapes"), ("escape", "outside"), ("/etc", "absolute")]:
                with pytest.raises(TaskFailedError) as failed:
                    await client.call_tool("code_review", {"path": path})
                assert failed.value.error.code == -32602 and message in failed.value.error.message

    run(body)


# --- end to end from the command line: --sampling-command, --sampling-url, typing ----------------------


def cli_review(url: str, arguments: dict[str, Any], tmp_path: Path, *sampling: str) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, "MCP_CELERY_CLIENT_JOURNAL": str(tmp_path / "tasks.db"), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "mcp_celery", "call", "code_review", "--url", url, "--args", json.dumps(arguments)]
    done = subprocess.run([*argv, *sampling, "--json"], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=90, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.stdout, done.stderr
    task = json.loads(done.stdout)
    return done.returncode, task["result"]["structuredContent"] if "result" in task else task


def test_the_sampling_command_answers_every_turn(url: str, tmp_path: Path) -> None:
    command = f"{sys.executable} tests/support/scripted_model.py"
    code, result = cli_review(url, {"path": "pkg"}, tmp_path, "--sampling-command", command)
    assert code == 0 and (result["model_review"], result["turns"], result["model"]) == (
        "completed", 2, "scripted-command",
    )  # fmt: skip
    assert by_source(result, "model") == [("pkg/util.py", UTIL_EXCEPT_LINE, "no-broad-except")]
    assert result["tokens"]["estimated"] is True  # a command reports no usage
    code, result = cli_review(url, {"path": "pkg"}, tmp_path, "--sampling-command", f"{sys.executable} -c 'exit(3)'")
    assert code == 0 and result["model_review"] == "skipped" and "exited with status 3" in result["model_review_note"]


class ChatCompletions(ThreadingHTTPServer):
    """A tiny OpenAI-compatible endpoint on 127.0.0.1: asks to read pkg/util.py, then answers with a review."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", free_port()), _ChatHandler)
        self.requests: list[dict[str, Any]] = []

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(body)
        usage = {"prompt_tokens": 700 + len(self.requests), "completion_tokens": 30}
        if not any(m["role"] == "tool" for m in body["messages"]):
            call = {"id": "call_1", "type": "function",
                    "function": {"name": "read", "arguments": json.dumps({"file": "pkg/util.py"})}}  # fmt: skip
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            return {"model": body["model"], "choices": [{"message": message, "finish_reason": "tool_calls"}],
                    "usage": usage}  # fmt: skip
        finding = {"file": "pkg/util.py", "line": UTIL_EXCEPT_LINE, "rule": "no-broad-except", "message": "too broad"}
        review = {"summary": "Narrow the except in read_config.", "findings": [finding]}
        message = {"role": "assistant", "content": f"```json\n{json.dumps(review)}\n```"}
        return {"model": body["model"], "choices": [{"message": message, "finish_reason": "stop"}], "usage": usage}


class _ChatHandler(BaseHTTPRequestHandler):
    server: ChatCompletions

    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        status, answer = (200, self.server.reply(body)) if self.path == "/v1/chat/completions" else (404, {})
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def chat() -> Iterator[ChatCompletions]:
    server = ChatCompletions()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_an_openai_compatible_endpoint_answers_with_tool_calls(url: str, tmp_path: Path, chat: ChatCompletions) -> None:
    endpoint = f"http://127.0.0.1:{chat.server_address[1]}/v1"
    sampling = ("--sampling-url", endpoint, "--sampling-model", "qwen-test")
    code, result = cli_review(url, {"path": "pkg", "max_turns": 4}, tmp_path, *sampling)
    assert code == 0 and (result["model_review"], result["turns"], result["model"]) == ("completed", 2, "qwen-test")
    assert result["summary"] == "Narrow the except in read_config."
    assert by_source(result, "model") == [("pkg/util.py", UTIL_EXCEPT_LINE, "no-broad-except")]
    assert result["tokens"] == {"input": 701 + 702, "output": 60, "estimated": False}
    first, second = chat.requests
    assert first["model"] == "qwen-test" and first["tool_choice"] == "auto" and first["messages"][0]["role"] == "system"
    assert {t["function"]["name"] for t in first["tools"]} == TOOL_NAMES
    assert first["tools"][1]["function"]["parameters"]["required"] == ["file"]
    assistant, tool = second["messages"][-2:]
    assert assistant["tool_calls"][0]["id"] == "call_1" and tool["tool_call_id"] == "call_1"
    assert "except Exception:" in tool["content"]
    # Nothing listening at the URL: the answer is declined, the review still comes back.
    dead = ("--sampling-url", f"http://127.0.0.1:{free_port()}/v1", "--sampling-model", "qwen-test")
    code, result = cli_review(url, {"path": "pkg/util.py"}, tmp_path, *dead)
    assert code == 0 and result["model_review"] == "skipped" and "cannot be reached" in result["model_review_note"]
    assert by_source(result, "rules") == [("pkg/util.py", UTIL_EXCEPT_LINE, "no-broad-except")]


def test_at_a_terminal_the_person_types_the_models_turns(url: str, tmp_path: Path) -> None:
    env = {**os.environ, "MCP_CELERY_CLIENT_JOURNAL": str(tmp_path / "tasks.db"), "PYTHONPATH": str(ROOT)}
    args = [
        "-m",
        "mcp_celery",
        "call",
        "code_review",
        "--url",
        url,
        "--args",
        '{"path": "pkg/util.py", "max_turns": 2}',
    ]
    child = pexpect.spawn(sys.executable, args, env=env, cwd=str(ROOT), encoding="utf-8", timeout=60,
                          dimensions=(24, 200))  # fmt: skip
    child.expect("you answer as the model")
    child.expect(r"reply \(or /tool NAME")
    child.sendline('/tool read {"file": "pkg/util.py", "start": 11, "end": 11}')
    child.expect(r"\[tool result typed-\w+\] pkg/util.py lines 11-11 of 12:\s+11\s+except Exception:")
    child.expect("reply")
    child.sendline('{"summary": "typed at the terminal", "findings": []}')
    child.expect("typed at the terminal")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
