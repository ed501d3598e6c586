"""What the worker does when a job asks for approval: the request, the page's index entry, the webhook.

Worker tier. `JobContext.approve` asks its question through these: the request is a URL-mode
elicitation pointing at the server's approval page (`mcp_celery.core.approvals`), indexed for the
page's list (`SyncStore.register_approval`), and announced once to the optional webhook
(`approval_webhook`). The question then waits, or parks, like any other: a night-long approval
holds no worker.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mcp_celery.core.approvals import approval_request, page_url, redacted_arguments
from mcp_celery.errors import InputNotSupported
from mcp_celery.settings import Settings

__all__ = ["KEPT_AFTER_TIMEOUT_S", "ApprovalConfig", "Asked", "notify_webhook"]

logger = logging.getLogger(__name__)

#: An approval's page id is kept this long after its question times out (then it is "not found").
KEPT_AFTER_TIMEOUT_S = 86400
#: The webhook's POST gives up after this long: a slow chat service must not hold the job.
WEBHOOK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ApprovalConfig:
    """The settings an approval needs on the worker: where the page is, and whom to tell."""

    public_url: str | None = None
    webhook: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> ApprovalConfig:
        return cls(public_url=settings.public_url, webhook=settings.approval_webhook)

    def require_public_url(self) -> str:
        """The server's public URL, which the approval page's link is made from.

        Raises:
            InputNotSupported: MCP_CELERY_PUBLIC_URL is not set on the worker.
        """
        if not self.public_url:
            raise InputNotSupported(
                "a job can ask for approval only when the worker knows where the approval page is: set "
                "MCP_CELERY_PUBLIC_URL on the worker to the server's URL (e.g. https://jobs.example/mcp)"
            )
        return self.public_url


@dataclass(frozen=True)
class Asked:
    """One approval a job asks: its page, and the request and announcement made of it."""

    config: ApprovalConfig
    approval_id: str
    tool: str
    requester: str
    message: str

    @property
    def link(self) -> str:
        return page_url(self.config.require_public_url(), self.approval_id)

    def request(
        self, approvers: Sequence[str] | None, details: Mapping[str, Any] | None, four_eyes: bool, task_request: Any
    ) -> dict[str, Any]:
        """The input request (`mcp_celery.core.approvals.approval_request`), the job's arguments redacted.

        Raises:
            InputNotSupported: MCP_CELERY_PUBLIC_URL is not set on the worker.
            TypeError: `details` is not JSON, or `approvers` not a list of names (ValueError: an empty one).
        """
        json.dumps(dict(details or {}))  # refused here, not when the record is written
        arguments = redacted_arguments(job_arguments(task_request))
        return approval_request(
            self.message,
            self.link,
            approval_id=self.approval_id,
            approvers=approvers,
            four_eyes=four_eyes,
            details=details,
            arguments=arguments,
            requester=self.requester,
        )

    def notify(self) -> bool:
        """POST the announcement to the configured webhook (`notify_webhook`)."""
        if not self.config.webhook:
            return False
        return notify_webhook(
            self.config.webhook, link=self.link, tool=self.tool, requester=self.requester, message=self.message
        )


def notify_webhook(url: str, *, link: str, tool: str, requester: str, message: str) -> bool:
    """POST the approval's announcement to `url`; False (logged, never raised) when that fails.

    The body has `text` (what chat services' incoming webhooks show) and the fields one by one.
    """
    text = f"{requester or 'someone'} asks for approval of {tool}: {message}\n{link}"
    body = {"text": text, "link": link, "tool": tool, "requester": requester, "message": message}
    request = urllib.request.Request(  # noqa: S310 - the operator's configured URL
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as response:  # noqa: S310
            response.read()
    except OSError as exc:  # URLError and HTTPError are OSErrors; the URL may hold a secret: not logged
        logger.warning("could not POST the approval to MCP_CELERY_APPROVAL_WEBHOOK: %s", type(exc).__name__)
        return False
    return True


def job_arguments(request: Any) -> Mapping[str, Any]:
    """The job's keyword arguments (MCP jobs get keyword arguments only)."""
    kwargs = getattr(request, "kwargs", None)
    return kwargs if isinstance(kwargs, Mapping) else {}
