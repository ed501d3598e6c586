#!/usr/bin/env bash
# Full conformance run against a real Redis-backed deployment:
#   1. a Celery prefork worker for tests.support.conformance_jobs,
#   2. the mcp-celery Streamable HTTP server for the same module on a free port,
#   3. tests/support/conformance/run_suite.sh (official harness, 10 tasks scenarios),
#   4. tests/support/conformance/run_ts_client.sh (official TS tasks client).
#
#   usage (from the repo root, after `npm ci --prefix tests/support/conformance`):
#       bash tests/support/conformance/run_all.sh [OUTDIR]
#
# With OUTDIR, the harness's checks.json files and the worker/server logs are kept there.
# After the harness and after the TS client, the worker must become idle within IDLE_TIMEOUT
# seconds: every 60 s job the clients cancelled must really have stopped.
#
# Environment: CELERY_BROKER_URL / CELERY_RESULT_BACKEND (default redis://127.0.0.1:6379/0 and /1),
# CONFORMANCE_QUEUE (default conformance_jobs), READY_TIMEOUT (s, default 60),
# IDLE_TIMEOUT (s, default 15), PORT (default: a free port).
# Both services are stopped by pid on exit; their logs are printed if anything failed.
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
OUTDIR=${1:-}
READY_TIMEOUT=${READY_TIMEOUT:-60}
IDLE_TIMEOUT=${IDLE_TIMEOUT:-15}
PYTHON=${PYTHON:-python}

cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export CELERY_BROKER_URL=${CELERY_BROKER_URL:-redis://127.0.0.1:6379/0}
export CELERY_RESULT_BACKEND=${CELERY_RESULT_BACKEND:-redis://127.0.0.1:6379/1}

PORT=${PORT:-$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')}
URL="http://127.0.0.1:$PORT/mcp"

NODE="conformance-$PORT@localhost"   # our worker's node name, for targeted inspect calls
if [ -n "$OUTDIR" ]; then
  mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
  LOGDIR=$OUTDIR; KEEP_LOGS=1
else
  LOGDIR=$(mktemp -d); KEEP_LOGS=0
fi
WORKER_PID=""
SERVER_PID=""

stop() {  # stop PID (only a process we started): TERM, then QUIT (celery cold shutdown), then KILL
  local pid=$1 sig _
  [ -n "$pid" ] || return 0
  for sig in TERM QUIT KILL; do
    kill -0 "$pid" 2>/dev/null || break
    kill -"$sig" "$pid" 2>/dev/null
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  done
  wait "$pid" 2>/dev/null
}

RC=1
show_logs=1
cleanup() {
  stop "$SERVER_PID"
  stop "$WORKER_PID"
  if [ "$show_logs" -ne 0 ]; then
    echo "----- server log (tail) -----"; tail -n 60 "$LOGDIR/server.log" 2>/dev/null
    echo "----- worker log (tail) -----"; tail -n 60 "$LOGDIR/worker.log" 2>/dev/null
  fi
  [ "$KEEP_LOGS" -eq 1 ] || rm -rf "$LOGDIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for tool in celery mcp-celery; do
  command -v "$tool" >/dev/null 2>&1 || { echo "run_all.sh: '$tool' not on PATH (pip install -e .[dev])" >&2; exit 2; }
done
if [ ! -x "$HERE/node_modules/.bin/conformance" ]; then
  echo "run_all.sh: run 'npm ci --prefix tests/support/conformance' first" >&2
  exit 2
fi

echo "== starting worker and server (port $PORT, logs in $LOGDIR)"
celery -A tests.support.conformance_jobs worker -P prefork -c 4 --without-gossip --without-mingle -l WARNING \
  -n "$NODE" >"$LOGDIR/worker.log" 2>&1 &
WORKER_PID=$!
mcp-celery serve -A tests.support.conformance_jobs --http --host 127.0.0.1 --port "$PORT" \
  >"$LOGDIR/server.log" 2>&1 &
SERVER_PID=$!

# Readiness: the HTTP server answers a POST (any HTTP status; a GET on /mcp would hang as SSE), and
# the worker answers a ping (so the first task does not wait for the pool to boot).
deadline=$(( $(date +%s) + READY_TIMEOUT ))
server_ready=0; worker_ready=0
while [ "$(date +%s)" -lt "$deadline" ]; do
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "run_all.sh: server exited early" >&2; exit 1; }
  kill -0 "$WORKER_PID" 2>/dev/null || { echo "run_all.sh: worker exited early" >&2; exit 1; }
  if [ $server_ready -eq 0 ]; then
    code=$(curl -s -o /dev/null -m 1 -w '%{http_code}' -X POST -H 'Content-Type: application/json' -d '{}' "$URL" 2>/dev/null)
    [ "${code:-000}" != "000" ] && server_ready=1
  fi
  if [ $worker_ready -eq 0 ]; then
    celery -A tests.support.conformance_jobs inspect ping -d "$NODE" --timeout 1 >/dev/null 2>&1 && worker_ready=1
  fi
  [ $server_ready -eq 1 ] && [ $worker_ready -eq 1 ] && break
  sleep 0.2
done
if [ $server_ready -ne 1 ] || [ $worker_ready -ne 1 ]; then
  echo "run_all.sh: not ready within ${READY_TIMEOUT}s (server_ready=$server_ready worker_ready=$worker_ready)" >&2
  exit 1
fi
echo "== ready: $URL"

# worker_idle LABEL: wait until our worker runs no job (cancelled jobs must really stop).
worker_idle() {
  local label=$1 until=$(( $(date +%s) + IDLE_TIMEOUT )) active=""
  while :; do
    active=$(celery -A tests.support.conformance_jobs inspect active -d "$NODE" -j --timeout 2 2>/dev/null |
      "$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); jobs=[j for v in d.values() for j in v]; print(len(jobs), " ".join(sorted({j.get("name","?").rsplit(".",1)[-1] for j in jobs})))' 2>/dev/null)
    if [ "${active%% *}" = "0" ]; then
      echo "PASS  worker idle after $label"
      return 0
    fi
    if [ "$(date +%s)" -ge "$until" ]; then
      echo "FAIL  worker not idle ${IDLE_TIMEOUT}s after $label: active jobs = ${active:-<no answer>}"
      return 1
    fi
    sleep 0.5
  done
}

echo "== conformance harness (10 tasks scenarios)"
bash "$HERE/run_suite.sh" "$URL" ${OUTDIR:+"$OUTDIR"}
suite_rc=$?
worker_idle "the harness" || suite_rc=1

echo "== TS tasks client"
bash "$HERE/run_ts_client.sh" "$URL"
ts_rc=$?
worker_idle "the TS client" || ts_rc=1

echo "== run_all: suite rc=$suite_rc, ts client rc=$ts_rc"
if [ $suite_rc -eq 0 ] && [ $ts_rc -eq 0 ]; then
  show_logs=0
  RC=0
fi
exit $RC
