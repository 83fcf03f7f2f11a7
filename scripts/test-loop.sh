#!/usr/bin/env bash
# Hunts a rare failure of one end-to-end test: runs it RUNS times (default 20), with the
# servers logging at debug level and a failed test's cluster directory (server logs) kept,
# and keeps the output of every failing run under /tmp. Extra environment goes through, e.g.
#   RINGFS_RENAME_ROUNDS=200 scripts/test-loop.sh cache renamed_files_reach_the_backend
# Usage: scripts/test-loop.sh FILE TEST; RUNS, and HOG=1 for a CPU hog beside it.
set -u
cd "$(dirname "$0")/.."
file=$1 test=$2
cargo test --no-run -q --test "$file" || exit 1
if [ "${HOG:-0}" = 1 ]; then
    timeout 3600 sh -c 'while :; do :; done' &
    hog=$!
    trap 'kill $hog 2> /dev/null' EXIT
fi
failures=0
for run in $(seq "${RUNS:-20}"); do
    log=/tmp/ringfs-test-loop-$file-$run.log
    if RINGFS_TEST_SERVER_LOG=${RINGFS_TEST_SERVER_LOG:-debug} RINGFS_TEST_KEEP=1 \
        timeout 900 cargo test -q --test "$file" "$test" -- --test-threads 1 > "$log" 2>&1; then
        rm -f "$log"
    else
        failures=$((failures + 1))
        echo "run $run failed (log: $log; the cluster directory it names keeps the server logs)"
    fi
done
echo "$failures failing runs of ${RUNS:-20}"
[ "$failures" -eq 0 ]
