#!/usr/bin/env bash
# Interop check with the official TypeScript tasks client (@modelcontextprotocol/client@2.4.0 +
# @modelcontextprotocol/ext-tasks@0.2.2) through ts-task-client.mjs, against a running server that
# loads tests/support/conformance_jobs.py.
#
#   usage: tests/support/conformance/run_ts_client.sh URL      e.g. http://127.0.0.1:8765/mcp
#
# Requires `npm ci --prefix tests/support/conformance` first. ts-task-client.mjs exit codes:
# 0 completed, 2 failed, 3 cancelled, 1 client/protocol error.
# Prints one PASS/FAIL line per case and "N passed, M failed"; exits non-zero on any mismatch.
set -u

URL=${1:?usage: run_ts_client.sh URL}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONF_DIR=${CONF_DIR:-$HERE}
CLIENT=$CONF_DIR/ts-task-client.mjs
CASE_TIMEOUT=${CASE_TIMEOUT:-60}   # seconds per case

# node >= 20 runs the client; prefer the pinned node 22 shipped in node_modules.
NODE=$CONF_DIR/node_modules/.bin/node
[ -x "$NODE" ] || NODE=node
if [ ! -d "$CONF_DIR/node_modules/@modelcontextprotocol/ext-tasks" ]; then
  echo "run_ts_client.sh: TS client packages not installed in $CONF_DIR (run: npm ci --prefix tests/support/conformance)" >&2
  exit 2
fi
GUARD=()
command -v timeout >/dev/null 2>&1 && GUARD=(timeout --kill-after=5 "$CASE_TIMEOUT")

pass=0; fail=0
OUTF=$(mktemp)
trap 'rm -f "$OUTF"' EXIT

# run_case NAME EXPECTED_RC PATTERN... -- CLIENT_ARGS...
# Passes iff the client's exit code is EXPECTED_RC and its combined stdout+stderr matches every
# PATTERN (grep -E).
run_case() {
  local name=$1 want_rc=$2; shift 2
  local pats=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do pats+=("$1"); shift; done
  shift
  local t0 rc ms why="" p
  t0=$(date +%s%N)
  "${GUARD[@]}" "$NODE" "$CLIENT" --url "$URL" "$@" >"$OUTF" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  [ "$rc" -eq "$want_rc" ] || why="rc=$rc, expected $want_rc"
  for p in "${pats[@]}"; do
    grep -a -q -E -- "$p" "$OUTF" || why="${why:+$why; }output lacks /$p/"
  done
  if [ -z "$why" ]; then
    pass=$((pass + 1))
    printf 'PASS  %-30s rc=%s  %6d ms  %s\n' "$name" "$rc" "$ms" "$(grep -a -v '^\s*$' "$OUTF" | tail -n 1 | cut -c1-110)"
  else
    fail=$((fail + 1))
    printf 'FAIL  %-30s rc=%s  %6d ms  %s\n' "$name" "$rc" "$ms" "$why"
    tail -n 40 "$OUTF" | sed 's/^/      | /'
  fi
}

# Task-optional tool, declaring client: a task that completes with content.
run_case slow_compute-completed 0 'CALL kind=task' 'OUTCOME completed' '"content":\[\{' -- \
  --tool slow_compute --args '{"seconds":1,"label":"ts"}'

# input_required inside a task, answered through tasks/update.
run_case confirm_delete-accept 0 'CALL kind=task' 'INPUT elicitation .*delivery=task-update' 'OUTCOME completed' -- \
  --tool confirm_delete --args '{"filename":"a.txt"}' \
  --answer '{"action":"accept","content":{"confirm":true}}'

# tasks/cancel on a running 60 s task.
run_case slow_compute-cancelled 3 'CALL kind=task' 'CANCEL acked' 'OUTCOME cancelled' -- \
  --tool slow_compute --args '{"seconds":60,"label":"ts-cancel"}' --cancel-after 1500

# Task-required tool, client without the extension: -32021 naming the tasks extension.
run_case failing_job-no-tasks-32021 1 'ERROR .*-32021' 'io\.modelcontextprotocol/tasks' -- \
  --tool failing_job --args '{}' --no-tasks

# Task-forbidden tool: immediate result even for a declaring client.
run_case greet-immediate 0 'CALL kind=immediate' 'OUTCOME completed' '"text":"Hello, TS!"' -- \
  --tool greet --args '{"name":"TS"}'

# MRTR input_required round on tools/call, then a task on the retry.
run_case test_tool_with_task-mrtr 0 'INPUT elicitation .*delivery=request-retry' 'CALL kind=task' 'OUTCOME completed' '"text":"[^"]*Alice' -- \
  --tool test_tool_with_task --args '{}' \
  --answer '{"action":"accept","content":{"name":"Alice"}}'

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
