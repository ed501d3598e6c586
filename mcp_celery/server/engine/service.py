"""The task service: every way a client reaches a task goes through here.

Server tier, below every surface. The SEP-2663 wire (`creation`, `handlers`, `listen`), the plain
call with its inline window (`plain`) and the lifecycle tools (`lifecycle`) each translate shapes
and nothing else: creating a task (quota, record, message), finding one for a caller (the owner
check that makes unknown, expired and foreign ids look alike), its MCP view (`mcp_celery.core.status`,
the one status table), answering its questions (the one validation of answers) and cancelling it
are written once, here.

Every operation reads and writes Redis only; nothing about a task lives in this process's memory,
so any number of replicas serve the same tasks and a restart loses nothing. The one in-process
thing is a timer per cancel that, after the grace period, terminates a started job that opted in
(the read path reports the task cancelled on its own, timer or not).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
from anyio.abc import TaskGroup
from kombu.utils import json as kombu_json
from mcp.shared.exceptions import MCPError
from redis.exceptions import RedisError

from mcp_celery import tracing
from mcp_celery.core import approvals
from mcp_celery.core.binding import STORE_HEADER, AppBinding
from mcp_celery.core.canvas import show_revoked
from mcp_celery.core.status import (
    CANCELLED_BEFORE_START,
    CANCELLED_WHILE_PARKED,
    Found,
    TaskView,
    expired,
    lost_entry,
    task_view,
)
from mcp_celery.core.tools import ToolSpec, redelivered_on_loss, registry
from mcp_celery.inputs import Answered, invalid_answer_reason
from mcp_celery.protocol import INTERNAL_ERROR, new_task_id, now_ms
from mcp_celery.server.edge import limits
from mcp_celery.server.engine import workflow
from mcp_celery.server.engine.artifacts import Artifact, ArtifactReader
from mcp_celery.server.engine.events import TaskEvents
from mcp_celery.server.engine.gate import PolicyGate
from mcp_celery.server.engine.publish import Publisher
from mcp_celery.server.engine.reaper import Reaper
from mcp_celery.server.engine.repeats import Repeats
from mcp_celery.server.ops import observe
from mcp_celery.server.ops.deployment_metrics import DeploymentCollector, DeploymentFigures
from mcp_celery.server.ops.diagnostics import report_on_signal
from mcp_celery.store.aio import AsyncStore, CallClaim, NotReplicated
from mcp_celery.store.artifact_files import fsspec_store
from mcp_celery.store.artifacts import ArtifactMeta
from mcp_celery.store.connect import async_client
from mcp_celery.store.output import render as render_output
from mcp_celery.store.schema import TaskRecord

__all__ = ["Found", "TaskService"]

logger = logging.getLogger(__name__)


class TaskService:
    """Creates, finds, answers and cancels tasks for every surface; lives as long as the server."""

    def __init__(self, binding: AppBinding) -> None:
        self.binding = binding
        self.settings = binding.settings
        self._store: AsyncStore | None = None
        self._events: TaskEvents | None = None
        self._tg: TaskGroup | None = None
        self._reaper: Reaper | None = None
        #: The deployment's figures for /metrics, kept up to date while the server runs (`deployment_metrics`).
        self.deployment_collector = DeploymentCollector(streams=binding.redis.topology != "cluster")
        self._publisher: Publisher | None = None
        self._state_secret: bytes | None = None
        self._artifacts: ArtifactReader | None = None
        self._repeats: Repeats | None = None
        #: MCP_CELERY_APPROVAL_POLICY: the calls held for a person's approval before their job is queued.
        self.gate = PolicyGate(self.settings, self.tools, binding.app)

    @property
    def tools(self) -> dict[str, ToolSpec]:
        return registry(self.binding.app)

    @property
    def app(self) -> Any:
        """The Celery app the tools are tasks of."""
        return self.binding.app

    @property
    def store(self) -> AsyncStore:
        if self._store is None:
            # Bounded, so that a burst of requests cannot open a connection each; named, so that an
            # operator's CLIENT LIST tells which server process holds which connection.
            client = async_client(
                self.binding.redis,
                max_connections=self.settings.redis_max_connections,
                client_name=f"mcp-celery-server:{os.getpid()}",
            )
            binding = self.binding
            self._store = AsyncStore(client, binding.keys, binding.lifetimes, binding.durability)
        return self._store

    @property
    def publisher(self) -> Publisher:
        """Queues jobs: natively on a plain Redis broker, else with `apply_async` on a thread."""
        if self._publisher is None:
            self._publisher = Publisher(self.binding.app, self.binding.redis)
        return self._publisher

    @property
    def artifacts(self) -> ArtifactReader:
        """Reads artifacts where MCP_CELERY_ARTIFACTS keeps them (`mcp_celery.server.engine.artifacts`)."""
        if self._artifacts is None:
            self._artifacts = ArtifactReader(
                self.store, fsspec_store(self.settings.artifacts, self.binding.keys.prefix)
            )
        return self._artifacts

    @property
    def state_secret(self) -> bytes:
        """The deployment's key for MRTR `requestState`s (`mcp_celery.server.plain.resume`).

        Raises:
            MCPError: outside the server's lifespan.
        """
        if self._state_secret is None:
            raise MCPError(INTERNAL_ERROR, "the server is not running (no lifespan)")
        return self._state_secret

    @property
    def events(self) -> TaskEvents:
        """The process's one event listener.

        Raises:
            MCPError: outside the server's lifespan (a server that was never run).
        """
        if self._events is None:
            raise MCPError(INTERNAL_ERROR, "the server is not running (no lifespan)")
        return self._events

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The server's lifespan: the event listener and the cancel timers run inside it."""
        # The first command also learns a cluster's slots, which its pub/sub needs before it subscribes.
        self._state_secret = await self.store.state_secret()
        events = self._events = TaskEvents(
            self.store.redis, self.binding.keys.events, sharded=self.binding.redis.sharded
        )
        reaper = self._reaper = Reaper(self, self.store, self.settings, self.binding.app)
        binding, tasks = self.binding, [spec.celery_task for spec in self.tools.values()]
        figures = DeploymentFigures.for_scrapes(
            self.store.redis, binding.keys, binding.app, tasks, self.deployment_collector
        )
        await self.publisher.native()  # connects to the broker now rather than on the first tools/call
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(events.run)
            tg.start_soon(report_on_signal, events)
            tg.start_soon(reaper.run)  # lost jobs and lost messages, every period (`engine.reaper`)
            tg.start_soon(self.artifacts.sweep_every, self.settings.artifact_sweep_s)
            if figures is not None:
                tg.start_soon(figures.run)  # the deployment's figures for /metrics (`deployment_metrics`)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                self._tg = self._events = self._reaper = None
        await events.aclose()
        await reaper.aclose()
        if figures is not None:
            await figures.aclose()
        if self._publisher is not None:
            await self._publisher.aclose()
            self._publisher = None
        if self._store is not None:
            await self._store.aclose()
            self._store = self._artifacts = self._repeats = None

    def first_check_ms(self, created_ms: int) -> int | None:
        """When a new task is first looked at if no job has started: a refusal, then its message (None: outside
        the server's lifespan, no reaper)."""
        return None if self._reaper is None else self._reaper.first_check_ms(created_ms)

    # ------------------------------------------------------------------ creating

    def new_record(
        self,
        spec: ToolSpec,
        *,
        owner: str,
        capabilities: dict[str, Any],
        first_answers: dict[str, Any] | None = None,
        sync: bool = False,
        plain: bool = False,
    ) -> TaskRecord:
        """A new task's record (not written yet: `create` writes it and queues the job)."""
        return TaskRecord(
            task_id=new_task_id(),
            tool=spec.name,
            created_ms=now_ms(),
            ttl_ms=self.gate.ttl_ms(spec.name, self.binding.lifetimes.ttl_ms),  # covers an approval's window
            poll_ms=self.settings.poll_interval_ms,
            capabilities=capabilities,
            owner=owner,
            sync=sync,
            plain=plain,
            first_answers=first_answers or {},
        )

    async def create(
        self, spec: ToolSpec, record: TaskRecord, arguments: dict[str, Any], *, claim: CallClaim | None = None
    ) -> str | None:
        """Write the record, then queue the job: both done before this returns, so the task is durable
        (a `tasks/get` succeeds) before its id is handed out; with MCP_CELERY_REDIS_MIN_REPLICAS, on
        that many replicas too. `claim`: a call's claim (`engine.repeats`) taken in the record's round
        trip; when another call holds it, nothing is written or queued, and its claim is returned.

        Raises:
            MCPError: over the owner's live-task quota (nothing written), the job could not be queued, or
                the replicas did not confirm the task in time (it is cancelled then: nothing runs).
        """
        await limits.enforce_quota(self.store, record.owner, self.settings.max_live_tasks_per_principal)
        task_id = record.task_id
        indexed = self.settings.max_live_tasks_per_principal is not None
        if (rule := self.gate.rule_for(spec.name)) is not None:  # the approval policy's: nothing queued yet
            if claim is not None and (held := await self.store.claim_call(claim)) is not None:
                return held  # a held call's claim is taken first, its record written by the gate
            await self.gate.hold(self.store, spec, record, arguments, rule, index=indexed)
            await self._confirm_created(spec, task_id)
            observe.created(task_id, spec.name, record.owner)
            return None
        check_at_ms = self.first_check_ms(record.created_ms)
        publisher = self.publisher
        # argsrepr names the tool in Flower (ToolSpec.argsrepr); the headers carry the store the task is in (a
        # worker using another refuses the job, saying so: `mcp_celery.worker.execution`) and the trace context.
        headers = {STORE_HEADER: self.binding.identity, **tracing.message_headers()}
        options = {"kwargs": arguments, "task_id": task_id, "argsrepr": spec.argsrepr, "headers": headers}
        write = partial(self.store.create, record, index=indexed, check_at_ms=check_at_ms, claim=claim)
        try:
            if not await publisher.native():
                if held := await write():
                    return held
                await publisher.publish_on_thread(spec.celery_task, **options)
            else:
                # Built before anything is written: a message that cannot be built leaves nothing behind.
                commands = publisher.build(spec.celery_task, **options)
                # One round trip when the broker is the records' Redis database: record first, then message.
                then = commands if publisher.shares_store else ()
                if held := await write(then=then):
                    return held
                if not publisher.shares_store:
                    await publisher.send(commands)
        except Exception as exc:
            logger.exception("could not queue job for tool %r", spec.name)
            with contextlib.suppress(Exception):  # the record may not exist, or Redis may be what failed
                await self.store.delete(task_id)
            # The broker's error can name its URL, password included: only debug mode shows it, redacted.
            raise MCPError(INTERNAL_ERROR, f"could not queue the job: {limits.describe(exc, self.settings)}") from exc
        await self._confirm_created(spec, task_id)
        observe.created(task_id, spec.name, record.owner)
        return None

    async def create_unless_repeated(
        self, spec: ToolSpec, record: TaskRecord, arguments: dict[str, Any], idempotency_key: str | None
    ) -> Found | None:
        """`create`, unless the call repeats an earlier one of its principal (its idempotency key, or its tool's
        dedupe window: `mcp_celery.server.engine.repeats`): None when `record` was created, else the earlier
        call's task (nothing written or queued). Raises `MCPError`s as `create`, and -32602 for a key reused."""
        if self._repeats is None:
            self._repeats = Repeats(self.store, self.find, self.binding.lifetimes.live_s * 1000, self.settings)
        return await self._repeats.create_unless_repeated(self.create, spec, record, arguments, idempotency_key)

    async def _confirm_created(self, spec: ToolSpec, task_id: str) -> None:
        """Hand the id out only once enough replicas have the task; else cancel it (nothing runs) and say so."""
        try:
            await self.store.confirm_replicated(task_id)
        except NotReplicated as exc:
            logger.warning("task %s: not confirmed on the replicas, cancelling it: %s", task_id, exc)
            with contextlib.suppress(MCPError, RedisError, OSError, NotReplicated):  # as durable as Redis is now
                await self.cancel(task_id, spec)
            raise MCPError(INTERNAL_ERROR, f"{exc}, so it was cancelled: try again") from exc

    # ------------------------------------------------------------------ finding

    async def find(self, principal: str, task_id: str) -> Found | None:
        """The task when it exists and belongs to `principal`; unknown, expired, foreign and impossible
        ids all give None, so a caller learns nothing about tasks that are not its own."""
        # An id longer than any we issue is not looked up: it gets the unknown-task answer.
        if not limits.task_id_acceptable(self.settings, task_id):
            return None
        found = await self.read_view(task_id)
        return found if found is not None and found[0].owner == principal else None

    async def find_artifact(self, principal: str, task_id: str, name: str) -> Artifact | None:
        """The artifact `name` of the task, found as `find` finds the task: None for an unknown, expired or
        foreign task and for a name its record does not list, alike."""
        found = await self.find(principal, task_id)
        meta = None if found is None else found[0].artifacts.get(name)
        return None if meta is None else Artifact(task_id, ArtifactMeta.from_json(name, meta))

    async def find_output(self, principal: str, task_id: str) -> str | None:
        """The task's live output, found as `find` finds the task: None for an unknown, expired or foreign task."""
        found = await self.find(principal, task_id)
        return None if found is None else await self.output_of(found)

    async def output_of(self, found: Found) -> str:
        """The live output of a task the caller found (`find`), as `resources/read` gives it (`store.output`)."""
        dropped, data = await self.store.output(found[0].task_id)
        return render_output(dropped, data, self.settings.output_keep_bytes)

    async def find_many(self, principal: str, task_ids: Sequence[str]) -> dict[str, Found]:
        """`find` of several ids in one round trip: only those that exist and belong to `principal`."""
        acceptable = [task_id for task_id in task_ids if limits.task_id_acceptable(self.settings, task_id)]
        views = await self.read_views(acceptable)
        return {task_id: found for task_id, found in views.items() if found[0].owner == principal}

    async def read_view(self, task_id: str, *, confirmed: bool = False) -> Found | None:
        """The record and MCP view, or None when unknown or expired (no owner check); `confirmed`: `AsyncStore.read`."""
        return await self._view_of(task_id, await self.store.read(task_id, confirmed=confirmed))

    async def read_views(self, task_ids: Sequence[str], *, follow_parent: bool = True) -> dict[str, Found]:
        """`read_view` of several tasks in one round trip; unknown and expired ones are left out."""
        views = {}
        for task_id, record in zip(task_ids, await self.store.read_many(task_ids), strict=True):
            found = await self._view_of(task_id, record, follow_parent=follow_parent)
            if found is not None:
                views[task_id] = found
        return views

    async def _view_of(self, task_id: str, record: TaskRecord | None, *, follow_parent: bool = True) -> Found | None:
        if record is None:
            return None
        if record.workflow is not None and record.final is None:
            return await workflow.view(self, record)
        now = now_ms()
        spec = self.tools.get(record.tool)
        view = task_view(
            record,
            now,
            structured=spec is not None and spec.structured,
            grace_ms=self.grace_ms,
            debug=self.settings.debug,
            redelivered_on_loss=self.redelivered_on_loss(record.tool),
        )
        if view.terminal and record.final is None and record.outcome is None:
            # A terminal state the job did not store (cancelled past the grace period, worker lost)
            # is frozen here, so that a late outcome or a redelivery cannot change it; a stored
            # outcome never changes (the first one wins).
            ended = lost_entry(record, view) if view.lost else None  # only the lost: a job ends the rest
            frozen = await self.store.freeze(task_id, view.to_json(), record.parent, ended)
            if frozen is None:
                return None
            view = TaskView.from_frozen(frozen)
            observe.settled(task_id, record.tool, record.owner, view.status, view.status_message)
            if record.parent is not None and follow_parent:
                await self.read_view(record.parent)  # a lost member: its workflow may take a step now
        if expired(record, view, now):
            return None
        return record, view

    def celery_task(self, name: str) -> Any:
        """The Celery task of tool `name`, or (a workflow's member) the app's Celery task of that name."""
        spec = self.tools.get(name)
        return spec.celery_task if spec is not None else self.binding.app.tasks.get(name)

    def redelivered_on_loss(self, name: str) -> bool:
        """Whether Celery queues the job of tool (or member task) `name` again when its worker is lost."""
        return redelivered_on_loss(self.celery_task(name))

    @property
    def grace_ms(self) -> int:
        """The cancel grace period, in ms."""
        return int(self.settings.cancel_grace_s * 1000)

    def detailed_task(self, found: Found) -> dict[str, Any]:
        """The wire `DetailedTask` (without `resultType`) of a task as just read."""
        record, view = found
        return view.detailed_task(record, now_ms())

    # ------------------------------------------------------------------ acting

    async def answer(self, found: Found, responses: Mapping[str, Any], *, decided_by: str | None = None) -> Answered:
        """Answer the task's outstanding input requests; the one validation every surface shares.

        `decided_by`: the principal signed in on the approval page, which answers approvals only; any
        other surface leaves it None, and its answers to an approval are rejected (the client's answer
        to a URL elicitation decides nothing; `mcp_celery.core.approvals.refusal`).

        Answers under keys that are not outstanding (never issued, answered already, withdrawn) are
        ignored, and answers that do not answer their request are rejected, each request staying
        outstanding; the first answer to a key wins. A workflow's questions are its members': a
        prefixed key (`label/key`) goes to that member. Under MIN_REPLICAS, ignored as the replicas hold it.
        """
        record, view = found
        outstanding = view.status == "input_required" and responses.keys() <= record.inputs.keys()
        if self.store.durability.min_replicas and not outstanding:
            record, view = await self.read_view(record.task_id, confirmed=True) or found
        if view.status != "input_required":
            return Answered(ignored=sorted(responses))
        if record.workflow is not None:
            return await workflow.answer(self, record, view, responses)
        valid: dict[str, str] = {}
        rejected: dict[str, str] = {}
        ignored: list[str] = []
        for key, answer in responses.items():
            request = record.inputs.get(key)
            if request is None:
                ignored.append(key)  # spec SHOULD: not outstanding, whatever it holds
                continue
            reason = invalid_answer_reason(request, answer) or approvals.refusal(request, answer, decided_by)
            if reason:  # not logged: the reason can quote the answer
                logger.info("task %s: answer to %r rejected, request stays outstanding", record.task_id, key)
                rejected[key] = reason
                continue
            valid[key] = json.dumps(answer)
        if valid and record.parked_until_ms is not None and (check_at := self.first_check_ms(now_ms())) is not None:
            # Watched from now on: should this server die between the answer and the resumed message, the
            # reaper finds no message and sends it (Reaper._nowhere), instead of waiting for the question's timeout.
            await self.store.recheck([record.task_id], check_at)
        taken, resume = await self.store.answer(record.task_id, valid, now_ms(), record.parent) if valid else ([], None)
        if resume is not None:
            await self.resume(record, resume)
        ignored += [key for key in valid if key not in taken]  # answered meanwhile by someone else
        still_open = sorted(key for key in record.inputs if key not in taken)
        return Answered(taken=sorted(taken), rejected=rejected, ignored=sorted(ignored), still_open=still_open)

    async def resume(self, record: TaskRecord, signature: str) -> None:
        """Send a parked job's own message again (`mcp_celery.worker.parking`): it runs on any worker.

        Watched as a new task's message is (the reaper looks for it `queue_check_s` later). The answers
        are stored already; should the broker refuse the message (or this server die before it is
        sent), the reaper, with a Redis broker, finds no message and sends it again. A call the approval
        policy held is sent only if its decision lets it run (`PolicyGate.release`).
        """
        if self.gate.holds(record) and not await self.gate.release(self.store, record, signature):
            return
        await self.store.resumed(record.task_id, self.first_check_ms(now_ms()))
        app = self.binding.app
        try:
            await anyio.to_thread.run_sync(lambda: app.signature(kombu_json.loads(signature)).apply_async())
        except Exception:
            logger.exception("task %s: could not send the parked job's message again", record.task_id)
            raise
        observe.resumed(record.task_id, record.tool, record.owner)

    async def cancel_task(self, found: Found) -> None:
        """`tasks/cancel`: cancel a live task once; a finished or already cancelled one is left as it is."""
        record, view = found
        if not view.terminal and record.cancel_ms is None:
            await self.cancel(record.task_id, self.tools.get(record.tool))
            if record.workflow is not None:
                await self.read_view(record.task_id)  # its members are cancelled now, not at the next read

    async def cancel(self, task_id: str, spec: ToolSpec | None, *, channel: str | None = None) -> None:
        """Cancel the task: at once if its job has not started or is parked, else through the flag the
        job checks; `channel`: the task whose listeners hear of it (a workflow member's: its MCP task's).

        Raises:
            NotReplicated: recorded, but not on enough replicas in time (the request handler says so).
        """
        now = now_ms()
        # Which of the two the task is, the store's script decides, atomic with the job's start and
        # its parking: a read before it could be out of date by then.
        before_start = TaskView("cancelled", now, CANCELLED_BEFORE_START).to_json()
        while_parked = TaskView("cancelled", now, CANCELLED_WHILE_PARKED).to_json()
        outcome = await self.store.request_cancel(task_id, now, before_start, while_parked, channel)
        if outcome is None or outcome == "ended":
            return
        observe.cancel_requested(task_id, None if spec is None else spec.name, outcome)
        # Workers drop a queued or reserved copy of the message at once (the frozen state would refuse
        # it anyway, whichever worker gets it); a running job learns of the cancel from the flag.
        await anyio.to_thread.run_sync(lambda: self.binding.app.control.revoke(task_id))
        if outcome == "parked":  # no worker runs it to say so: Celery's backend and Flower hear it here
            app = self.binding.app
            show = partial(anyio.to_thread.run_sync, lambda: show_revoked(app, task_id, CANCELLED_WHILE_PARKED))
            if self._tg is not None:
                self._tg.start_soon(show)  # the task reads cancelled already: no wait for Celery's view
            else:
                await show()
        if outcome == "started" and self._tg is not None and spec is not None and spec.terminate_on_cancel:
            self._tg.start_soon(self._terminate_after_grace, task_id)

    async def _terminate_after_grace(self, task_id: str) -> None:
        await anyio.sleep(self.settings.cancel_grace_s)
        record = await self.store.read(task_id)
        # Only a job that started and has not ended: a terminate reaches whatever the process runs now.
        if record is not None and record.outcome is None and record.alive_until_ms is not None:
            logger.warning("task %s did not stop within the grace period; terminating its worker process", task_id)
            await anyio.to_thread.run_sync(lambda: self.binding.app.control.revoke(task_id, terminate=True))
