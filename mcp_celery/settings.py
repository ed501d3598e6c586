"""Settings, read from `MCP_CELERY_*` environment variables; constructor keywords win.

Only the CLI and `create_server()` build a Settings object; nothing reads the
environment at import time.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MCP_CELERY_", extra="ignore")

    redis_url: str | None = Field(
        default=None,
        description="Redis for task records. Default: the Celery app's result backend, which must be Redis, "
        "so that a task record and its Celery result are read in one round trip.",
    )
    key_prefix: str = Field(default="mcp-celery", description="Prefix of every Redis key mcp-celery writes.")
    poll_interval_ms: int = Field(default=1000, gt=0, description="pollIntervalMs suggested to clients.")
    cancel_grace_s: float = Field(
        default=5.0,
        ge=0,
        description="Seconds a cancelled job has to reach a checkpoint before it is reported cancelled anyway.",
    )
    sync_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="How long a synchronous tools/call (client without the tasks extension) waits for its job.",
    )
    max_job_s: int = Field(
        default=6 * 3600,
        gt=0,
        description="Longest expected job run; the task record outlives creation by TTL plus this.",
    )
    input_timeout_s: float = Field(
        default=3600.0, gt=0, description="Default time a job waits for an answer to an input request."
    )
    debug: bool = Field(default=False, description="Include tracebacks in tool error results.")
