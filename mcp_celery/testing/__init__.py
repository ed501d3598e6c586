"""Helpers for tests of mcp-celery and of code that uses it (as `celery.contrib.testing`)."""
