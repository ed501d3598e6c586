from mcp_celery.cli import main

main()
