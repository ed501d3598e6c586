"""`python -m mcp_celery`: the `mcp-celery` command (`mcp_celery.cli`)."""

from mcp_celery.cli import main

main()
