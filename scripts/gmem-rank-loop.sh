#!/usr/bin/env bash
# Hunts rare failures of global-memory ranks (docs/TESTING.md): starts one cluster, then runs
# a scenario of tests/gmem.rs with RANKS rank processes again and again, beside HOGS busy
# loops, and keeps the output of every failing iteration (ranks' stdout and stderr, the
# servers' logs) under OUT. Bounded: at most ROUNDS iterations and SECONDS_LIMIT seconds.
#   SCENARIO=nonblocking RANKS=3 CACHE=256K COOP=0 TRANSPORT=ucx UCX_TLS=posix,sysv,cma,tcp
#   HOGS=2 ROUNDS=2000 SECONDS_LIMIT=280 OUT=/tmp/gmem-rank-loop scripts/gmem-rank-loop.sh
# STALL_SECONDS=N: a round still running after N seconds has the threads of every rank and
# server written down by gdb (stacks.PID, kept with the round if it fails).
# Needs the debug build and the gmem test binary (cargo test --test gmem --no-run).
set -u
# Loopback only (UCX's tcp transport also uses this host's other addresses unless told).
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
cd "$(dirname "$0")/.."
ringfs=$PWD/target/debug/ringfs
ranks_binary=${RANK_BINARY:-$(ls -t target/debug/deps/gmem-* | grep -v '\.d$' | head -n 1)}
scenario=${SCENARIO:-nonblocking}
ranks=${RANKS:-3}
rounds=${ROUNDS:-2000}
limit=${SECONDS_LIMIT:-280}
out=${OUT:-/tmp/gmem-rank-loop}
export UCX_TLS=${UCX_TLS:-posix,sysv,cma,tcp}
mkdir -p "$out"
work=$(mktemp -d /tmp/gmem-rank-loop.XXXX)
hogs=()
stop() {
    for hog in "${hogs[@]}"; do kill "$hog" 2>/dev/null; done
    "$ringfs" stop --run-dir "$work/run" >/dev/null 2>&1
    rm -rf "$work"
}
trap 'stop; exit' EXIT TERM INT
eval "$("$ringfs" start --servers 2 --transport "${TRANSPORT:-ucx}" --run-dir "$work/run" --store mem)" || exit 1
for _ in $(seq "${HOGS:-2}"); do
    timeout "$limit" sh -c 'while :; do :; done' &
    hogs+=($!)
done
started=$SECONDS
failed=0
round=0
while [ "$round" -lt "$rounds" ] && [ $((SECONDS - started)) -lt "$limit" ]; do
    round=$((round + 1))
    job=$(printf '%x%x' "$RANDOM$RANDOM" "$round")
    pids=()
    for rank in $(seq 0 $((ranks - 1))); do
        RINGFS_TIMEOUT_MS=15000 RINGFS_GMEM_RANK=$rank RINGFS_GMEM_RANKS=$ranks RINGFS_GMEM_JOB=$job \
            RINGFS_GMEM_TEST=$scenario RINGFS_GMEM_CACHE=${CACHE:-256K} RINGFS_GMEM_COOP=${COOP:-0} RINGFS_GMEM_RELAY=0 \
            timeout 60 "$ranks_binary" --exact rank_main --ignored --nocapture --test-threads 1 >"$work/out.$rank" 2>&1 &
        pids+=($!)
    done
    # A round still running after STALL_SECONDS: every rank's and server's threads are
    # written down (gdb) while they wait, kept with the round if it fails.
    rm -f "$work"/stacks.*
    round_started=$SECONDS
    while [ -n "${STALL_SECONDS:-}" ] && kill -0 "${pids[@]}" 2>/dev/null; do
        if [ $((SECONDS - round_started)) -ge "$STALL_SECONDS" ]; then
            # Sockets first (gdb stops what it reads): bytes waiting in a server's receive
            # queue while its threads wait in epoll_wait would be a lost wake-up.
            ss -xnpa >"$work/stacks.sockets" 2>&1
            # (The ranks run under `timeout`: their processes are its children.)
            for pid in $(pgrep -P "$(echo "${pids[@]}" | tr ' ' ,)") $(awk '{ print $NF }' "$work"/run/*.pid 2>/dev/null); do
                timeout 60 gdb -p "$pid" -batch -ex "thread apply all bt" >"$work/stacks.$pid" 2>&1
            done
            break
        fi
        sleep 0.5
    done
    bad=0
    for rank in $(seq 0 $((ranks - 1))); do
        wait "${pids[$rank]}" || bad=1
    done
    if [ "$bad" = 1 ]; then
        failed=$((failed + 1))
        kept="$out/round-$round"
        mkdir -p "$kept"
        cp "$work"/out.* "$work"/stacks.* "$work"/run/*.log "$kept"/ 2>/dev/null
        echo "round $round failed: $kept"
        grep -h "panicked\|malloc\|SIGSEGV\|WARN\|ERROR" "$kept"/out.* | head -n 5
    fi
done
echo "$failed of $round rounds failed ($ranks ranks each, scenario $scenario)"
