"""`python -m mcp_celery`: the `mcp-celery` command (`mcp_celery.cli.command`)."""

from mcp_celery.cli.command import main

main()
