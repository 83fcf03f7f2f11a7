#!/usr/bin/env bash
# What a cluster costs that grows with its size, counted (not timed), for one or more builds:
#   scripts/scale-costs.sh BINARY...            (e.g. /tmp/ringfs-old target/release/ringfs)
# For each binary, on this machine:
#   - the requests its servers answered to start N servers (`ringfs start --servers N`,
#     then the sum of `ringfs status`'s REQUESTS column), N in $SIZES (default 8 16 32 48);
#   - for the largest N, left idle for $IDLE_SECS (default 10) s after settling: the servers'
#     CPU time and context switches (all threads) per server and second, and their requests;
#   - with 16 servers: the requests of 50 files put into / and 50 into /d (`ringfs put`,
#     one process each: the difference is what / costs more);
#   - with 16 servers: the requests of 50 `ringfs stat` and of 20 `ringfs rm` of files of one
#     chunk and of three (3 MiB: chunks of 1 MiB; the difference is what later chunks cost);
#   - with 16 servers and a FUSE mount (if /dev/fuse is there): the requests answered over
#     $IDLE_SECS s with and without the mount, both idle.
# Every cluster is stopped before the next starts (and on exit).
set -euo pipefail
sizes=${SIZES:-8 16 32 48}
idle=${IDLE_SECS:-10}
work=$(mktemp -d /tmp/ringfs-scale-XXXXXX)
current_run_dir=""
current_binary=""
cleanup() {
    if [ -n "$current_run_dir" ]; then RINGFS_RUN_DIR=$current_run_dir "$current_binary" stop >/dev/null 2>&1 || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

start() { # binary servers
    current_binary=$1
    current_run_dir=$work/run-$RANDOM
    "$1" start --servers "$2" --run-dir "$current_run_dir" >/dev/null
}
stop() {
    RINGFS_RUN_DIR=$current_run_dir "$current_binary" stop >/dev/null 2>&1 || true
    current_run_dir=""
}
requests() { RINGFS_RUN_DIR=$current_run_dir "$current_binary" status | awk 'NR>1 && $3=="up" {s+=$7} END {print s+0}'; }
server_pids() { awk '{print $2}' "$current_run_dir"/server-*.pid; }
# CPU ticks (user+system) and context switches of every thread of the servers, together.
cpu_ticks() { for pid in $(server_pids); do awk '{print $14+$15}' "/proc/$pid/stat"; done | paste -sd+ | bc; }
switches() { for pid in $(server_pids); do cat /proc/"$pid"/task/*/status; done | awk '/^(non)?voluntary_ctxt_switches/ {s+=$2} END {print s+0}'; }

echo x > "$work/small"
head -c 3M /dev/zero > "$work/large"
for binary in "$@"; do
    echo "== $binary"
    largest=0
    for n in $sizes; do
        start "$binary" "$n"
        echo "start of $n servers: $(requests) requests"
        largest=$n
        if [ "$n" != "${sizes##* }" ]; then stop; fi
    done
    sleep 3
    ticks_per_second=$(getconf CLK_TCK)
    r0=$(requests); c0=$(cpu_ticks); s0=$(switches)
    sleep "$idle"
    r1=$(requests); c1=$(cpu_ticks); s1=$(switches)
    echo "$largest idle servers, per server and second: CPU $(echo "scale=2; 1000 * ($c1 - $c0) / $ticks_per_second / $largest / $idle" | bc) ms, context switches $(echo "scale=1; ($s1 - $s0) / $largest / $idle" | bc), requests $(echo "scale=1; ($r1 - $r0 - $largest) / $largest / $idle" | bc)"
    stop

    start "$binary" 16
    export RINGFS_RUN_DIR=$current_run_dir
    "$binary" mkdir /d
    for dir in "" /d; do
        before=$(requests)
        for index in $(seq 1 50); do "$binary" put "$work/small" "$dir/f$index"; done
        echo "50 puts into ${dir:-/} with 16 servers: $(( $(requests) - before - 16 )) requests"
    done
    for kind in small large; do
        for index in $(seq 1 20); do "$binary" put "$work/$kind" "/$kind$index"; done
        before=$(requests)
        for index in $(seq 1 50); do "$binary" stat "/${kind}1" >/dev/null; done
        stats=$(( $(requests) - before - 16 ))
        before=$(requests)
        for index in $(seq 1 20); do "$binary" rm "/$kind$index"; done
        echo "16 servers, files of $(stat -c %s "$work/$kind") bytes: 50 stats $stats requests, 20 removals $(( $(requests) - before - 16 )) requests"
    done
    if [ -e /dev/fuse ]; then
        before=$(requests); sleep "$idle"; without=$(( $(requests) - before - 16 ))
        mkdir -p "$work/mnt"
        "$binary" mount "$work/mnt" >"$work/mount.log" 2>&1 &
        mount_pid=$!
        sleep 5
        before=$(requests); sleep "$idle"; with=$(( $(requests) - before - 16 ))
        kill "$mount_pid"; wait "$mount_pid" 2>/dev/null || true
        umount "$work/mnt" 2>/dev/null || true
        echo "16 idle servers over $idle s: $without requests without a mount, $with with one idle mount"
    fi
    unset RINGFS_RUN_DIR
    stop
done
