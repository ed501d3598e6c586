"""Settings, read from `MCP_CELERY_*` environment variables; constructor keywords win.

Each process builds one Settings and hands it down: the `mcp-celery` command line (`cli.command.main`,
once, for `serve`, `top`, `token` and its own log format; `serve` hands it to `create_server` and the
HTTP app), each server process of `serve --http --workers N` (`http_app_from_env`), a worker
(`mcp_celery.worker.config.worker_settings`, on first use). Nothing reads the environment at import
time, and no command reads an `MCP_CELERY_*` setting from the environment but through it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mcp_celery.errors import ConfigurationError

__all__ = ["Settings"]


class Settings(BaseSettings):
    """mcp-celery's settings.

    Raises:
        ConfigurationError: a value cannot be read; the message names each variable and what it must be.
    """

    model_config = SettingsConfigDict(env_prefix="MCP_CELERY_", extra="ignore")

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:  # one line per setting, not pydantic's dump with its links
            raise ConfigurationError(invalid_settings(exc)) from None

    redis_url: str | None = Field(
        default=None,
        description="Redis for mcp-celery's task state (records, progress, outcomes, answers, events): redis://, "
        "rediss:// (TLS), unix://, sentinel://h1:p1;sentinel://h2:p2 or redis+cluster:// (README: Production Redis). "
        "Default: the Celery app's result backend when that is Redis; required with any other result backend or none.",
    )
    redis_master_name: str | None = Field(
        default=None,
        description="The Sentinel master's name when MCP_CELERY_REDIS_URL is a sentinel:// URL. Default: master_name "
        "in the Celery app's result_backend_transport_options.",
    )
    redis_min_replicas: int = Field(
        default=0,
        ge=0,
        description="Replicas that must confirm a task's creation, an answer and a cancel (Redis WAIT) before they "
        "are acknowledged; fewer within redis_min_replicas_wait_ms is a JSON-RPC error. 0: the primary is enough.",
    )
    redis_min_replicas_wait_ms: int = Field(
        default=2000,
        gt=0,
        le=8000,
        description="Longest wait for those replicas, in ms (below the 10 s every server command may take).",
    )
    redis_max_connections: int = Field(
        default=32,
        ge=2,
        description="Most Redis connections one server process opens (its event listener holds one); "
        "requests beyond that wait for a free one.",
    )
    key_prefix: str = Field(default="mcp-celery", description="Prefix of every Redis key mcp-celery writes.")
    poll_interval_ms: int = Field(default=1000, gt=0, description="pollIntervalMs suggested to clients.")
    cancel_grace_s: float = Field(
        default=5.0,
        ge=0,
        description="Seconds a cancelled job has to reach a checkpoint before it is reported cancelled anyway.",
    )
    tool_fallback: bool = Field(
        default=True,
        description="Serve clients that do not declare the tasks extension with tasks too: a tools/call waits up "
        "to inline_s for its job, then answers with a task handle while the job runs on, and the task_status, "
        "task_respond and task_cancel tools reach the task. False: such calls run synchronously and a job still "
        "running after sync_timeout_s is cancelled.",
    )
    inline_s: float = Field(
        default=20.0,
        gt=0,
        description="How long a tools/call from a client without the tasks extension waits for its job before "
        "it answers with a task handle (the job keeps running); below the 60 s most hosts allow a call. A tool "
        "sets its own with inline_s=. Also the longest wait of task_status(wait_seconds=...).",
    )
    client_windows: dict[str, float] = Field(
        default_factory=dict,
        description="Inline windows by client, as a JSON object: the clientInfo name a client sends -> the longest "
        'a plain call may hold it, in seconds, e.g. {"claude-ai": 50} for a host that allows a call 60 s. Added to '
        "and over the built-in table of measured clients (the Python SDK's name `mcp`: 4 s, below openai-agents' "
        "5 s timeout); `*` sets the window of clients in neither (default 4). A call waits the shorter of this and "
        "the tool's inline window (docs/guides/clients.md).",
    )
    progress_clients: str | None = Field(
        default=None,
        description="Comma-separated clientInfo names of clients known to reset their call timeout on "
        "notifications/progress (a TypeScript SDK host with resetTimeoutOnProgress): a call of theirs that "
        "carries a progressToken keeps the tool's whole inline window, held by the progress keepalives.",
    )
    sync_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="How long a synchronous tools/call waits for its job before cancelling it: calls of "
        "task_mode='forbidden' tools, and every call from a client without the tasks extension when "
        "tool_fallback is false.",
    )
    dedupe_s: float = Field(
        default=0,
        ge=0,
        description="A tools/call without an idempotency key that repeats one of the same caller (same tool, same "
        "arguments) whose task has not ended and was created less than this many seconds ago gets that task "
        "instead of a new one. For hosts that retry without a key; 0 (the default): off. A tool sets its own "
        "with dedupe_s=.",
    )
    max_job_s: int | None = Field(
        default=None,
        gt=0,
        description="Longest job, in seconds. One setting for both the Celery hard time limit (configure_app "
        "sets task_time_limit to it) and the life of a running task's record (TTL plus the time limit of its "
        "tool). Unset: the app's own task_time_limit, else 6 hours (21600).",
    )
    worker_lost_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A running job whose worker stops its heartbeat for this long ends failed (worker lost); "
        "the worker beats three times per period and each beat carries the deadline, so servers need not agree.",
    )
    queue_check_s: float = Field(
        default=60.0,
        gt=0,
        description="A task whose job has not started this long after it was created has its message looked "
        "for in a Redis broker (its queue and kombu's unacked hash); found in neither, twice, the task ends "
        "failed (the message was lost before any worker started it).",
    )
    shutdown_grace_s: float = Field(
        default=25.0,
        ge=0,
        description="On a worker's SIGTERM (warm shutdown), how long its running jobs may go on before they are "
        "stopped and their tasks end failed, saying the worker shut down; keep it below the time your process "
        "manager waits before SIGKILL (Kubernetes: 30 s by default).",
    )
    input_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="Default time a job waits for an answer to an input request (read by workers).",
    )
    park_after_s: float = Field(
        default=30.0,
        ge=0,
        description="How long a job waits for an answer in its worker process before it parks: the run ends, the "
        "worker is free, and the answer runs the job again from the top on any worker, answers given before "
        "returned at once (read by workers; a tool sets its own with park_after_s=, None never parks; 0 parks at "
        "once).",
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="json: one JSON object per log line, with the task id, tool, status change and hashed "
        "principal, never arguments, answers or results (workers read it; `mcp-celery serve --log-format` too).",
    )
    debug: bool = Field(
        default=False,
        description="Show clients the (redacted) text of unexpected server errors, and job tracebacks in tool "
        "errors; off, they see a bare message and the logs keep the rest.",
    )

    # ------------------------------------------------------------ operations (docs/guides/operations.md)
    metrics: bool = Field(
        default=True,
        description="Serve GET /metrics (Prometheus text format) and count the server's own series; false: no "
        "/metrics, and nothing is counted.",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="When set, GET /metrics needs `Authorization: Bearer <this token>` (401 otherwise). Unset, "
        "with MCP_CELERY_AUTH_TOKENS or MCP_CELERY_JWT_JWKS it needs a bearer token /mcp accepts; with neither "
        "it is open, and the startup line says so.",
    )
    metrics_port: int | None = Field(
        default=None,
        gt=0,
        lt=65536,
        description="Serve /metrics, /healthz and /readyz on this port too, and /metrics on no other "
        "(`serve --metrics-port`). Unset: on the MCP port.",
    )
    probe_timeout_s: float = Field(
        default=1.5,
        gt=0,
        le=10,
        description="GET /readyz answers 503 when the store's Redis or the broker does not answer within this.",
    )

    # ------------------------------------------------------------ security (see mcp_celery/auth.py, limits.py)
    auth_tokens: str | None = Field(
        default=None,
        description="File of static bearer tokens, one `PRINCIPAL sha256:HEXDIGEST` line each (`#` comments).",
    )
    jwt_jwks: str | None = Field(
        default=None, description="JWKS of the token issuer (an https:// URL or a local file); enables JWT tokens."
    )
    jwt_issuer: str | None = Field(
        default=None,
        description="Required `iss` of JWT bearer tokens. Required with MCP_CELERY_JWT_JWKS: without it serve "
        "refuses to start.",
    )
    jwt_audience: str | None = Field(
        default=None, description="Required `aud` of JWT bearer tokens. Default: the public URL of the server."
    )
    jwt_principal_claim: str = Field(
        default="sub",
        description="JWT claim naming the principal that owns tasks; also the ID token claim naming who signs in "
        "on the approval page with OpenID Connect, so a name is one person on both paths.",
    )
    public_url: str | None = Field(
        default=None,
        description="The server's URL as clients reach it (resource id in RFC 9728 metadata). "
        "Default: http://HOST:PORT/mcp. Workers read it too: an approval's page is beside it "
        "(https://HOST/mcp -> https://HOST/approvals/ID), and a job cannot ask for approval without it.",
    )
    approval_webhook: str | None = Field(
        default=None,
        description="A URL that gets one POST per approval a job asks (JSON: text, link, tool, requester, message; "
        "the shape chat incoming webhooks accept). Read by workers.",
    )
    approval_policy: str | None = Field(
        default=None,
        description="A TOML file naming the tools whose calls wait for a named person's approval before their "
        'job is queued, with one [tools."NAME-OR-GLOB"] table each: approvers (required), four_eyes (default '
        "true), timeout_s, message (docs/guides/approvals.md, Approval policy). Read at start, where a malformed "
        "file refuses to start naming its line, and again whenever it changes; while it cannot be read, every "
        "tool call is refused.",
    )
    approval_session_s: int = Field(
        default=8 * 3600,
        gt=0,
        description="How long a sign-in to the approval page lasts at most (the session, kept in Redis; a JWT's "
        "`exp` ends it sooner, and signing out or revoking the token ends it at once).",
    )
    approval_sign_in_limit: int = Field(
        default=10,
        gt=0,
        description="Failed sign-ins to the approval page per client and minute (then 429); the client is the "
        "address the request came from, or behind MCP_CELERY_TRUSTED_PROXIES the one they forward.",
    )
    trusted_proxies: str | None = Field(
        default=None,
        description="Comma-separated addresses or networks (CIDR) of the proxies in front of `serve --http` whose "
        "X-Forwarded-For and X-Forwarded-Proto are believed (uvicorn's forwarded-allow-ips), e.g. "
        "`10.0.0.0/8`; `*` believes any. Unset: none, and the client is the address a request came from.",
    )
    approval_token_sign_in: bool = Field(
        default=True,
        description="Offer the token form on the approval page's sign-in when static tokens or JWTs are "
        "configured. False: only 'Sign in with <provider>' (MCP_CELERY_OIDC_ISSUER), and an approval's link "
        "goes straight to the provider.",
    )

    # ------------------------------------------------------------ the approval page's OpenID Connect sign-in
    oidc_issuer: str | None = Field(
        default=None,
        description="The OpenID Connect provider the approval page signs people in with (authorization code flow "
        "with PKCE), found at ISSUER/.well-known/openid-configuration. https://, or http:// on a loopback host. "
        "Unreachable at start: a warning, and the page says sign-in is unavailable until it answers.",
    )
    oidc_client_id: str | None = Field(
        default=None, description="The approval page's client id at the provider; required with the issuer."
    )
    oidc_client_secret_file: str | None = Field(
        default=None,
        description="A file holding the client secret, read at start (the secret is never a setting itself, so it "
        "is in no environment listing or log). Unset: a public client, PKCE only.",
    )
    oidc_scopes: str = Field(
        default="openid email profile", description="Scopes asked of the provider, space-separated; openid first."
    )
    oidc_provider_name: str | None = Field(
        default=None, description="The name on the button, 'Sign in with NAME'. Default: the issuer's host name."
    )
    allowed_hosts: str | None = Field(
        default=None,
        description="Comma-separated host names (optionally host:port) accepted in Host and Origin headers, "
        "besides localhost; `*` turns the check off (e.g. behind a proxy that checks them).",
    )
    artifacts: str = Field(
        default="redis",
        description="Where ctx.artifact() stores a task's files: 'redis' (in the store, under the task's keys, "
        "expiring with it) or an fsspec URL that every worker and server process reaches: file:///srv/artifacts "
        "on a shared volume, memory:// (one process only: tests), s3://bucket/prefix with s3fs installed "
        "(docs/guides/artifacts.md).",
    )
    artifact_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="Most bytes of artifacts one task may keep in Redis (MCP_CELERY_ARTIFACTS=redis); "
        "ctx.artifact() raises past it. An fsspec store has no quota of mcp-celery's.",
    )
    artifact_read_max_bytes: int = Field(
        default=8 * 1024 * 1024,
        gt=0,
        description="Largest artifact resources/read returns (as text or base64); a larger one is refused with "
        "a message naming the HTTP download, GET /artifacts/{taskId}/{name}.",
    )
    artifact_sweep_s: float = Field(
        default=300.0,
        gt=0,
        description="How often each server removes the fsspec artifact folders of tasks whose record has "
        "expired (MCP_CELERY_ARTIFACTS=URL only; Redis expires its own).",
    )
    output_keep_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="How many of the last bytes of a task's live output (ctx.output, the resource "
        "mcp-celery://tasks/{taskId}/output) are kept; earlier ones are dropped, and the output's first line "
        "says how many. Read by workers (what they keep) and servers (what they return).",
    )
    max_request_bytes: int = Field(default=4 * 1024 * 1024, gt=0, description="Largest HTTP body (else HTTP 413).")
    max_json_depth: int = Field(default=32, gt=0, description="Deepest nesting of tool arguments and answers.")
    max_argument_bytes: int = Field(default=1024 * 1024, gt=0, description="Largest tool arguments, as JSON.")
    max_input_response_bytes: int = Field(
        default=256 * 1024, gt=0, description="Largest inputResponses of one request, as JSON."
    )
    max_input_response_keys: int = Field(default=64, gt=0, description="Most inputResponses keys in one request.")
    max_task_id_length: int = Field(default=128, gt=0, description="Longest taskId looked up in Redis.")
    max_idempotency_key_length: int = Field(
        default=255, gt=0, description="Longest idempotency key of a tools/call (else -32602)."
    )
    max_live_tasks_per_principal: int | None = Field(
        default=None, gt=0, description="Most unfinished tasks one principal may have (unset: no limit)."
    )

    @field_validator("client_windows")
    @classmethod
    def _positive_windows(cls, windows: dict[str, float]) -> dict[str, float]:
        bad = sorted(name for name, seconds in windows.items() if not seconds > 0)
        if bad:
            raise ValueError(f"each window must be a number of seconds above 0 (not for {', '.join(bad)})")
        return windows

    @property
    def progress_client_names(self) -> frozenset[str]:
        """The clientInfo names of MCP_CELERY_PROGRESS_CLIENTS."""
        return frozenset(name.strip() for name in (self.progress_clients or "").split(",") if name.strip())


def invalid_settings(error: ValidationError) -> str:
    """What is wrong with each setting `error` rejects, by its environment variable."""
    problems = []
    for item in error.errors(include_url=False):
        name = "MCP_CELERY_" + "_".join(str(part) for part in item["loc"]).upper()
        problems.append(f"{name}={item['input']!r}: {item['msg']}")
    return "; ".join(problems)
