"""The shared Celery model: what the worker and the server both know of an app and its tools; no I/O of its own."""
