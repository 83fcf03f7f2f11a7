#!/usr/bin/env bash
# What stopping a cluster costs, for one or more builds:
#   scripts/stop-cost.sh BINARY...   (SERVERS, default 48; ROUNDS, default 2)
# For each round and binary: the time `ringfs stop` takes for $SERVERS local servers started 2 s
# before, and how many goodbyes (a stopping server pushing its member list to the others)
# were answered, summed from the servers' logs ("(N peers told)").
set -u
servers=${SERVERS:-48}
for round in $(seq 1 "${ROUNDS:-2}"); do
    for binary in "$@"; do
        dir=$(mktemp -d /tmp/ringfs-stop-cost-XXXXXX)
        "$binary" start --servers "$servers" --run-dir "$dir/run" >/dev/null
        sleep 2
        started=$(date +%s.%N)
        RINGFS_RUN_DIR=$dir/run "$binary" stop --keep >/dev/null 2>&1
        ended=$(date +%s.%N)
        told=$(grep -ho "([0-9]* peers told)" "$dir"/run/server-*.log | tr -dc '0-9\n' | paste -sd+ | bc)
        echo "round $round, $binary, $servers servers: stop $(echo "$ended - $started" | bc) s, goodbyes answered ${told:-0}"
        rm -rf "$dir"
    done
done
