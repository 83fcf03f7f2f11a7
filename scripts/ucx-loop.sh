#!/usr/bin/env bash
# Hunts rare failures over UCX: runs end-to-end test files over UCX beside a CPU hog, keeping
# the log (servers at debug level, their last lines printed by the failing test) of every
# failing run under /tmp. Bounded: ROUNDS rounds (default 20) of the files given (default
# core namespace rename_replace). Usage: scripts/ucx-loop.sh [FILE...]; UCX_TLS (default tcp).
set -u
# Loopback only (UCX's tcp transport also uses this host's other addresses unless told).
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
cd "$(dirname "$0")/.."
files=("$@")
[ ${#files[@]} -eq 0 ] && files=(core namespace rename_replace)
cargo test --no-run -q $(printf -- '--test %s ' "${files[@]}") || exit 1
timeout 3600 sh -c 'while :; do :; done' &
hog=$!
trap 'kill $hog 2> /dev/null' EXIT
failures=0
for round in $(seq "${ROUNDS:-20}"); do
    for file in "${files[@]}"; do
        log=/tmp/ringfs-ucx-loop-$round-$file.log
        if RINGFS_TEST_LOGS=1 RINGFS_TEST_SERVER_LOG=debug RINGFS_TEST_TRANSPORT=ucx UCX_TLS=${UCX_TLS:-tcp} \
            timeout 300 cargo test -q --test "$file" > "$log" 2>&1; then
            rm -f "$log"
        else
            failures=$((failures + 1))
            echo "round $round: $file failed (log: $log)"
        fi
    done
done
echo "$failures failing runs"
[ "$failures" -eq 0 ]
