#!/usr/bin/env bash
# Notebooks 02, 04 and 05 under load: their tests (SMOKE runs: each notebook's own outcome
# checks, then the test's reading of the run's records) RUNS times in a row, beside BUSY
# busy-loop processes at normal priority that take every core the runs leave idle. Prints one
# line a test and run, and a tally; exits 1 if any run failed. Its log stays in LOG.
#
#     tools/loaded_notebooks.sh                      # 10 runs, 2 busy loops
#     RUNS=3 BUSY=1 TESTS="test_04_distributed_training" tools/loaded_notebooks.sh
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-10}
BUSY=${BUSY:-2}
TESTS=${TESTS:-"test_02_instrument_with_opentelemetry or test_04_distributed_training or test_05_explore_metrics"}
LOG=${LOG:-$(mktemp -t distrl-loaded-XXXXXX.log)}

busy=()
stop_busy() { [ ${#busy[@]} -gt 0 ] && kill "${busy[@]}" 2>/dev/null; wait 2>/dev/null; }
trap stop_busy EXIT
for _ in $(seq "$BUSY"); do
  .venv/bin/python -c "while True: pass" &
  busy+=($!)
done

echo "# $(date -u '+%Y-%m-%d %H:%M') commit $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)," \
     "$(nproc) cores, $BUSY busy loops, $RUNS runs of: $TESTS; log: $LOG"
failed=0
for run in $(seq "$RUNS"); do
  start=$(date +%s)
  .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_notebooks.py \
      -k "$TESTS" -rA >>"$LOG" 2>&1
  rc=$?
  # pytest's short summary: one PASSED/FAILED line a test, in this run's part of the log.
  summary=$(tac "$LOG" | sed '/short test summary info/q' | grep -E '^(PASSED|FAILED|ERROR) ' | tac)
  echo "run $run: exit $rc after $(( $(date +%s) - start )) s"
  echo "$summary" | sed 's/^/  /' | cut -c1-240
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
done
echo "$((RUNS - failed)) of $RUNS runs passed every test"
[ "$failed" -eq 0 ]
