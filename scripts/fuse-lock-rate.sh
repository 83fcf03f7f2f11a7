#!/usr/bin/env bash
# Advisory locks through a ringfs mount: `lockf` lock + unlock pairs a second from one
# process on a file nobody else holds (so every lock is granted at once), and the same with
# a second process holding the lock half of the time (so locks wait), for mount variants in
# alternating rounds:
#   scripts/fuse-lock-rate.sh RINGFS_BINARY ROUNDS VARIANT...
# A VARIANT is NAME or NAME:VAR=VALUE (an environment variable for that variant's mount).
# Prints one line per round and variant; docs/PERFORMANCE.md ("Lock grants through the mount")
# has the figures.
set -euo pipefail
ringfs=$(realpath "$1")
rounds=$2
shift 2
work=$(mktemp -d /tmp/ringfs-lock-rate-XXXXXX)
eval "$("$ringfs" start --servers 2 --run-dir "$work/run" 2>/dev/null)"
mkdir "$work/mnt"
mount_pid=
unmount() {
    if [ -n "$mount_pid" ]; then
        kill "$mount_pid" 2>/dev/null || true
        wait "$mount_pid" 2>/dev/null || true
        mount_pid=
    fi
}
cleanup() {
    unmount
    "$ringfs" stop > /dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
for round in $(seq "$rounds"); do
    for variant in "$@"; do
        name=${variant%%:*}
        setting=
        [ "$name" != "$variant" ] && setting=${variant#*:}
        env $setting "$ringfs" mount "$work/mnt" > "$work/mount.log" 2>&1 &
        mount_pid=$!
        for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.1; done
        rates=$(timeout 120 python3 - "$work/mnt/locked" <<'PYTHON'
import fcntl, os, sys, time
path = sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
def pairs_per_second(count):
    started = time.perf_counter()
    for _ in range(count):
        fcntl.lockf(fd, fcntl.LOCK_EX)
        fcntl.lockf(fd, fcntl.LOCK_UN)
    return count / (time.perf_counter() - started)
pairs_per_second(200)
alone = pairs_per_second(2000)
holder = os.fork()
if holder == 0:
    other = os.open(path, os.O_RDWR)
    end = time.monotonic() + 3
    while time.monotonic() < end:
        fcntl.lockf(other, fcntl.LOCK_EX)
        time.sleep(0.0005)
        fcntl.lockf(other, fcntl.LOCK_UN)
        time.sleep(0.0005)
    os._exit(0)
shared = pairs_per_second(300)
os.waitpid(holder, 0)
print("%.0f %.0f" % (alone, shared))
PYTHON
)
        unmount
        echo "round $round $name: alone ${rates% *} pairs/s, beside a holder ${rates#* } pairs/s"
    done
done
