"""Tool definitions: schemas, validation at import time, the public surface and the tiers."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from celery import Celery

import mcp_celery
from mcp_celery.core.binding import AppBinding
from mcp_celery.core.celery_app import load_app
from mcp_celery.core.tools import registry
from mcp_celery.settings import Settings
from mcp_celery.store.schema import Keys
from mcp_celery.worker.config import worker_settings
from tests.support.harness import ROOT, Process


def make_app(**conf: Any) -> Celery:
    app = Celery("t", broker="memory://", backend="redis://127.0.0.1:6379/13", set_as_current=False)
    app.conf.update(conf)
    return app


def test_bad_signatures_fail_at_definition_time_with_a_reason() -> None:
    app = make_app()
    with pytest.raises(mcp_celery.ToolDefinitionError, match="variadic"):

        @mcp_celery.tool(app)
        def star(*args: int) -> None: ...

    with pytest.raises(mcp_celery.ToolDefinitionError, match="task mode"):

        @mcp_celery.tool(app, task_mode="sometimes")  # type: ignore[arg-type]
        def mode() -> None: ...

    with pytest.raises(mcp_celery.ToolDefinitionError, match="JSON schema"):

        @mcp_celery.tool(app)
        def unschemable(thing: object.__class__) -> None: ...  # type: ignore[valid-type]


def test_tool_names_must_be_unique_per_app() -> None:
    app = make_app()

    @mcp_celery.tool(app, name="same")
    def one() -> None: ...

    with pytest.raises(mcp_celery.ToolDefinitionError, match="taken"):

        @mcp_celery.tool(app, name="same")
        def two() -> None: ...


def test_options_reach_celery_and_the_tool_spec() -> None:
    app = make_app()

    @mcp_celery.tool(app, name="n", title="T", description="D", task_mode="required", queue="q", time_limit=7)
    def fn(ctx: mcp_celery.JobContext, x: int = 1) -> int:
        return x

    spec = registry(app)["n"]
    assert (spec.title, spec.description, spec.task_mode, spec.context_param) == ("T", "D", "required", "ctx")
    assert spec.celery_task.queue == "q" and spec.celery_task.time_limit == 7
    assert spec.to_wire()["inputSchema"]["properties"] == {"x": {"default": 1, "title": "X", "type": "integer"}}


def test_a_misspelled_option_is_refused_at_decoration_time_naming_the_one_meant() -> None:
    app = make_app()
    with pytest.raises(mcp_celery.ToolDefinitionError, match="'inlines_s'; did you mean 'inline_s'"):

        @mcp_celery.tool(app, inlines_s=5)
        def typo() -> None: ...

    with pytest.raises(
        mcp_celery.ToolDefinitionError, match="'terminate_on_cancle'; did you mean 'terminate_on_cancel'"
    ):

        @mcp_celery.tool(app, terminate_on_cancle=True)
        def typo_too() -> None: ...

    assert "typo" not in registry(app) and "typo_too" not in registry(app)
    task = app.task(name="plain.add", shared=False)(lambda x: x)
    with pytest.raises(mcp_celery.ToolDefinitionError, match="'park_after'; did you mean 'park_after_s'"):
        mcp_celery.expose(task, park_after=5)
    with pytest.raises(TypeError, match="'colour'"):
        mcp_celery.expose(task, colour="red")
    assert registry(app) == {}


def test_a_dedupe_window_is_set_per_tool_its_misspellings_and_negative_ones_refused() -> None:
    app = make_app()

    @mcp_celery.tool(app, dedupe_s=30)
    def deploy() -> None: ...

    def push(x: int) -> int:
        return x

    task = app.task(name="plain.push", shared=False)(push)
    mcp_celery.expose(task, dedupe_s=5)
    assert (registry(app)["deploy"].dedupe_s, registry(app)["push"].dedupe_s) == (30, 5)
    with pytest.raises(mcp_celery.ToolDefinitionError, match="'dedup_s'; did you mean 'dedupe_s'"):

        @mcp_celery.tool(app, dedup_s=30)
        def typo() -> None: ...

    with pytest.raises(mcp_celery.ToolDefinitionError, match="'dedupe'; did you mean 'dedupe_s'"):
        mcp_celery.expose(task, dedupe=5)
    with pytest.raises(mcp_celery.ToolDefinitionError, match="dedupe_s must be a number of seconds"):

        @mcp_celery.tool(app, dedupe_s=-1)
        def negative() -> None: ...


def test_celerys_own_task_options_still_pass_through_even_when_they_look_like_ours() -> None:
    app = make_app()

    @mcp_celery.tool(app, queue="q", acks_late=True, time_limit=30, retry_on_worker_lost=True, name="kept")
    def kept() -> None: ...

    task = registry(app)["kept"].celery_task
    assert (task.queue, task.acks_late, task.time_limit, task.retry_on_worker_lost) == ("q", True, 30, True)


def test_a_tool_called_the_plain_celery_way_runs_eagerly_with_a_detached_context() -> None:
    app = make_app(task_always_eager=True)

    @mcp_celery.tool(app)
    def double(ctx: mcp_celery.JobContext, x: int) -> int:
        ctx.check_cancelled()  # detached context: never cancelled
        with pytest.raises(mcp_celery.InputNotSupported):
            ctx.elicit("?", {"type": "object"})
        return 2 * x

    assert double.delay(x=21).get() == 42  # type: ignore[attr-defined]


def test_a_tool_called_the_plain_celery_way_runs_on_a_prefork_worker_without_an_mcp_task(
    worker: Process, store_redis: redis.Redis
) -> None:
    from tests.support import sample_jobs

    called = sample_jobs.detached_probe.delay(x=21)
    done = called.get(timeout=30)
    # Run by a pool process of the session's worker, with a detached context.
    assert done == {"double": 42, "attached": False, "elicit": "InputNotSupported", "parent_pid": worker.proc.pid}
    assert not store_redis.exists(Keys().task(called.id))  # no task record was made for it


def test_ttl_comes_from_result_expires_and_is_never_below_a_minute() -> None:
    assert AppBinding.create(make_app(), Settings()).lifetimes.ttl_ms == 86_400_000  # Celery's default: one day
    assert AppBinding.create(make_app(result_expires=7200), Settings()).lifetimes.ttl_ms == 7_200_000
    assert AppBinding.create(make_app(result_expires=None), Settings()).lifetimes.ttl_ms is None
    with pytest.raises(mcp_celery.ConfigurationError, match="at least 60"):
        AppBinding.create(make_app(result_expires=30), Settings())


def test_without_redis_for_its_state_the_error_says_exactly_what_to_set() -> None:
    for backend in ("cache+memory://", "db+postgresql://celery:secret@db/celery", None):
        app = Celery("t", broker="memory://", backend=backend, set_as_current=False)
        with pytest.raises(mcp_celery.ConfigurationError, match="set MCP_CELERY_REDIS_URL") as raised:
            AppBinding.create(app, Settings())
        assert "secret" not in str(raised.value) and "\n" not in str(raised.value)
        own = AppBinding.create(app, Settings(redis_url="redis://127.0.0.1:6379/3"))
        assert own.redis_url == "redis://127.0.0.1:6379/3"
    redis_backed = Celery("t", broker="memory://", backend="redis://127.0.0.1:6379/5", set_as_current=False)
    assert AppBinding.create(redis_backed, Settings()).redis_url == "redis://127.0.0.1:6379/5"


def test_dash_a_takes_a_module_or_module_colon_app_like_celery() -> None:
    from tests.support import sample_jobs

    assert load_app("tests.support.sample_jobs") is sample_jobs.app
    assert load_app("tests.support.sample_jobs:app") is sample_jobs.app
    with pytest.raises(mcp_celery.ConfigurationError, match="cannot import"):
        load_app("tests.no_such_module")
    with pytest.raises(mcp_celery.ConfigurationError, match="no Celery app"):
        load_app("tests.support.sample_jobs:markers")


def test_serve_reports_configuration_errors_without_a_traceback() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.no_such_module"], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "cannot import 'tests.no_such_module'" in out.stderr and "Traceback" not in out.stderr


def test_exposing_a_task_whose_module_was_not_imported_is_one_line_saying_so(tmp_path: Path) -> None:
    (tmp_path / "unimported.py").write_text(
        "from celery import Celery\nimport mcp_celery\n"
        "app = Celery('unimported', broker='memory://', backend='redis://127.0.0.1:6379/13')\n"
        "mcp_celery.expose(app.tasks['proj.tasks.add'])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    out = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "serve", "-A", "unimported"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip() == (
        "mcp-celery: importing 'unimported': Celery has no task 'proj.tasks.add'; import the module that defines "
        "it first (or pass the task itself to mcp_celery.expose)"
    )


def test_one_setting_for_the_longest_job_sets_the_time_limit_and_the_records_life(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = make_app()
    mcp_celery.configure_app(app, max_job=timedelta(hours=2))
    assert app.conf.task_time_limit == 7200
    lifetimes = AppBinding.create(app, Settings()).lifetimes
    assert lifetimes.max_job_s == 7200 and lifetimes.live_s == 86_400 + 7200  # TTL plus the longest job

    monkeypatch.setenv("MCP_CELERY_MAX_JOB_S", "600")
    worker_settings.cache_clear()  # read once per process: this test changes the environment within one
    from_env = make_app()
    mcp_celery.configure_app(from_env)
    assert from_env.conf.task_time_limit == 600
    assert AppBinding.create(from_env, Settings()).lifetimes.max_job_s == 600

    monkeypatch.delenv("MCP_CELERY_MAX_JOB_S")
    worker_settings.cache_clear()
    plain = make_app(task_time_limit=None)
    assert AppBinding.create(plain, Settings()).lifetimes.max_job_s == 6 * 3600  # no limit anywhere: 6 h
    mcp_celery.configure_app(plain)
    assert plain.conf.task_time_limit == 6 * 3600

    own = make_app(task_time_limit=900)  # the app's own hard limit is kept, and sets the visibility timeout
    mcp_celery.configure_app(own)
    assert own.conf.task_time_limit == 900 and own.conf.broker_transport_options["visibility_timeout"] == 1800
    assert AppBinding.create(own, Settings()).lifetimes.max_job_s == 900


def test_retry_on_worker_loss_acks_late_and_needs_a_time_limit_below_the_visibility_timeout() -> None:
    app = Celery("t", broker="redis://127.0.0.1:6379/12", backend="redis://127.0.0.1:6379/13", set_as_current=False)
    mcp_celery.configure_app(app, max_job=timedelta(hours=1))

    @mcp_celery.tool(app, retry_on_worker_loss=True)
    def again() -> None: ...

    @mcp_celery.tool(app)
    def once() -> None: ...

    tools = registry(app)
    assert tools["again"].redelivered_on_loss and not tools["once"].redelivered_on_loss
    task: Any = tools["again"].celery_task
    assert task.acks_late and task.reject_on_worker_lost and not task.retry_on_worker_lost
    assert task.mcp_celery_max_reruns == 3  # a job that kills its worker every time ends after 3 runs again
    # Every place Celery's Redis docs name holds the same visibility timeout, twice the longest job.
    assert app.conf.broker_transport_options["visibility_timeout"] == 7200
    assert app.conf.result_backend_transport_options["visibility_timeout"] == 7200
    assert app.conf.visibility_timeout == 7200

    with pytest.raises(mcp_celery.ToolDefinitionError, match="visibility timeout"):

        @mcp_celery.tool(app, retry_on_worker_loss=True, time_limit=3 * 3600)
        def longer_than_the_timeout() -> None: ...

    with pytest.raises(mcp_celery.ToolDefinitionError, match="acks_late=True"):

        @mcp_celery.tool(app, retry_on_worker_loss=True, acks_late=False)
        def early() -> None: ...

    @app.task
    def plain(x: int) -> int:
        return x

    mcp_celery.expose(plain, retry_on_worker_loss=5)
    assert registry(app)["plain"].redelivered_on_loss and cast(Any, plain).mcp_celery_max_reruns == 5

    with pytest.raises(mcp_celery.ToolDefinitionError, match="positive count"):

        @mcp_celery.tool(app, retry_on_worker_loss=-1)
        def negative() -> None: ...

    # Without configure_app a Redis broker's timeout is kombu's hour and nothing limits a job. configure_app
    # may still come, so the tool is refused when a server is built (and when a worker starts).
    bare = Celery("b", broker="redis://127.0.0.1:6379/12", backend="redis://127.0.0.1:6379/13", set_as_current=False)

    @mcp_celery.tool(bare, retry_on_worker_loss=True)
    def unlimited() -> None: ...

    with pytest.raises(mcp_celery.ToolDefinitionError, match="hard time limit"):
        mcp_celery.create_server(bare, Settings())

    # RabbitMQ has no visibility timeout: only its consumer_timeout, which is broker configuration.
    rabbit = Celery("r", broker="amqp://guest@127.0.0.1//", backend="redis://127.0.0.1:6379/13", set_as_current=False)

    @mcp_celery.tool(rabbit, retry_on_worker_loss=True)
    def on_rabbit() -> None: ...

    assert registry(rabbit)["on_rabbit"].redelivered_on_loss


def test_a_tool_belongs_to_its_own_app_only() -> None:
    """Celery shares tasks with every app finalized later; two apps defining one tool would then clash."""
    mine = Celery("mine", broker="memory://", set_as_current=False)

    @mcp_celery.tool(mine, name="only_mine")
    def only_mine() -> str:
        return "mine"

    other = Celery("other", broker="memory://", set_as_current=False)
    other.finalize()
    assert only_mine.name in mine.tasks and only_mine.name not in other.tasks


def test_configure_app_before_or_after_the_decorators_gives_the_same_tools() -> None:
    """Celery copies task_time_limit, task_track_started, task_acks_late and task_serializer into a task
    when it is defined; a tool defined before configure_app follows configure_app all the same."""
    settled = ("time_limit", "soft_time_limit", "track_started", "acks_late", "serializer")

    def define(app: Celery) -> tuple[Any, Any, Any]:
        @mcp_celery.tool(app)
        def plain() -> None: ...

        @mcp_celery.tool(app, time_limit=100)
        def own_limit() -> None: ...

        @mcp_celery.tool(app, soft_time_limit=5, acks_late=True)
        def own_soft() -> None: ...

        return plain, own_limit, own_soft

    # An app that had its own settings before, all of which configure_app replaces.
    before_settings = {"task_time_limit": 30, "task_track_started": False, "task_acks_late": True}
    first = make_app(**before_settings)
    mcp_celery.configure_app(first, max_job=timedelta(hours=2))
    configured_first = define(first)
    later = make_app(**before_settings)
    defined_first = define(later)
    mcp_celery.configure_app(later, max_job=timedelta(hours=2))

    for one, other in zip(configured_first, defined_first, strict=True):
        assert [getattr(one, a) for a in settled] == [getattr(other, a) for a in settled], one.name
    plain, own_limit, own_soft = defined_first
    assert (plain.time_limit, plain.soft_time_limit) == (7200, 7140)  # a minute before the hard limit
    # A tool never stores Celery's STARTED (its record shows the job running); the rest follow configure_app.
    assert plain.track_started is False and plain.acks_late is False and plain.serializer == "json"
    assert (own_limit.time_limit, own_limit.soft_time_limit) == (100, 90)  # 90% of a short limit
    assert (own_soft.time_limit, own_soft.soft_time_limit, own_soft.acks_late) == (7200, 5, True)


def test_an_at_least_once_tool_defined_before_configure_app_is_checked_when_it_runs() -> None:
    app = Celery("t", broker="redis://127.0.0.1:6379/12", backend="redis://127.0.0.1:6379/13", set_as_current=False)

    @mcp_celery.tool(app, retry_on_worker_loss=True)
    def fits() -> None: ...  # no limit yet: configure_app gives it one below the visibility timeout

    mcp_celery.configure_app(app, max_job=timedelta(hours=1))
    assert registry(app)["fits"].celery_task.time_limit == 3600

    other = Celery("u", broker="redis://127.0.0.1:6379/12", backend="redis://127.0.0.1:6379/13", set_as_current=False)

    @mcp_celery.tool(other, retry_on_worker_loss=True, time_limit=3 * 3600)
    def too_long() -> None: ...

    with pytest.raises(mcp_celery.ToolDefinitionError, match="'too_long'.*visibility timeout"):
        mcp_celery.configure_app(other, max_job=timedelta(hours=1))
