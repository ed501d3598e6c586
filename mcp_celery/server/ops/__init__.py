"""What operators see: metrics, probes, their HTTP routes, diagnostics and the task event log.

metrics.py              the server's own Prometheus series, and the one scrape that reads them
deployment_metrics.py   deployment-wide figures (queues, tasks, ended jobs) for Prometheus
probes.py               readiness: does the store's Redis answer, and the broker
operations.py           `/healthz`, `/readyz` and `/metrics`, outside the MCP endpoint
diagnostics.py          `kill -USR1` logs what a server process holds
observe.py              a task's changes as spans, log lines and counts
"""
